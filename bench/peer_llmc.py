"""The C/CUDA peer: llm.c's `train_gpt2cu`, built from a checkout with its own Makefile and run at a model size,
micro-batch and steps of ours, on 1 or N GPUs.

Its code is not part of this repository: pass a checkout of github.com/karpathy/llm.c with --source. The build
copies it to --build (a checkout stays as it is) and runs `make train_gpt2cu PRECISION=BF16` with cuDNN
attention when cudnn-frontend's headers are found (--cudnn-frontend, else llm.c's own search: ./cudnn-frontend
and ~/cudnn-frontend), multi-GPU through NCCL without MPI. One source edit, needed on CUDA 13, where
`cudaMemAdvise` changed its signature: the out-of-memory fallback to managed memory in llmc/cuda_utils.cuh
(the only caller) becomes an error exit. With cuDNN the link also names `-lnvrtc -lcuda`, which cuDNN 9
calls into; and NCCL found as a library counts as installed (its Makefile asks `dpkg -l` only).

A run starts from random weights (`-e d12|d24|d48|...`), reads random-token shards (llm.c's shard format, which
ours reads too), and uses llm.c's flags for its 1.5B run: no recompute (`-r 0`), ZeRO-1 (`-z 1`), bf16, the
validation loss only at the first and last step (outside its timed section). Several GPUs: one process a GPU,
NCCL set up through a shared folder (`-pi fs`). Prints the median of its step times (ms, llm.c's own CUDA-event
timing of forward, backward and update) over steps --skip.., its tokens/s, and the peak memory nvidia-smi saw on
the GPUs it ran on (the highest of them), and writes them to --out as JSON.

    python -m bench.peer_llmc --source path/to/llm.c --model d48 --batch-size 16 --total-batch-size 131072 \
        --train-data 'shards/*_train_*.bin' --val-data 'shards/*_val_*.bin' --steps 20 --skip 5 [--nproc 4]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.peer_nanogpt import GpuMemoryPeak

STEP_LINE = re.compile(r"^step\s+(\d+)/\d+ \|.*\| ([\d.]+) ms \|")
MANAGED_FALLBACK = re.compile(r"cudaCheck_\(cudaMallocManaged\(.*?return 1;", re.S)


def patch_managed_fallback(tree: Path) -> None:
    """llmc/cuda_utils.cuh's fallback to managed memory on an out-of-memory error -> an error exit."""
    path = tree / "llmc" / "cuda_utils.cuh"
    text = path.read_text()
    if "cudaMallocManaged" not in text:
        return
    if not MANAGED_FALLBACK.search(text):
        raise ValueError(f"{path}: calls cudaMallocManaged, but not in the fallback this edit expects; "
                         "is this llm.c's source?")
    path.write_text(MANAGED_FALLBACK.sub('fprintf(stderr, "out of GPU memory\\\\n"); exit(EXIT_FAILURE);', text))


def make_flags(cudnn_frontend: Path | None) -> list[str]:
    """make's variables: bf16, cuDNN when its frontend headers are given, NCCL without MPI."""
    flags = ["PRECISION=BF16", "NO_USE_MPI=1"]
    if cudnn_frontend is not None:
        # cuDNN 9's library calls into NVRTC and the driver API, which the Makefile does not link
        flags += ["USE_CUDNN=1", f"CUDNN_FRONTEND_PATH={cudnn_frontend}",
                  "NVCC_LDFLAGS=-lcublas -lcublasLt -lnvidia-ml -lcudnn -lnvrtc -lcuda"]
    return flags


def build(source: Path, build_dir: Path, cudnn_frontend: Path | None, log: Path) -> Path:
    """train_gpt2cu built in build_dir (reused when already there); returns its path."""
    binary = build_dir / "train_gpt2cu"
    if binary.exists():
        return binary
    if not (source / "train_gpt2.cu").exists() or not (source / "Makefile").exists():
        sys.exit(f"{source}: no train_gpt2.cu and Makefile; pass a checkout of llm.c with --source")
    shutil.rmtree(build_dir, ignore_errors=True)
    shutil.copytree(source, build_dir, ignore=shutil.ignore_patterns(".git"))
    patch_managed_fallback(build_dir)
    if _has_nccl():  # its Makefile looks for NCCL with `dpkg -l` only; a library NCCL not installed by dpkg counts too
        makefile = build_dir / "Makefile"
        makefile.write_text(makefile.read_text().replace("dpkg -l | grep -q nccl", "true"))
    cmd = ["make", "-C", str(build_dir), "train_gpt2cu", *make_flags(cudnn_frontend)]
    with log.open("w") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        code = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT)
    if code == 0 and binary.exists():
        return binary
    sys.exit(f"building llm.c's train_gpt2cu failed; its log: {log}")


def _has_nccl() -> bool:
    for directory in ("/usr/lib/x86_64-linux-gnu", "/usr/lib", "/usr/local/lib", "/usr/lib64"):
        if any(Path(directory).glob("libnccl.so*")):
            return True
    return False


def llmc_flags(args: argparse.Namespace, rank: int, nccl_dir: str) -> list[str]:
    return ["-i", args.train_data, "-j", args.val_data, "-e", args.model, "-b", str(args.batch_size),
            "-t", str(args.seq_len), "-d", str(args.total_batch_size), "-x", str(args.steps), "-r", "0", "-z", "1",
            "-v", str(10**9), "-m", "1", "-s", "0", "-h", "0", "-n", "0", "-y", "0",
            "-pi", "fs", "-pf", nccl_dir, "-pn", str(args.nproc), "-pr", str(rank), "-pg", str(args.nproc)]


def run(binary: Path, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as nccl_dir:
        memory = GpuMemoryPeak(args.nproc)
        procs = [subprocess.Popen([str(binary), *llmc_flags(args, rank, nccl_dir)],
                                  env={**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get(
                                      "CUDA_VISIBLE_DEVICES", ",".join(map(str, range(args.nproc))))},
                                  stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                                  stderr=subprocess.STDOUT, text=True) for rank in range(args.nproc)]
        steps = {}
        for line in procs[0].stdout:
            print(line, end="", flush=True)
            if m := STEP_LINE.match(line):
                steps[int(m[1])] = float(m[2])
        codes = [p.wait() for p in procs]
        peak_gb = memory.stop()
    timed = [steps[s] for s in sorted(steps) if s > args.skip]
    if any(codes) or not timed:
        sys.exit(f"llm.c's train_gpt2cu exited with {codes} after {len(steps)} logged steps")
    step_ms = statistics.median(timed)
    return {"peer": "llm.c train_gpt2cu (bf16, -r 0 -z 1)", "model": args.model, "batch_size": args.batch_size,
            "total_batch_size": args.total_batch_size, "gpus": args.nproc, "timed_steps": len(timed),
            "step_ms": step_ms, "tokens_per_s": args.total_batch_size / step_ms * 1e3, "nvidia_smi_peak_gb": peak_gb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", required=True, type=Path, help="a checkout of llm.c")
    parser.add_argument("--build", type=Path, default=Path(tempfile.gettempdir()) / "llmc-build",
                        help="where train_gpt2cu is built, and reused from (default: TMPDIR/llmc-build)")
    parser.add_argument("--cudnn-frontend", type=Path,
                        help="cudnn-frontend's include/ folder (default: llm.c's own search; none: no cuDNN)")
    parser.add_argument("--model", default="d12", help="llm.c's -e: d12, d24, d36, d48 (random weights)")
    parser.add_argument("--batch-size", type=int, default=64, help="micro-batch per GPU (llm.c's -b)")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--total-batch-size", type=int, default=524288, help="tokens a step, all GPUs (-d)")
    parser.add_argument("--train-data", help="glob of llm.c-format train shards (needed unless --build-only)")
    parser.add_argument("--val-data", help="glob of llm.c-format val shards (needed unless --build-only)")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps to run (default 20)")
    parser.add_argument("--skip", type=int, default=5, help="first steps left out of the median (default 5)")
    parser.add_argument("--nproc", type=int, default=1, help="GPUs, one process each (default 1)")
    parser.add_argument("--build-only", action="store_true", help="build train_gpt2cu and stop")
    parser.add_argument("--out", type=Path, help="write the result to this JSON file")
    args = parser.parse_args()
    if not args.build_only and not (args.train_data and args.val_data):
        parser.error("--train-data and --val-data are needed to run it (only --build-only goes without)")
    frontend = args.cudnn_frontend
    if frontend is None:
        found = [p for p in (args.source / "cudnn-frontend" / "include", Path.home() / "cudnn-frontend" / "include")
                 if p.is_dir()]
        frontend = found[0].resolve() if found else None
    log = (args.out.parent if args.out else Path(".")) / "llmc_build.log"
    binary = build(args.source.resolve(), args.build.resolve(), frontend, log.resolve())
    print(f"llm.c: {binary} ({'cuDNN attention' if frontend else 'no cuDNN'})", flush=True)
    if args.build_only:
        return
    result = run(binary, args)
    print(json.dumps(result), flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
