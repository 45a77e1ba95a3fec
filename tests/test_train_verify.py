"""Verified checkpoints: a corrupt, truncated or incomplete checkpoint is never resumed from, evaluated or
sampled; training falls back to the newest checkpoint that verifies and says so; errors name the file."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpt2 import checkpoint as ckpt
from gpt2.train import train
from tests.fixtures.corruptions import CORRUPTIONS, overwrite_1kib, truncate
from tests.fixtures.train.tiny import single_thread  # noqa: F401 (autouse fixture)
from tests.fixtures.train.tiny import TINY_GPT2_VOCAB_MODEL, final_params, tiny_config


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_a_corrupt_final_checkpoint_is_set_aside_and_training_resumes_from_the_previous_one(tmp_path, name):
    file_name, corrupt = CORRUPTIONS[name]
    config = tiny_config(tmp_path, max_steps=4, checkpoint_every=2, keep_last=5)
    train(config)
    reference = final_params(config.out_dir)  # what the uninterrupted run ended with
    final = ckpt.latest_checkpoint(config.out_dir)
    corrupt(final / file_name)

    summary = train(config)  # the rerun a retry (or the user) does

    assert summary["start_step"] == 2, "resumed from the corrupt final checkpoint"
    (rejected,) = summary["rejected_checkpoints"]
    assert rejected["path"] == str(final) and file_name in rejected["problem"]
    assert json.loads(Path(config.out_dir, "summary.json").read_text())["rejected_checkpoints"] == [rejected]
    assert [step for step, _ in ckpt.list_checkpoints(config.out_dir)] == [2, 4]
    ckpt.verify_checkpoint(final)  # step 4 written anew: it verifies
    got = final_params(config.out_dir)
    for key, value in reference.items():  # the resumed run recomputed the same weights, bit for bit
        assert torch.equal(got[key], value), key
    assert (final.parent / (final.name + ckpt.REJECTED_SUFFIX) / ckpt.COMPLETE_MARKER).exists()  # kept to inspect


def test_a_run_whose_every_checkpoint_fails_starts_over(tmp_path):
    config = tiny_config(tmp_path, max_steps=2, checkpoint_every=1)
    train(config)
    for _, path in ckpt.list_checkpoints(config.out_dir):
        truncate(path / ckpt.TENSORS_FILE)
    summary = train(config)
    assert summary["start_step"] == 0 and len(summary["rejected_checkpoints"]) == 2
    assert summary["steps"] == 2


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_loading_a_corrupt_checkpoint_names_the_file_and_the_problem(tmp_path, name):
    file_name, corrupt = CORRUPTIONS[name]
    config = tiny_config(tmp_path, max_steps=1, checkpoint_every=1)
    train(config)
    path = ckpt.latest_checkpoint(config.out_dir)
    corrupt(path / file_name)
    problem = {"state.safetensors overwritten (1 KiB)": "content differs from the sha256", "model.bin truncated": "truncated",
               "model.bin deleted": "is missing", "state.safetensors truncated": "truncated"}[name]
    with pytest.raises(ckpt.CheckpointError, match=problem) as e:
        ckpt.load_checkpoint(path)
    assert str(path / file_name) in str(e.value)


def test_the_marker_lists_every_file_with_size_and_sha256(tmp_path):
    from common.files import sha256_file

    config = tiny_config(tmp_path, max_steps=1, checkpoint_every=1)
    train(config)
    path = ckpt.latest_checkpoint(config.out_dir)
    marker = json.loads((path / ckpt.COMPLETE_MARKER).read_text())
    on_disk = sorted(p.name for p in path.iterdir() if p.name != ckpt.COMPLETE_MARKER)
    assert sorted(marker["files"]) == on_disk == ["model.bin", "state.json", "state.safetensors"]
    for name, entry in marker["files"].items():
        assert entry == {"size": (path / name).stat().st_size, "sha256": sha256_file(path / name)}


def _cli(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=300)


def test_evaluate_and_sample_refuse_a_corrupt_checkpoint_and_skip_it_in_a_run_dir(tmp_path):
    config = tiny_config(tmp_path, model=TINY_GPT2_VOCAB_MODEL, max_steps=2, checkpoint_every=1)
    train(config)
    final = ckpt.latest_checkpoint(config.out_dir)
    overwrite_1kib(final / ckpt.TENSORS_FILE)

    for module, args in (("gpt2.evaluate", ["--val-data", config.val_data, "--batch-size", "2", "--seq-len", "16",
                                            "--val-steps", "1"]),
                         ("gpt2.sample", ["--num-samples", "1", "--max-new-tokens", "2"])):
        direct = _cli(module, "--checkpoint", str(final), "--device", "cpu", *args)
        assert direct.returncode != 0 and f"{final / ckpt.TENSORS_FILE}: content differs" in direct.stderr, module
        out = tmp_path / f"{module}.json"
        via_run = _cli(module, "--checkpoint", config.out_dir, "--device", "cpu", "--out", str(out), *args)
        assert via_run.returncode == 0, via_run.stderr
        assert f"skipping checkpoint {final}" in via_run.stderr
        assert json.loads(out.read_text())["step"] == 1, module  # the newest checkpoint that verifies


def test_sample_writes_json(tmp_path):
    from gpt2.sample import sample_text
    from gpt2.weights import load_model

    config = tiny_config(tmp_path, model=TINY_GPT2_VOCAB_MODEL, max_steps=1, checkpoint_every=1)
    train(config)
    out = tmp_path / "samples.json"
    done = _cli("gpt2.sample", "--checkpoint", config.out_dir, "--device", "cpu", "--num-samples", "2",
                "--max-new-tokens", "5", "--seed", "3", "--prompt", "Hello", "--out", str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    model, _ = load_model(config.out_dir)
    expected = sample_text(model, "Hello", 5, num_samples=2, seed=3)  # the same samples, computed here
    assert (result["step"], result["prompt"], result["samples"]) == (1, "Hello", expected)


@pytest.mark.parametrize("module", ["gpt2.evaluate", "gpt2.sample"])
def test_device_has_help_text(module, capsys):
    import importlib

    with pytest.raises(SystemExit):
        importlib.import_module(module).build_arg_parser().parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--device {auto,cuda,cpu} where the model runs: auto (this rank's GPU when CUDA is available" in help_text
