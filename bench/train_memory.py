"""Where a training run's GPU memory goes: `python -m gpt2.train` as typed, with a report of the device's
used memory against PyTorch's caching allocator, pool by pool (the CUDA graph's private pool apart from the
rest), at the points where the peak forms: before the first micro-step, before and after the micro-step's
CUDA graph is captured, and after optimizer steps 1, 2 and 5.

    python -m bench.train_memory [gpt2.train flags]
    python -m bench.train_memory $(bench/run_train_gpu.sh --print-train-flags)   # after one run made its shards

A report line reads: `used`, the device's memory in use (what nvidia-smi shows: run nothing else on the GPU);
`non-torch`, used less the allocator's reserve (CUDA context, loaded kernels, library handles); `reserved`
and `alloc`, the allocator's figures now (and at their peak); `inactive split`, free blocks inside segments that
also hold allocations (fragmentation); then per pool what it reserves, what is allocated in it, its segments,
and the free bytes of its segments that also hold allocations. Pool (0, 0) is the default one (parameters, gradients, optimizer state, the eager
micro-steps); the CUDA graph's pool holds the captured micro-step's activations for good.
"""

from __future__ import annotations

import collections
import runpy
import sys

import torch

from gpt2 import step as step_fns
from gpt2.distributed import configure_cuda_allocator

MiB = 2**20


def report(where: str) -> None:
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    # pool -> [reserved, allocated, segments, free bytes in segments that also hold allocations (split)]
    pools: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0])
    for segment in torch.cuda.memory_snapshot():
        pool = pools[str(segment.get("segment_pool_id"))]
        pool[0] += segment["total_size"]
        pool[1] += segment["allocated_size"]
        pool[2] += 1
        if segment["allocated_size"]:
            pool[3] += segment["total_size"] - segment["allocated_size"]
    used, reserved = (total - free) / MiB, stats.get("reserved_bytes.all.current", 0) / MiB
    print(f"[memory {where}] used {used:.0f} MiB | non-torch {used - reserved:.0f} | reserved {reserved:.0f} "
          f"(peak {stats.get('reserved_bytes.all.peak', 0) / MiB:.0f}) | alloc "
          f"{stats.get('allocated_bytes.all.current', 0) / MiB:.0f} (peak {stats.get('allocated_bytes.all.peak', 0) / MiB:.0f}) | "
          f"inactive split {stats.get('inactive_split_bytes.all.current', 0) / MiB:.0f} | "
          + "; ".join(f"pool {name}: {r / MiB:.0f} reserved, {a / MiB:.0f} allocated, {n} segments, "
                      f"{split / MiB:.0f} free in split segments" for name, (r, a, n, split) in pools.items()),
          flush=True)


def report_around(owner: object, name: str, calls: tuple[int, ...]) -> None:
    """Reports before and after the given calls (1-based) of owner.name."""
    original, count = getattr(owner, name), [0]

    def wrapped(*args, **kwargs):
        count[0] += 1
        if count[0] in calls:
            report(f"before {name} {count[0]}")
        result = original(*args, **kwargs)
        if count[0] in calls:
            report(f"after {name} {count[0]}")
        return result

    setattr(owner, name, wrapped)


def main() -> None:
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        print(__doc__)
        print("gpt2.train's flags: python -m gpt2.train --help")
        return
    configure_cuda_allocator()  # before CUDA starts, as gpt2.train's set-up does
    if not torch.cuda.is_available():
        sys.exit("error: bench.train_memory reports GPU memory and needs a CUDA GPU")
    # gpt2.train calls these through their module, so the wrappers are what it runs
    report_around(step_fns, "forward_backward", (1,))
    report_around(step_fns.MicroStepGraph, "_capture", (1,))
    report_around(step_fns, "optimizer_step", (1, 2, 5))
    sys.argv = ["gpt2.train", *sys.argv[1:]]
    runpy.run_module("gpt2.train", run_name="__main__")


if __name__ == "__main__":
    main()
