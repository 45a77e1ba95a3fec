"""The run directory's owner: one writer at a time (a second is refused, naming the holder; a dead holder's
lock is taken over), a rerun keeps the summary, and a run starts from `init_from`'s weights."""

import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from gpt2 import checkpoint as ckpt
from gpt2.config import parse_model_spec
from gpt2.model import GPT
from gpt2.train import train
from tests.fixtures.train.tiny import single_thread  # noqa: F401 (autouse fixture)
from tests.fixtures.processes import wait_for
from tests.fixtures.train.tiny import TINY_MODEL, read_metrics, tiny_config


def _trainer(config, tmp_path: Path, name: str) -> list[str]:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config.to_dict()))
    return [sys.executable, "-m", "gpt2.train", "--config", str(path)]


def test_a_second_trainer_in_the_same_run_dir_is_refused_naming_the_first(tmp_path):
    config = tiny_config(tmp_path, max_steps=100_000, warmup_steps=1)  # runs until killed
    first = subprocess.Popen(_trainer(config, tmp_path, "first"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    metrics = Path(config.out_dir) / "metrics.jsonl"
    try:
        assert wait_for(lambda: metrics.exists() and metrics.stat().st_size > 0, 120, poll_s=0.05), "timed out"
        second = subprocess.run(_trainer(config, tmp_path, "second"), capture_output=True, text=True, timeout=300)
        assert second.returncode != 0
        assert f"pid {first.pid} on host {socket.gethostname()}" in second.stderr, second.stderr
        from gpt2.run_dir import RunDir, RunDirLocked
        with pytest.raises(RunDirLocked, match=f"pid {first.pid}"):  # in-process too
            train(config)
        assert first.poll() is None  # the first writer goes on, alone
        steps = [r["step"] for r in read_metrics(config.out_dir)]
        assert steps == list(range(len(steps)))  # one writer's records, in order
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)

    # the lock of a killed writer is taken over
    config.max_steps = 2
    with RunDir(config.out_dir).lock():
        pass
    assert train(config)["steps"] == 2


def test_a_lock_file_left_by_a_dead_process_is_taken_over(tmp_path):
    from gpt2.run_dir import RunDir, RunDirLocked

    run_dir = RunDir(tmp_path / "run")
    run_dir.root.mkdir()
    run_dir.lock_file.write_text(json.dumps({"pid": 999999, "host": socket.gethostname()}))
    with run_dir.lock():
        held = json.loads(run_dir.lock_file.read_text())
        assert held == {"pid": os.getpid(), "host": socket.gethostname()}
        with pytest.raises(RunDirLocked, match=f"pid {os.getpid()} on host"):
            with RunDir(run_dir.root).lock():
                pass


def test_a_finished_run_rerun_keeps_its_summary(tmp_path):
    config = tiny_config(tmp_path, max_steps=3, checkpoint_every=1, val_every=3)
    first = train(config)
    again = train(config)
    saved = json.loads(Path(config.out_dir, "summary.json").read_text())
    for key in ("steps", "train_loss", "checkpoint", "val_loss"):
        assert first[key] is not None, key
        assert again[key] == first[key] == saved[key], key


@pytest.mark.parametrize("kind", ["checkpoint", "llmc", "hf"])
def test_training_from_existing_weights_starts_with_their_loss(tmp_path, kind):
    """init_from: the first step's loss is the source model's loss on the first batch, computed here."""
    from data.loader import DistributedDataLoader
    from gpt2.hf import export_hf
    from gpt2.llmc import write_model_file

    source_model = GPT.create(parse_model_spec(TINY_MODEL), seed=99)
    with torch.no_grad():
        source_model.transformer.wte.weight.mul_(3.0)  # unlike any fresh init
    if kind == "checkpoint":
        state = {"step": 7, "model": source_model.state_dict(), "model_config": asdict(source_model.config)}
        source = ckpt.save_checkpoint(tmp_path / "other_run", 7, state, source_model)
    elif kind == "llmc":
        source = write_model_file(source_model, tmp_path / "model.bin")
    else:
        source = export_hf(source_model, tmp_path / "hf")

    config = tiny_config(tmp_path, max_steps=2, init_from=str(source))
    loader = DistributedDataLoader(config.train_data, config.batch_size, config.seq_len, 0, 1)
    x, y = loader.next_batch()
    with torch.no_grad():
        _, expected = source_model(x, y)
    summary = train(config)
    first = read_metrics(config.out_dir)[0]
    assert (first["step"], summary["start_step"], summary["init_from"]) == (0, 0, str(source))
    assert first["loss"] == pytest.approx(expected.item(), rel=1e-6)


def test_resuming_wins_over_init_from_and_a_corrupt_init_from_is_refused(tmp_path):
    source = ckpt.write_initial_checkpoint(tmp_path / "init", TINY_MODEL, seed=5)
    config = tiny_config(tmp_path, max_steps=2, checkpoint_every=1, init_from=str(source))
    train(config)
    config.max_steps = 3
    assert train(config)["start_step"] == 2  # the run's own checkpoint, not init_from
    (source / ckpt.TENSORS_FILE).write_bytes(b"\0" * 10)
    with pytest.raises(ckpt.CheckpointError, match=f"{source / ckpt.TENSORS_FILE} has 10 bytes"):
        train(tiny_config(tmp_path / "new", max_steps=1, init_from=str(source)))
