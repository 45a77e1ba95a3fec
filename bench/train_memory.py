"""Where a training run's GPU memory goes: `python -m gpt2.train` as typed, with a report of the device's
used memory against PyTorch's caching allocator, pool by pool (the CUDA graph's private pool apart from the
rest), at the points where the peak forms: before the first micro-step, before and after the micro-step's
CUDA graph is captured, after optimizer steps 1, 2 and 5, and at the end of the run.

    python -m bench.train_memory [gpt2.train flags]
    python -m bench.train_memory $(bench/run_train_gpu.sh --print-train-flags)   # after one run made its shards
    MEMORY_JSON=acct.json python -m bench.train_memory [gpt2.train flags]         # the accounting as JSON too
    python -m bench.train_memory --context-probe [--json probe.json]              # CUDA's own share, no training

A report line reads: `used`, the device's memory in use (total less free, as CUDA reports it: run nothing
else on the GPU); `non-torch`, used less the allocator's reserve (CUDA context, loaded kernels, library
handles); `reserved` and `alloc`, the allocator's figures now (and at their peak); `inactive split`, free
blocks inside segments that also hold allocations (fragmentation); then per pool what it reserves, what is
allocated in it, its segments, and the free bytes of its segments that also hold allocations. Pool (0, 0) is
the default one (parameters, gradients, optimizer state, the eager micro-steps); the CUDA graph's pool holds
the captured micro-step's activations for good.

At the end of the run (`[memory end]`) it also frees PyTorch's cuBLAS workspaces and reports how many bytes
that gave back: the workspaces' share of the allocated figures. With MEMORY_JSON set, every report, the
allocator's counters (peaks, cudaMalloc retries, segments) and, where NVML can be read (nvidia-ml-py), the
device's and this process's used memory sampled every 50 ms with their peaks go to that file.

`--context-probe` starts CUDA in a process of its own and reads the device's memory (NVML, the figure
nvidia-smi shows, when nvidia-ml-py is there; CUDA's total less free always) after each stage: CUDA started,
a bf16 matmul (cuBLAS: its handle and workspace), a linear layer with bias (cuBLASLt), attention (cuDNN or
flash), a Triton kernel; each stage's growth outside PyTorch's allocator and inside it.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import runpy
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from gpt2 import step as step_fns
from gpt2.distributed import configure_cuda_allocator

MiB = 2**20
REPORTS: list[dict[str, Any]] = []


class Nvml:
    """The device's used memory and this process's, as nvidia-smi reads them (NVML), sampled in a thread: NVML
    does not go through CUDA, so the samples are safe while a CUDA graph is being captured. None when
    nvidia-ml-py is missing or NVML does not answer."""

    def __init__(self, device: int | None = None):
        import pynvml  # nvidia-ml-py

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByUUID(nvml_uuid(device).encode())
        self.peak_device = self.peak_process = 0
        self.peak_where = ""
        self.where = "start"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def open(cls, device: int | None = None) -> Nvml | None:
        try:
            return cls(device)
        except Exception as e:  # noqa: BLE001 - the report goes on without NVML's figures
            print(f"[memory] NVML not read ({type(e).__name__}: {e}); nvidia-smi's figures come from outside",
                  flush=True)
            return None

    def device_used(self) -> int:
        """memory.used as nvidia-smi shows it: NVML's version-2 figure, which leaves out what the driver reserves
        (version 1's `used` counts that too)."""
        version = getattr(self.nvml, "nvmlMemory_v2", None)
        if version is not None:
            try:
                return self.nvml.nvmlDeviceGetMemoryInfo(self.handle, version=version).used
            except (TypeError, self.nvml.NVMLError):
                pass
        return self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used

    def process_used(self) -> int:
        pid = os.getpid()
        for proc in self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle):
            if proc.pid == pid and proc.usedGpuMemory is not None:
                return proc.usedGpuMemory
        return 0

    def sample(self) -> None:
        device = self.device_used()
        if device > self.peak_device:
            self.peak_device, self.peak_where = device, self.where
        self.peak_process = max(self.peak_process, self.process_used())

    def start(self, every_s: float = 0.05) -> None:
        def loop() -> None:
            while not self._stop.wait(every_s):
                try:
                    self.sample()
                except Exception:  # noqa: BLE001 - a failed sample is skipped
                    pass

        self._thread = threading.Thread(target=loop, daemon=True, name="nvml-sampler")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1)


def nvml_uuid(device: int | None) -> str:
    """NVML's name (GPU-...) of CUDA's device `device` (the current one when None)."""
    uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device() if device is None else device).uuid)
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


NVML: Nvml | None = None
NVML_TRIED = False


def snapshot(where: str) -> dict[str, Any]:
    """The device's and the allocator's memory now, pool by pool (bytes)."""
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
    record = {"where": where, "time": time.time(), "used": total - free, "total": total,
              "reserved": stats.get("reserved_bytes.all.current", 0),
              "reserved_peak": stats.get("reserved_bytes.all.peak", 0),
              "allocated": stats.get("allocated_bytes.all.current", 0),
              "allocated_peak": stats.get("allocated_bytes.all.peak", 0),
              "active_peak": stats.get("active_bytes.all.peak", 0),
              "inactive_split": stats.get("inactive_split_bytes.all.current", 0),
              "inactive_split_peak": stats.get("inactive_split_bytes.all.peak", 0),
              # the allocator's segment counters stay 0 with expandable segments: the snapshot's count is "segments"
              "segments": sum(n for _, _, n, _ in pools.values()), "segment_stat": stats.get("segment.all.current", 0),
              "num_alloc_retries": stats.get("num_alloc_retries", 0), "num_ooms": stats.get("num_ooms", 0),
              "num_device_alloc": stats.get("num_device_alloc", 0), "num_device_free": stats.get("num_device_free", 0),
              "pools": {name: {"reserved": r, "allocated": a, "segments": n, "free_in_split_segments": split}
                        for name, (r, a, n, split) in pools.items()}}
    if NVML is not None:
        NVML.where = where
        try:
            record["nvml_device_used"] = NVML.device_used()
            record["nvml_process_used"] = NVML.process_used()
        except Exception:  # noqa: BLE001 - a figure NVML does not give is left out
            pass
    return record


def report(where: str) -> dict[str, Any]:
    global NVML, NVML_TRIED
    if not NVML_TRIED:  # at the first report (CUDA started, this rank's device current): NVML samples from now on
        NVML_TRIED = True
        NVML = Nvml.open()
        if NVML is not None:
            NVML.start()
    r = snapshot(where)
    REPORTS.append(r)
    used, reserved = r["used"] / MiB, r["reserved"] / MiB
    smi = "".join(f" | NVML {name} {r[key] / MiB:.0f}" for name, key in (("device", "nvml_device_used"),
                                                                        ("process", "nvml_process_used")) if key in r)
    print(f"[memory {where}] used {used:.0f} MiB | non-torch {used - reserved:.0f} | reserved {reserved:.0f} "
          f"(peak {r['reserved_peak'] / MiB:.0f}) | alloc {r['allocated'] / MiB:.0f} "
          f"(peak {r['allocated_peak'] / MiB:.0f}) | "
          f"inactive split {r['inactive_split'] / MiB:.0f} (peak {r['inactive_split_peak'] / MiB:.0f}) | "
          f"segments {r['segments']} | cudaMalloc retries {r['num_alloc_retries']}{smi} | "
          + "; ".join(f"pool {name}: {p['reserved'] / MiB:.0f} reserved, {p['allocated'] / MiB:.0f} allocated, "
                      f"{p['segments']} segments, {p['free_in_split_segments'] / MiB:.0f} free in split segments"
                      for name, p in r["pools"].items()),
          flush=True)
    return r


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


def cublas_workspaces() -> int:
    """Frees PyTorch's cuBLAS (and cuBLASLt) workspaces, one per handle and stream, and returns the allocated
    bytes that gave back (0 where this PyTorch has no such call). The next matmul makes them again."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is None:
        return 0
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    clear()
    torch.cuda.synchronize()
    return before - torch.cuda.memory_allocated()


def at_end(path: str | None) -> None:
    """The last report, the workspaces' share, NVML's peaks; the whole accounting to `path` when given."""
    if not torch.cuda.is_initialized():
        return
    end = report("end")
    workspaces = cublas_workspaces()
    print(f"[memory end] cuBLAS workspaces held: {workspaces / MiB:.0f} MiB (freed now)", flush=True)
    result: dict[str, Any] = {"reports": REPORTS, "cublas_workspaces": workspaces,
                              "allocated_peak": end["allocated_peak"], "reserved_peak": end["reserved_peak"],
                              "alloc_conf": {k: os.environ.get(k)
                                             for k in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")},
                              "argv": sys.argv[1:], "torch": torch.__version__,
                              "gpu": torch.cuda.get_device_name()}
    if NVML is not None:
        NVML.stop()
        result.update(nvml_device_peak=NVML.peak_device, nvml_device_peak_where=NVML.peak_where,
                      nvml_process_peak=NVML.peak_process)
        print(f"[memory end] NVML peaks: device {NVML.peak_device / MiB:.0f} MiB (last report before it: "
              f"{NVML.peak_where}), this process {NVML.peak_process / MiB:.0f} MiB", flush=True)
    if path:
        Path(path).write_text(json.dumps(result, indent=1))


def context_probe() -> dict[str, Any]:
    """The device memory CUDA and its libraries take outside PyTorch's allocator, stage by stage, in a process
    that does nothing else (see the module's docstring)."""
    import torch.nn.functional as F

    torch.cuda.init()
    nvml = Nvml.open(0)
    stages: list[dict[str, Any]] = []

    def stage(name: str) -> None:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        row = {"stage": name, "cuda_used": total - free, "reserved": torch.cuda.memory_reserved(),
               "allocated": torch.cuda.memory_allocated()}
        if nvml is not None:
            row["nvml_device_used"] = nvml.device_used()
            try:
                row["nvml_process_used"] = nvml.process_used()
            except Exception:  # noqa: BLE001
                row["nvml_process_used"] = 0
        stages.append(row)

    x = torch.empty(1, device="cuda")
    stage("CUDA started (one tensor)")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    stage("inputs made")
    out = a @ a
    del out
    stage("bf16 matmul (cuBLAS)")
    w, b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16), torch.randn(4096, device="cuda",
                                                                                    dtype=torch.bfloat16)
    out = F.linear(a, w, b)
    del out
    stage("linear with bias (cuBLASLt)")
    q = torch.randn(8, 16, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    del q
    stage("causal attention, forward and backward")
    from gpt2_kernels.stochastic_round import stochastic_round

    stochastic_round(torch.randn(1 << 20, device="cuda"), 1, 0)
    stage("a Triton kernel")
    workspaces = cublas_workspaces()
    stage("cuBLAS workspaces freed")
    del x, a, w, b
    base = stages[0]
    print(f"{'stage':<42} {'CUDA used':>10} {'non-torch':>10} {'allocated':>10} {'NVML device':>12} "
          f"{'NVML process':>13}")
    for row in stages:
        nvml_cols = (f"{row['nvml_device_used'] / MiB:>12.0f} {row['nvml_process_used'] / MiB:>13.0f}"
                     if "nvml_device_used" in row else "")
        print(f"{row['stage']:<42} {row['cuda_used'] / MiB:>10.0f} {(row['cuda_used'] - row['reserved']) / MiB:>10.0f} "
              f"{row['allocated'] / MiB:>10.0f} {nvml_cols}")
    print(f"cuBLAS workspaces: {workspaces / MiB:.1f} MiB; CUDA started: "
          f"{(base['cuda_used'] - base['reserved']) / MiB:.0f} "
          f"MiB outside PyTorch's allocator (CUDA's figure)", flush=True)
    return {"stages": stages, "cublas_workspaces": workspaces, "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(), "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
            "module_loading": os.environ.get("CUDA_MODULE_LOADING")}


def main() -> None:
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        print(__doc__)
        print("gpt2.train's flags: python -m gpt2.train --help")
        return
    configure_cuda_allocator()  # before CUDA starts, as gpt2.train's set-up does
    if not torch.cuda.is_available():
        sys.exit("error: bench.train_memory reports GPU memory and needs a CUDA GPU")
    if sys.argv[1:2] == ["--context-probe"]:
        result = context_probe()
        if "--json" in sys.argv:
            Path(sys.argv[sys.argv.index("--json") + 1]).write_text(json.dumps(result, indent=1))
        return
    # gpt2.train calls these through their module, so the wrappers are what it runs
    report_around(step_fns, "forward_backward", (1,))
    report_around(step_fns.MicroStepGraph, "_capture", (1,))
    report_around(step_fns, "optimizer_step", (1, 2, 5))
    path = os.environ.get("MEMORY_JSON")
    if path and int(os.environ.get("WORLD_SIZE", "1")) > 1:  # one file a rank
        path = str(Path(path).with_suffix(f".rank{os.environ.get('RANK', '0')}{Path(path).suffix}"))
    atexit.register(at_end, path)
    sys.argv = ["gpt2.train", *sys.argv[1:]]
    runpy.run_module("gpt2.train", run_name="__main__")


if __name__ == "__main__":
    main()
