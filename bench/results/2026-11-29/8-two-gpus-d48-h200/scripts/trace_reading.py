"""Reads the profiler traces of calls 8d (d48, 2 GPUs) and 8e (1 GPU), rank 0, 3 profiled steps each: the NCCL
kernels (count, ms a step), the GPU's gaps (all, and those over 1 ms with the kernels on either side), and the host
time of each optimizer step (its `Optimizer.step#...` range). The traces (1.6 and 1.1 MB gzipped) are not kept here.

    python trace_reading.py prof_d48_1gpu.trace.json.gz prof_d48_2gpu.trace.json.gz
"""
import gzip
import json
import sys

for path in sys.argv[1:]:
    events = [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("ph") == "X"]
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    t0, steps = gpu[0]["ts"], 3
    print(f"== {path}: {len(gpu)} GPU events, window {(gpu[-1]['ts'] + gpu[-1]['dur'] - t0) / 1e3:.1f} ms")
    for kind in ("AllReduce", "Broadcast"):
        ks = [e for e in gpu if "nccl" in e["name"].lower() and kind in e["name"]]
        if ks:
            print(f"NCCL {kind}: {len(ks) / steps:.0f} kernels a step, {sum(e['dur'] for e in ks) / 1e3 / steps:.1f} ms "
                  f"a step; each: {sorted(round(e['dur'] / 1e3, 2) for e in ks)[-3:]} (largest three)")
    end, prev, gaps = gpu[0]["ts"] + gpu[0]["dur"], gpu[0], []
    for e in gpu[1:]:
        if e["ts"] > end:
            gaps.append(((e["ts"] - end) / 1e3, (e["ts"] - t0) / 1e3, prev["name"][:60], e["name"][:60]))
        if e["ts"] + e["dur"] > end:
            end, prev = e["ts"] + e["dur"], e
    print(f"gaps: {sum(g[0] for g in gaps) / steps:.1f} ms a step in all, "
          f"{sum(g[0] for g in gaps if g[0] > 1) / steps:.1f} in gaps over 1 ms:")
    for g in (g for g in gaps if g[0] > 1):
        print(f"  {g[0]:5.1f} ms at {g[1]:8.1f}: after {g[2]} -> {g[3]}")
    opt = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("Optimizer.step")]
    print("optimizer steps on the host (ms):", [(e["name"][:45], round(e["dur"] / 1e3, 1)) for e in opt])
