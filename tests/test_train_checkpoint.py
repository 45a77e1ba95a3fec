"""Checkpoint directories: atomic, latest-complete lookup, keep-last-K, step 0 from the init stage, any source."""

import shutil

import pytest
import torch

from gpt2 import checkpoint as ckpt
from gpt2.hf import export_hf
from gpt2.llmc import read_model_file
from gpt2.config import parse_model_spec
from gpt2.model import GPT
from gpt2.run_dir import RunDir
from gpt2.train import train
from gpt2.weights import load_model
from tests.fixtures.train.tiny import single_thread  # noqa: F401 (autouse fixture)
from tests.fixtures.train.tiny import TINY_MODEL, final_params, read_metrics, tiny_config


def _steps(out_dir) -> list[int]:
    return [step for step, _ in ckpt.list_checkpoints(out_dir)]


def test_keep_last_k_keeps_step_0_and_writes_an_llmc_file(tmp_path):
    config = tiny_config(tmp_path, max_steps=5, checkpoint_every=1, keep_last=2)
    ckpt.write_initial_checkpoint(config.out_dir, TINY_MODEL, seed=config.seed)
    train(config)
    assert _steps(config.out_dir) == [0, 4, 5]
    latest = ckpt.latest_checkpoint(config.out_dir)
    assert latest == RunDir(config.out_dir).checkpoint(5)
    state = ckpt.load_checkpoint(latest)
    llmc_model = read_model_file(latest / ckpt.MODEL_FILE)
    for name, value in llmc_model.state_dict().items():
        assert torch.equal(value, state["model"][name]), name


def test_incomplete_checkpoints_are_never_picked_up(tmp_path):
    config = tiny_config(tmp_path, max_steps=3, checkpoint_every=1, keep_last=10)
    train(config)
    root = RunDir(config.out_dir).checkpoints
    # a crash mid-write leaves a hidden temporary directory; a directory without the marker is also ignored
    shutil.copytree(root / "step_00000003", root / ".tmp_step_00000004_123")
    shutil.copytree(root / "step_00000003", root / "step_00000009")
    (root / "step_00000009" / ckpt.COMPLETE_MARKER).unlink()
    assert ckpt.latest_checkpoint(config.out_dir) == root / "step_00000003"
    with open(root.parent / "metrics.jsonl", "a") as f:  # a kill mid-write leaves a partial record
        f.write('{"step": 3, "kind": "train", "lo')

    config.max_steps = 4
    summary = train(config)
    assert summary["start_step"] == 3
    assert [r["step"] for r in read_metrics(config.out_dir)] == [0, 1, 2, 3]  # every line parses again
    assert not list(root.glob(".tmp_*"))  # removed by the next start (it holds the run's lock)
    assert _steps(config.out_dir) == [1, 2, 3, 4]


def test_a_failed_write_leaves_no_checkpoint(tmp_path, monkeypatch):
    model = GPT.create(parse_model_spec(TINY_MODEL))

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("gpt2.llmc.write_model_file", crash)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save_checkpoint(tmp_path, 7, {"step": 7, "model": model.state_dict()}, model)
    assert ckpt.latest_checkpoint(tmp_path) is None
    assert not RunDir(tmp_path).checkpoint(7).exists()


def test_training_starts_from_the_initial_checkpoint(tmp_path):
    init = ckpt.write_initial_checkpoint(tmp_path / "init", TINY_MODEL, seed=7)
    config = tiny_config(tmp_path, max_steps=1, lr=0.0, init_from=str(init))  # lr 0: the weights stay the init's
    train(config)
    expected = GPT.create(parse_model_spec(TINY_MODEL), seed=7).state_dict()
    seed_42 = GPT.create(parse_model_spec(TINY_MODEL), seed=42).state_dict()
    params = final_params(config.out_dir)
    assert not torch.equal(params["transformer.wte.weight"], seed_42["transformer.wte.weight"])
    for name, value in expected.items():
        assert torch.equal(params[name], value), name


def test_a_checkpoint_of_another_model_is_refused(tmp_path):
    other = ckpt.write_initial_checkpoint(tmp_path / "init", "n_layer=1,n_head=2,n_embd=32,block_size=64,vocab_size=256")
    with pytest.raises(ValueError, match="use another --out-dir or --init-from, or the matching --model"):
        train(tiny_config(tmp_path, max_steps=1, init_from=str(other)))
    config = tiny_config(tmp_path / "resumed", max_steps=1)
    ckpt.write_initial_checkpoint(config.out_dir, "n_layer=1,n_head=2,n_embd=32,block_size=64,vocab_size=256")
    with pytest.raises(ValueError, match="use another --out-dir or --init-from, or the matching --model"):
        train(config)


def test_load_model_from_every_source(tmp_path):
    config = tiny_config(tmp_path, max_steps=2)
    train(config)
    latest = ckpt.latest_checkpoint(config.out_dir)
    reference = GPT.empty(parse_model_spec(TINY_MODEL))
    reference.load_state_dict(final_params(config.out_dir))
    hf_dir = export_hf(reference, tmp_path / "hf")
    idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    expected, _ = reference(idx)
    for source, step in ((latest, 2), (config.out_dir, 2), (latest.parent, 2), (latest / ckpt.MODEL_FILE, None),
                         (hf_dir, None)):
        model, got_step = load_model(source)
        assert got_step == step, source
        torch.testing.assert_close(model(idx)[0], expected, rtol=1e-5, atol=1e-5, msg=str(source))
    with pytest.raises(FileNotFoundError, match="not a checkpoint directory"):
        load_model(tmp_path / "shards")
