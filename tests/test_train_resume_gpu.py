"""Bit-exact resume on the GPU, at the kernels defaults: `python -m gpt2.train` (fused kernels, torch.compile,
bf16, fp32 master weights, CUDA graphs) is SIGKILLed between two checkpoints, restarted in the same run
directory, and must end exactly like an uninterrupted run: every logged loss and gradient norm, and the
final model.bin byte for byte. On one GPU, and on two under torchrun (the whole process group killed, as
when a node fails)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpt2.checkpoint import MODEL_FILE, list_checkpoints
from tests.fixtures.processes import wait_for
from tests.fixtures.train.tiny import final_params, make_shards, read_metrics

# d12's layer shapes (768 channels, 12 heads of 64, GPT-2's vocabulary), so every fused kernel and every
# startup check of the `gpu` extra runs as at d12, in two layers that compile in seconds
MODEL = "n_layer=2,n_head=12,n_embd=768,block_size=1024,vocab_size=50257"
MAX_STEPS, CHECKPOINT_EVERY, KILL_AFTER = 16, 4, 6  # killed in step 6 or 7: after checkpoint 4, before 8
TIMEOUT_S = 600  # compiling, the kernels' startup checks, 16 steps


def _gpus_for(world: int) -> None:
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA GPUs, {torch.cuda.device_count()} visible")
    from gpt2_kernels.attention import _load_fa4_backward

    if _load_fa4_backward() is None:
        # measured (H200, 2026-11-26): without FA4's deterministic backward, two uninterrupted runs of this
        # test's command already differ from step 1 or 2 in the sixth significant digit of the loss
        pytest.skip("the bit-exact promise is made for FA4's deterministic attention backward (the `gpu` extra "
                    "on Hopper); SDPA's fallback backward is not run-to-run deterministic")


def _command(tmp_path: Path, name: str, world: int, zero1: bool = False) -> list[str]:
    train_glob, _ = make_shards(tmp_path / "shards", train_tokens=2_000_000, vocab=50257)
    flags = ["--model", MODEL, "--train-data", train_glob, "--out-dir", str(tmp_path / name),
             "--batch-size", "8", "--seq-len", "1024", "--total-batch-size", "32768",  # 4 micro-steps on 1 GPU, 2 on 2
             "--max-steps", str(MAX_STEPS), "--warmup-steps", "4", "--checkpoint-every", str(CHECKPOINT_EVERY),
             "--val-every", "0", "--hellaswag-every", "0", "--sample-every", "0", "--log-every", "1"]
    flags += ["--zero1"] if zero1 else []
    if world == 1:
        return [sys.executable, "-m", "gpt2.train", *flags]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
            "-m", "gpt2.train", *flags]


def _env(tmp_path: Path) -> dict[str, str]:
    # one Inductor cache for the test's runs, as for a run resumed on the host it started on
    return {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "PYTHONUNBUFFERED": "1"}


def _train_records(out_dir: Path) -> int:
    path = out_dir / "metrics.jsonl"
    return path.read_text().count('"kind": "train"') if path.exists() else 0


def _run(cmd: list[str], tmp_path: Path, log: Path) -> str:
    with log.open("w") as out:
        done = subprocess.run(cmd, env=_env(tmp_path), stdout=out, stderr=subprocess.STDOUT, timeout=TIMEOUT_S)
    text = log.read_text()
    assert done.returncode == 0, text[-4000:]
    return text


def _stop_tree(pid: int) -> list[int]:
    """SIGSTOPs `pid`, then its children, and so on down (a stopped process starts no more); returns them all.
    torchrun starts its ranks in sessions of their own, so killing its process group would leave them running."""
    try:
        os.kill(pid, signal.SIGSTOP)
        children = [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                    for c in (task / "children").read_text().split()]
    except (ProcessLookupError, FileNotFoundError):
        return []
    return [pid] + [p for child in children for p in _stop_tree(child)]


def _kill_between_checkpoints(cmd: list[str], tmp_path: Path, out_dir: Path) -> None:
    """Starts the run and SIGKILLs it with every process it started (torchrun, its ranks, their compile
    workers), as when the machine fails, once KILL_AFTER steps are logged."""
    with (tmp_path / "interrupted.log").open("w") as log:
        proc = subprocess.Popen(cmd, env=_env(tmp_path), stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: proc.poll() is not None or _train_records(out_dir) >= KILL_AFTER, TIMEOUT_S, 0.005)
            for pid in _stop_tree(proc.pid):
                os.kill(pid, signal.SIGKILL)
        finally:
            proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run ended before it was killed"


def _assert_same_run(ref_dir: Path, got_dir: Path) -> None:
    ref, got = read_metrics(ref_dir), read_metrics(got_dir)
    assert [r["step"] for r in got] == list(range(MAX_STEPS))
    for key in ("loss", "norm", "lr", "skipped"):
        diffs = [(r["step"], r[key], g[key]) for r, g in zip(ref, got) if r[key] != g[key]]
        assert not diffs, f"{key} differs at (step, uninterrupted, resumed): {diffs}"
    ref_params, got_params = final_params(ref_dir), final_params(got_dir)
    differ = [name for name, value in ref_params.items() if not torch.equal(got_params[name], value)]
    assert not differ, f"final weights differ: {differ}"
    ref_bin, got_bin = (d / "checkpoints" / f"step_{MAX_STEPS:08d}" / MODEL_FILE for d in (ref_dir, got_dir))
    assert ref_bin.read_bytes() == got_bin.read_bytes(), f"{got_bin} differs from {ref_bin}"


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("world, zero1", [(1, False), (2, False), (2, True)], ids=["1gpu", "2gpus", "2gpus-zero1"])
def test_sigkill_between_checkpoints_then_resume_is_bit_exact_on_the_gpu(tmp_path, world, zero1):
    """Under ZeRO-1 too: each rank's parameters live in the optimizer's bucket, its shard of AdamW's state is
    consolidated into the checkpoint, and a resume hands each rank its shard back."""
    _gpus_for(world)
    reference = _run(_command(tmp_path, "reference", world, zero1), tmp_path, tmp_path / "reference.log")
    written = json.loads((tmp_path / "reference" / "config.json").read_text())
    config = written["resolved"]
    assert written["zero1"] is zero1
    # the defaults under test: fused kernels, compiled, bf16 with fp32 masters, CUDA graphs
    assert (config["kernels"], config["compile"], config["master_weights"], config["cuda_graphs"]) == \
        (True, True, True, True), reference[-2000:]

    out_dir = tmp_path / "interrupted"
    cmd = _command(tmp_path, "interrupted", world, zero1)
    _kill_between_checkpoints(cmd, tmp_path, out_dir)
    resume_from = list_checkpoints(out_dir)[-1][0]
    assert 0 < resume_from < MAX_STEPS
    resumed = _run(cmd, tmp_path, tmp_path / "resumed.log")
    assert f"start step {resume_from}/{MAX_STEPS}" in resumed
    _assert_same_run(tmp_path / "reference", out_dir)
