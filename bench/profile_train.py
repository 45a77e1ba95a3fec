"""Where a training step's time goes, measured inside the real training program (gpt2.train).

Runs `gpt2.train` with the given flags and profiles steps on rank 0 (CPU and CUDA activity), the profiler
advancing with the metrics logger, once per step. Reports, over the profiled steps: the wall time per
step, the time the GPU was busy (the union of its kernels and copies), the time it sat idle, and the busy
time by part (the all-reduces, the optimizer step, the rest), and the kernels that took longest. The idle
time is what the host costs the step; the all-reduce and optimizer rows are what does not shrink with the
GPU count.

    python -m bench.profile_train --profile-steps 12 3 --out prof.json -- $(bench/run_train_gpu.sh --print-train-flags)
    torchrun --standalone --nproc_per_node=4 -m bench.profile_train --out prof4.json -- <the same flags>
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import shutil
import sys
import tempfile
import unittest.mock
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from common.files import write_json
from gpt2 import train as train_module
from gpt2.distributed import setup, teardown
from gpt2.metrics import MetricsLogger
from gpt2.train_config import load_config


def union_ms(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (microseconds in), in ms."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total / 1e3


def summarize(prof: profile, steps: int) -> dict:
    """Per-step wall, GPU-busy and idle time, and busy time by part, averaged over the profiled steps. The
    parts: the NCCL all-reduces; the optimizer step (kernels inside its GPU-side range, which
    torch.optim marks); everything else (the micro-steps, the clip)."""
    events = prof.events()
    steps_seen = [e for e in events if e.name.startswith("ProfilerStep")]
    gpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    annotations = [e for e in gpu if _is_annotation(e)]
    kernels = [e for e in gpu if not _is_annotation(e)]
    if not steps_seen or not kernels:
        raise RuntimeError(f"the profiler recorded {len(steps_seen)} steps and {len(kernels)} GPU kernels; "
                           "it needs both (a CUDA device)")
    optimizer = [(a.time_range.start, a.time_range.end) for a in annotations if a.name.startswith("Optimizer.step")]

    def part(e) -> str:
        if "nccl" in e.name.lower():
            return "all-reduce (NCCL)"
        if any(start <= e.time_range.start < end for start, end in optimizer):
            return "optimizer step"
        return "micro-steps, clip and the rest"

    # the window: the first to the last kernel of the profiled steps (the host runs ahead of the GPU)
    wall = (max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels)) / 1e3
    by_part: dict[str, list[tuple[float, float]]] = {}
    for e in kernels:
        by_part.setdefault(part(e), []).append((e.time_range.start, e.time_range.end))
    busy = union_ms([iv for ivs in by_part.values() for iv in ivs])
    return {
        "profiled_steps": steps,
        "wall_ms_per_step": wall / steps,
        "gpu_busy_ms_per_step": busy / steps,
        "gpu_idle_ms_per_step": (wall - busy) / steps,
        "busy_ms_per_step_by_part": {k: union_ms(v) / steps for k, v in sorted(by_part.items())},
        "top_kernels_ms_per_step": _top_kernels(kernels, steps),
    }


def _is_annotation(e) -> bool:
    """A range the host marked (a profiler step, an optimizer step), shown on the GPU's timeline too."""
    return getattr(e, "is_user_annotation", False) or e.name.startswith(("ProfilerStep", "Optimizer."))


def _top_kernels(gpu: list, steps: int, n: int = 25) -> list[tuple[str, float]]:
    totals: dict[str, float] = {}
    for e in gpu:
        totals[e.name[:90]] = totals.get(e.name[:90], 0.0) + (e.time_range.end - e.time_range.start) / 1e3
    return sorted(((k, v / steps) for k, v in totals.items()), key=lambda kv: -kv[1])[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile-steps", type=int, nargs=2, default=(12, 3), metavar=("FIRST", "COUNT"),
                        help="profile COUNT steps from step FIRST on (default: 12 3)")
    parser.add_argument("--out", type=Path, required=True, help="JSON summary (rank 0); a gzipped trace beside it")
    parser.add_argument("train_flags", nargs=argparse.REMAINDER, help="-- then gpt2.train's flags")
    args = parser.parse_args()
    flags = args.train_flags[1:] if args.train_flags[:1] == ["--"] else args.train_flags
    if not torch.cuda.is_available():
        sys.exit("error: bench.profile_train needs a CUDA GPU: it measures where the GPU's time goes")
    config = load_config(flags)
    first, count = args.profile_steps
    if config.max_steps < first + count:
        parser.error(f"--max-steps {config.max_steps} ends before the profiled steps {first}..{first + count - 1}")
    ctx = setup(config.device)
    rank0 = int(os.environ.get("RANK", "0")) == 0
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                   schedule=schedule(wait=first - 1, warmup=1, active=count, repeat=1))
    advance = MetricsLogger.advance

    def advance_and_profile(self: MetricsLogger) -> None:  # once per optimizer step, after its record
        advance(self)
        prof.step()

    profiling = contextlib.ExitStack()
    if rank0:
        profiling.enter_context(prof)
        profiling.enter_context(unittest.mock.patch.object(MetricsLogger, "advance", advance_and_profile))
    clean = False
    try:
        with profiling:
            train_module.train(config, ctx)
        clean = True
    finally:
        teardown(clean)
    if rank0:
        summary = {"world_size": int(os.environ.get("WORLD_SIZE", "1")), "gpu": torch.cuda.get_device_name(),
                   "torch": torch.__version__, "flags": flags, **summarize(prof, count)}
        write_json(args.out, summary)
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(trace))
            with trace.open("rb") as src, gzip.open(args.out.with_suffix(".trace.json.gz"), "wb") as dst:
                shutil.copyfileobj(src, dst)
        print(json.dumps({k: v for k, v in summary.items() if k != "top_kernels_ms_per_step"}, indent=1))


if __name__ == "__main__":
    main()
