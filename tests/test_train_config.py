"""TrainConfig: defaults = llm.c recipe, file + CLI layering, and validation messages."""

import dataclasses
import json

import pytest

from gpt2.config import parse_model_spec
from gpt2.train_config import ConfigError, TrainConfig, build_arg_parser, load_config, validate
from tests.fixtures.train.tiny import TINY_MODEL, make_shards


def test_defaults_are_the_llmc_124m_recipe():
    c = TrainConfig()
    assert (c.model, c.batch_size, c.seq_len, c.total_batch_size) == ("d12", 64, 1024, 524288)
    assert (c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, c.grad_clip) == (6e-4, 0.9, 0.95, 1e-8, 0.1, 1.0)
    assert (c.warmup_steps, c.max_steps, c.lr_schedule, c.final_lr_frac) == (700, 18865, "cosine", 0.0)
    assert (c.val_every, c.val_steps, c.hellaswag_every) == (250, 20, 250)
    assert (c.train_order, c.seed) == ("llmc", 42)  # llm.c's permuted training order, its generator seeded 42 + rank
    assert c.grad_accum_steps(world_size=1) == 8  # 524288 / (64 * 1024)
    assert c.grad_accum_steps(world_size=8) == 1


def test_file_then_cli_override(tmp_path):
    json_file = tmp_path / "run.json"
    json_file.write_text(json.dumps({"batch_size": 8, "lr": 1, "out_dir": "x", "compile": None}))
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("batch_size: 16\nresume: false\n")

    c = load_config(["--config", str(json_file), "--out-dir", "y"])
    assert (c.batch_size, c.lr, c.out_dir, c.compile) == (8, 1.0, "y", None)
    assert isinstance(c.lr, float)  # an int in the file is fine for a float field
    c = load_config(["--config", str(yaml_file), "--batch-size", "2", "--compile"])
    assert (c.batch_size, c.resume, c.compile) == (2, False, True)
    assert load_config(["--no-resume"]).resume is False


@pytest.mark.parametrize(
    "content, message",
    [({"batchsize": 8}, "did you mean 'batch_size'"), ({"batch_size": "8"}, "batch_size must be int"),
     ({"resume": 1}, "resume must be bool"), ([1, 2], "expected a mapping")],
)
def test_bad_config_file_names_the_field(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ConfigError, match=message) as e:
        load_config(["--config", str(path)])
    assert str(path) in str(e.value)


@pytest.mark.parametrize("name, text", [("bad.json", '{"batch_size": 8,}'), ("bad.yaml", "batch_size: [8\n")])
def test_unparsable_config_file_is_named(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"{path}: cannot parse it"):
        load_config(["--config", str(path)])


def test_help_lists_every_field(capsys):
    with pytest.raises(SystemExit) as e:
        build_arg_parser().parse_args(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for f in dataclasses.fields(TrainConfig):
        assert "--" + f.name.replace("_", "-") in out, f.name
    assert "--no-resume" in out and "--no-compile" in out  # booleans can be switched off


def test_model_spec():
    assert parse_model_spec("d12").n_embd == 768
    tiny = parse_model_spec(TINY_MODEL)
    assert (tiny.n_layer, tiny.n_head, tiny.n_embd, tiny.block_size, tiny.vocab_size) == (2, 2, 32, 64, 256)
    assert parse_model_spec("n_layer=1,n_head=1,n_embd=8,vocab_size=300").padded_vocab_size == 384
    with pytest.raises(ValueError, match="unknown shape field 'layers'"):
        parse_model_spec("layers=2")
    with pytest.raises(ValueError, match="unknown model descriptor"):
        parse_model_spec("d13")


def _valid(tmp_path, **overrides) -> TrainConfig:
    train_glob, val_glob = make_shards(tmp_path)
    values = dict(model=TINY_MODEL, train_data=train_glob, val_data=val_glob, batch_size=4, seq_len=16,
                  total_batch_size=128, sample_every=0)
    return TrainConfig(**{**values, **overrides})


def test_validate_accepts_a_good_config(tmp_path):
    assert validate(_valid(tmp_path), world_size=2).n_layer == 2


@pytest.mark.parametrize(
    "overrides, world_size, message",
    [
        ({"total_batch_size": 100}, 1, r"total_batch_size=100 is not a multiple of .* = 64"),
        ({}, 3, r"batch_size\*seq_len\*world_size = 4\*16\*3 = 192"),
        ({"seq_len": 128, "total_batch_size": 512}, 1, "seq_len=128 exceeds the model's max_seq_len 64"),
        ({"train_data": "/nonexistent/*_train_*.bin"}, 1, "train_data: no files match"),
        ({"val_data": "/nonexistent/*.bin"}, 1, "--val-every 0"),
        ({"hellaswag": "/nonexistent.bin"}, 1, "hellaswag: file /nonexistent.bin does not exist"),
        ({"lr_schedule": "step"}, 1, "lr_schedule='step' is not one of"),
        ({"train_order": "shuffled"}, 1, "train_order='shuffled' is not one of llmc, file"),
        ({"sample_every": 10}, 1, "needs the GPT-2 tokenizer's vocabulary"),
        ({"warmup_steps": 10, "max_steps": 5}, 1, "warmup_steps=10 exceeds max_steps=5"),
        ({"batch_size": 0}, 1, "batch_size must be > 0"),
        ({"keep_mlp_post_gb": -1.0}, 1, "keep_mlp_post_gb must be >= 0, got -1.0"),
    ],
)
def test_validate_says_what_to_change(tmp_path, overrides, world_size, message):
    with pytest.raises(ConfigError, match=message):
        validate(_valid(tmp_path, **overrides), world_size=world_size)


def test_yaml_numbers_without_a_dot_are_floats_and_a_bad_one_names_the_field(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 6e-4\neps: 1e-8\nweight_decay: 0.1\n")  # PyYAML reads 6e-4 and 1e-8 as strings
    c = load_config(["--config", str(path)])
    assert (c.lr, c.eps, c.weight_decay) == (6e-4, 1e-8, 0.1)
    path.write_text("lr: six\n")
    with pytest.raises(ConfigError, match=f"{path}: lr must be a number, got 'six'"):
        load_config(["--config", str(path)])


def test_pipeline_settings_are_validated_before_any_input_exists():
    from gpt2.train_config import validate_train_settings

    settings = {"max_steps": 30, "warmup_steps": 3, "lr": "3e-4", "seq_len": 64, "batch_size": 4,
                "total_batch_size": 512, "sample_every": 0}
    config = validate_train_settings(settings, world_size=2, wired={"model": TINY_MODEL})
    assert (config.max_steps, config.lr, config.model) == (30, 3e-4, TINY_MODEL)
    with pytest.raises(ConfigError, match=r"total_batch_size=512 is not a multiple of .* = 768"):
        validate_train_settings(settings, world_size=3, wired={"model": TINY_MODEL})
    with pytest.raises(ConfigError, match="did you mean 'max_steps'"):
        validate_train_settings({"max_stepz": 30})
    with pytest.raises(ConfigError, match="warmup_steps=700 exceeds max_steps=30"):
        validate_train_settings({"max_steps": 30})
    with pytest.raises(ConfigError, match="must not set out_dir"):
        validate_train_settings({"out_dir": "x"})


def test_keep_mlp_post_gb_from_the_command_line_reaches_the_kernels(monkeypatch):
    """`--keep-mlp-post-gb 3.3` as typed becomes the MLPs' memory budget in bytes where gpt2.train configures
    the kernels on a GPU (configure_kernels is recorded instead of run: this machine has none); without the
    flag, the default's 2.5 GB; with 0, none."""
    import torch

    import gpt2_kernels
    from gpt2 import train
    from gpt2.distributed import DistContext

    calls = []
    monkeypatch.setattr(gpt2_kernels, "configure_kernels", lambda *args, **kwargs: calls.append(kwargs) or "recorded")
    gpu = DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cuda", 0))
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32  # _configure_cuda sets both
    try:
        for argv, budget in (([], 2.5e9), (["--keep-mlp-post-gb", "3.3"], 3.3e9), (["--keep-mlp-post-gb", "0"], 0.0)):
            config = load_config(argv)
            assert train._configure_cuda(config, config.model_config(), gpu, use_kernels=True) == "recorded"
            assert calls[-1]["keep_mlp_post_bytes"] == pytest.approx(budget)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def test_a_config_file_that_is_not_utf8_ends_the_cli_with_one_line_naming_it_and_the_byte(tmp_path):
    """Before: `error: UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 29: invalid start
    byte`, naming no file (and under another locale the file was read in that locale's encoding)."""
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "run.yaml"
    text = b'max_steps: 3\nsample_prompt: "caf\xe9"\n'  # Latin-1, not UTF-8
    path.write_bytes(text)
    offset = text.index(b"\xe9")
    result = subprocess.run([sys.executable, "-m", "gpt2.train", "--config", str(path)], capture_output=True,
                            text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"error: {path}: not UTF-8 text: byte 0xe9 at byte offset {offset} of the file (invalid "
        "continuation byte); save the input as UTF-8, or remove the bad bytes"], result.stderr[-2000:]
