"""Bit-exact resume: a run SIGKILLed at a random step and restarted ends exactly like an uninterrupted one."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gpt2.checkpoint import latest_checkpoint, list_checkpoints
from tests.fixtures.train.tiny import final_params, read_metrics, tiny_config

MAX_STEPS = 24
# a step of tens of ms, so the kill can land anywhere: in a step, in a checkpoint write, between them
MODEL = "n_layer=2,n_head=2,n_embd=64,block_size=64,vocab_size=256"


def _command(tmp_path: Path, name: str) -> list[str]:
    config = tiny_config(tmp_path / name, model=MODEL, batch_size=8, seq_len=64, total_batch_size=1024,
                         max_steps=MAX_STEPS, warmup_steps=3, checkpoint_every=1, keep_last=2, val_every=5,
                         val_steps=1, guard_window=4, skip_loss_z=50.0)
    config_file = tmp_path / f"{name}.json"
    config_file.write_text(json.dumps(config.to_dict()))
    return [sys.executable, "-m", "gpt2.train", "--config", str(config_file)]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}  # same threads in every run: same float reductions


def _train_records_written(out_dir: Path) -> int:
    path = out_dir / "metrics.jsonl"
    return path.read_text().count('"kind": "train"') if path.exists() else 0


@pytest.mark.slow
def test_sigkill_at_a_random_step_then_resume_is_bit_exact(tmp_path):
    seed = random.randrange(2**31)
    kill_after = random.Random(seed).randint(2, MAX_STEPS - 12)  # margin: the run must not finish first
    context = f"(random seed {seed}: killed after {kill_after} logged steps)"

    reference = _command(tmp_path, "reference")
    subprocess.run(reference, env=_env(), check=True, capture_output=True, timeout=300)

    interrupted = _command(tmp_path, "interrupted")
    out_dir = tmp_path / "interrupted" / "run"
    proc = subprocess.Popen(interrupted, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while proc.poll() is None and _train_records_written(out_dir) < kill_after:
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"the run finished before it was killed {context}"
    assert latest_checkpoint(out_dir) is not None, context
    resume_from = list_checkpoints(out_dir)[-1][0]
    assert resume_from < MAX_STEPS, context

    resumed = subprocess.run(interrupted, env=_env(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"start step {resume_from}/{MAX_STEPS}" in resumed.stdout, context

    ref_dir = tmp_path / "reference" / "run"
    for kind in ("train", "val"):
        ref_records, got_records = read_metrics(ref_dir, kind), read_metrics(out_dir, kind)
        assert [r["step"] for r in got_records] == [r["step"] for r in ref_records], f"{kind} steps {context}"
        for key in ("loss", "lr", "norm", "loss_z", "norm_z", "val_loss"):
            assert [r.get(key) for r in got_records] == [r.get(key) for r in ref_records], f"{kind} {key} {context}"
    ref_params, got_params = final_params(ref_dir), final_params(out_dir)
    for name, value in ref_params.items():
        assert torch.equal(got_params[name], value), f"{name} differs {context}"
    # the resumed run's optimizer state is the uninterrupted run's, bit for bit
    from gpt2.checkpoint import load_checkpoint

    ref_opt = load_checkpoint(latest_checkpoint(ref_dir))["optimizer"]["state"]
    got_opt = load_checkpoint(latest_checkpoint(out_dir))["optimizer"]["state"]
    for i, state in ref_opt.items():
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(got_opt[i][key], state[key]), f"optimizer {i}.{key} {context}"
