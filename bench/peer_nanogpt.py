"""The in-run peer: Karpathy's build-nanogpt `train_gpt2.py`, run as it is on random-token shards.

The throughput target is a ratio against the fastest plain-PyTorch GPT-2 trainer measured on the same
machine in the same session. This runs that trainer itself (its code is not part of this repository:
pass a checkout of github.com/karpathy/build-nanogpt with --source) with these textual edits, each
outside the training step:

  use_compile = False            -> True      (its own torch.compile switch; off only for its evals)
  max_steps = 19073              -> --steps   (also shortens its cosine schedule: lr only)
  val-loss block every 250 steps -> skipped   (evaluation, not training; with compile on, its HellaSwag
                                               and sampling blocks are already skipped by its own code)
  tiktoken / hellaswag imports   -> None      (used only by those evaluations; the GPU host is offline)

Its data loader reads `edu_fineweb10B/*.npy`; random uint16 tokens are written there. Its step is
d12, B=64, T=1024, 524,288 tokens (grad accumulation 8 on one GPU), bf16 autocast, TF32 'high',
fused AdamW, clip 1.0, default SDPA dispatch. With --nproc N it runs under torchrun, one process a GPU, as
its README says (DDP; the same 524,288 tokens a step, grad accumulation 8/N). Prints the median of its own
tok/sec (all GPUs together) over steps --skip.. and the peak GPU memory nvidia-smi saw on the GPUs it ran on
(the highest of them), and writes them to --out as JSON.

    python -m bench.peer_nanogpt --source ../.perf-peer --steps 30 --skip 10 [--nproc 4]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

EDITS = [  # (text in train_gpt2.py, replacement); each must occur exactly once
    ("from hellaswag import render_example, iterate_examples",
     "render_example = iterate_examples = None  # peer run: no HellaSwag"),
    ('enc = tiktoken.get_encoding("gpt2")', "enc = None  # peer run: no sampling"),
    ("use_compile = False", "use_compile = True"),
    ("max_steps = 19073", "max_steps = {steps}"),
    ("if step % 250 == 0 or last_step:", "if False:  # peer run: no val loss"),
]
STEP_LINE = re.compile(r"^step\s+(\d+) \| .* \| dt: ([\d.]+)ms \| tok/sec: ([\d.]+)")


def patched_script(source: str, steps: int) -> str:
    for old, new in EDITS:
        if source.count(old) != 1:
            raise ValueError(f"train_gpt2.py: expected exactly one {old!r}; is this build-nanogpt's script?")
        source = source.replace(old, new.format(steps=steps))
    return source


def write_shards(workdir: Path, steps: int) -> None:
    """Random tokens for `steps` steps of 524,288 tokens without wrapping, and a small val shard."""
    data = workdir / "edu_fineweb10B"
    data.mkdir()
    rng = np.random.default_rng(0)
    np.save(data / "edufineweb_val_000000.npy", rng.integers(0, 50257, 2**20 + 1, dtype=np.uint16))
    np.save(data / "edufineweb_train_000001.npy", rng.integers(0, 50257, (steps + 1) * 524288 + 1, dtype=np.uint16))


def visible_gpu_ids(n: int) -> list[str]:
    """nvidia-smi's ids of the first `n` GPUs CUDA shows this process: CUDA_VISIBLE_DEVICES' entries (indices or
    UUIDs, which nvidia-smi's -i takes too), or 0..n-1 when it is unset. On a host of one GPU model CUDA's
    numbering is nvidia-smi's (PCI bus order)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",")] if visible else [str(i) for i in range(n)]
    return ids[:n]


class GpuMemoryPeak:
    """Highest memory.used nvidia-smi reports (MiB) while the peer runs on its first `n` visible GPUs, over
    those GPUs, sampled every 200 ms."""

    def __init__(self, n: int = 1):
        self.peak_mib = 0
        self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                      "-lms", "200", "-i", ",".join(visible_gpu_ids(n))],
                                     stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.strip().isdigit():
                self.peak_mib = max(self.peak_mib, int(line))

    def stop(self) -> float:
        self.proc.terminate()
        self.proc.wait()
        return self.peak_mib * 2**20 / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", required=True, help="folder holding build-nanogpt's train_gpt2.py")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps to run (default 30)")
    parser.add_argument("--skip", type=int, default=10, help="first steps left out of the median (default 10)")
    parser.add_argument("--python", default=sys.executable, help="interpreter to run it with")
    parser.add_argument("--nproc", type=int, default=1,
                        help="GPUs: 1 runs the script itself, more run it under torchrun (default 1)")
    parser.add_argument("--out", help="write the result to this JSON file")
    args = parser.parse_args()
    script = patched_script((Path(args.source) / "train_gpt2.py").read_text(), args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "train_gpt2.py").write_text(script)
        write_shards(workdir, args.steps)
        memory = GpuMemoryPeak(args.nproc)
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}"]
        proc = subprocess.Popen([args.python, *(launcher if args.nproc > 1 else []), "train_gpt2.py"], cwd=workdir,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        steps = {}
        for line in proc.stdout:
            print(line, end="", flush=True)
            if m := STEP_LINE.match(line):
                steps[int(m[1])] = (float(m[2]), float(m[3]))
        code = proc.wait()
        peak_gb = memory.stop()
    timed = [steps[s] for s in sorted(steps) if s >= args.skip]
    if code != 0 or not timed:
        sys.exit(f"build-nanogpt's train_gpt2.py exited with {code} after {len(steps)} logged steps")
    result = {"peer": "build-nanogpt train_gpt2.py (torch.compile)", "gpus": args.nproc, "timed_steps": len(timed),
              "tokens_per_s": statistics.median(t for _, t in timed),
              "step_ms": statistics.median(ms for ms, _ in timed), "nvidia_smi_peak_gb": peak_gb}
    print(json.dumps(result), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
