"""The timing loop mb1.py and mb2.py share: median of 30 CUDA-event timings after 3 warm-up calls."""
import statistics

import torch


def timed(fn, reps=30):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def row(name, fn, width=70):
    try:
        print(f"{name:{width}s} {timed(fn):8.4f} ms", flush=True)
    except Exception as e:  # noqa: BLE001 - a config that does not fit prints its error; the sweep goes on
        print(f"{name:{width}s} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
