"""Bounded settings and bounded reads: every number is checked before anything is allocated or deleted, and a
file's own size bounds what its header or config may ask for. Each test feeds what a hostile user would.

Settings go through flows.config.check_settings, the check every flow makes before any stage runs (the server
tests in test_pipeline_bounds.py run the same through the CLI). Readers are run in a child process whose
address space is capped, so "checked before allocating" is observed, not assumed: a reader that allocated
first would die of the cap instead of naming the file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from flows.config import check_settings
from gpt2.config import GPTConfig
from gpt2.model import GPT

REPO = Path(__file__).resolve().parent.parent
HUGE_MODEL = "n_layer=1,n_head=1,n_embd=100000,block_size=100000"


@pytest.mark.parametrize("setting, value, message", [
    ("shard_size", 10**18, "shard_size=1000000000000000000: must lie in [1, 2147483647]"),
    ("shard_size", 2**31, "shard_size=2147483648: must lie in [1, 2147483647]"),
    ("shard_size", 0, "shard_size=0: must lie in [1, 2147483647]"),
    ("tokenize_workers", 4096, "tokenize_workers=4096: this machine has"),
    ("seed", 2**64, "seed=18446744073709551616 is out of range"),
    ("seed", -1, "seed=-1 is out of range"),
    ("lr", float("nan"), "lr must be a finite number, got nan"),
    ("lr", float("inf"), "lr must be a finite number, got inf"),
    ("eps", -1e-8, "eps must be > 0"),
    ("eps", 0.0, "eps must be > 0"),
    ("grad_clip", float("-inf"), "grad_clip must be a finite number"),
    ("max_steps", 10**30, "max_steps=1000000000000000000000000000000 is out of range"),
    ("model", HUGE_MODEL, f"model={HUGE_MODEL!r} has 135,031,900,000 parameters"),
    ("eval", {"batch_size": -1}, "eval.batch_size must be >= 1"),
    ("eval", {"val_steps": 0}, "eval.val_steps must be >= 1"),
    ("rendezvous", {"nnodes": 0}, "rendezvous.nnodes must be >= 1"),
    ("rendezvous", {"nnodes": 2, "node_rank": 2, "master_addr": "h"}, "rendezvous.node_rank must lie in [0, nnodes=2)"),
    ("rendezvous", {"master_port": 70000}, "rendezvous.master_port must be a TCP port"),
    ("train_timeout_s", float("nan"), "train_timeout_s"),
    # each number bounded by the type it is used in (before, lr=1e39 passed, then every attempt of
    # training ended with `RuntimeError: value cannot be converted to type float without overflow`)
    ("lr", 1e39, "lr=1e+39 is beyond float32, the type it is used in"),
    ("weight_decay", 1e39, "weight_decay=1e+39 is beyond float32"),
    ("eps", 1e-50, "eps=1e-50 rounds to 0 in float32"),
    ("model", "n_layer=1,n_head=1,n_embd=1,block_size=2147483648,vocab_size=256",
     "block_size=2147483648 is out of range: the int32 it is used in"),
    ("num_samples", 10**30, "num_samples=1000000000000000000000000000000 is out of range"),
    ("limit", 2**63, "limit=9223372036854775808 is out of range"),
    ("eval", {"batch_size": 2**63}, "eval.batch_size=9223372036854775808 is out of range"),
    ("slurm", {"heartbeat_timeout_s": float("nan")}, "slurm.heartbeat_timeout_s must be a finite number"),
    ("slurm", {"heartbeat_timeout_s": float("inf")}, "slurm.heartbeat_timeout_s must be a finite number"),
])
def test_a_setting_out_of_bounds_is_refused_naming_it(setting, value, message):
    with pytest.raises(ValueError) as info:
        check_settings({setting: value})
    assert message in str(info.value)


def test_adams_first_step_size_is_bounded_by_float32():
    """lr / (1 - beta1) is the scalar AdamW scales its first update by (bias correction): beyond float32, the
    optimizer raises the same overflow as an lr beyond it."""
    with pytest.raises(ValueError, match=r"lr / \(1 - beta1\) = 1e\+37 / \(1 - 0.999999\) .* is beyond float32"):
        check_settings({"lr": 1e37, "beta1": 0.999999})
    check_settings({"lr": 1e30, "beta1": 0.999999})


@pytest.mark.parametrize("setting, value, named", [
    ("run_name", "x\ntouch pwned #", "run_name"),
    ("dataset", "tab\tbed", "dataset"),
    ("run_name", "reset\x1bc", "run_name"),
    ("dataset", "del\x7f", "dataset"),
    ("run_name", "nel\x85", "run_name"),
    ("root", "artifacts\nx", "root"),
    ("source", "docs\r", "source"),
    ("hellaswag_source", "h.jsonl\x00", "hellaswag_source"),
    ("model", "d12\n", "model"),
    ("init_from", "runs/x\u2028y", "init_from"),
    ("slurm", {"partition": "gpu\n#SBATCH --wrap=pwned"}, "slurm.partition"),
    ("slurm", {"sbatch_options": ["--qos=high", "--comment=a\nb"]}, "slurm.sbatch_options[1]"),
    ("slurm", {"setup": "module load cuda\x1b[2J"}, "slurm.setup"),
    ("rendezvous", {"nnodes": 2, "rdzv_endpoint": "h:1\n", "rdzv_id": "r"}, "rendezvous.rdzv_endpoint"),
    ("eval", {"device": "cpu\t"}, "eval.device"),
    ("sample_prompt", "Hello\x1b]0;pwned\x07", "sample_prompt"),
    ("device", "cpu\n", "device"),
])
def test_a_control_character_in_a_name_or_text_setting_is_refused_naming_it(setting, value, named):
    """Before: `run_name="x\\ntouch pwned #"` passed the check, and the Slurm job script got a line of its own
    running `touch pwned`. Every name and string setting reaches a file name, a script or a log line."""
    with pytest.raises(ValueError) as info:
        check_settings({setting: value})
    message = str(info.value)
    assert f"{named} " in message and "control character" in message, message


def test_newlines_and_tabs_pass_in_settings_that_are_text_by_nature():
    """A prompt is text, and the Slurm setup is shell lines: both may span lines."""
    settings = check_settings({"sample_prompt": "Q:\tHello\nA:", "slurm": {"setup": "module load cuda\nexport X=1"}})
    assert settings.sample_prompt == "Q:\tHello\nA:"


@pytest.mark.parametrize("setting", ["dataset", "run_name"])
def test_a_name_is_bounded_by_the_longest_name_a_stage_derives_from_it(setting, tmp_path):
    """Before: a 240-character dataset passed the check, then tokenize failed with `OSError: [Errno 36] File
    name too long` on `{dataset}_train_000001.bin.<pid>.tmp`. The longest name that passes makes every
    derived name the filesystem (or Slurm) takes; one byte more is refused, naming the setting."""
    from flows.config import longest_derived_names

    longest = _longest_accepted(setting)
    with pytest.raises(ValueError, match=rf"{setting}: .* at most {len(longest)} bytes"):
        check_settings({setting: longest + "x"})
    for derived, limit in longest_derived_names(setting, longest):
        assert len(derived.encode()) <= limit
    if setting == "dataset":  # the real files: a shard written under its temporary name, then renamed
        from data.shards import shard_filename, write_shard

        write_shard(tmp_path / shard_filename(longest, 1), np.arange(10))
        assert (tmp_path / shard_filename(longest, 1)).is_file()


def _longest_accepted(setting: str) -> str:
    """The longest name of one repeated letter that the settings check takes for `setting`."""
    low, high = 1, 255
    while low < high:
        middle = (low + high + 1) // 2
        try:
            check_settings({setting: "n" * middle})
            low = middle
        except ValueError:
            high = middle - 1
    return "n" * low


def test_a_240_character_dataset_is_refused_naming_the_shard_file_it_would_make():
    with pytest.raises(ValueError) as info:
        check_settings({"dataset": "d" * 240})
    assert "dataset: " in str(info.value) and "_train_000001.bin" in str(info.value)


def test_the_model_check_counts_parameters_from_the_shape_alone():
    """The memory bound counts the model from its dimensions: the count must be the model's own."""
    for config in (GPTConfig(), GPTConfig(n_layer=3, n_head=2, n_embd=48, block_size=40, vocab_size=300)):
        with torch.device("meta"):
            assert config.num_parameters == GPT(config).num_parameters()


def test_a_shard_size_out_of_bounds_leaves_the_dataset_folder_as_it_was(tmp_path):
    """Finding 1: the folder was cleared first, then the allocation failed. Now nothing is touched."""
    from data.shards import build_shards

    out = tmp_path / "shards"
    build_shards(["one document", "another one"], out, "wipe", shard_size=8, num_workers=1, replace=True)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ValueError, match="shard_size=1000000000000000000"):
        build_shards(["other text"], out, "wipe", shard_size=10**18, num_workers=1, replace=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


# ---------------------------------------------------------------------------------------------------------
# readers: a file's dimensions are checked against its size before anything is allocated


def _read_in_capped_memory(code: str, cap_gb: float = 3.0) -> subprocess.CompletedProcess:
    """Run `code` in a child whose address space may grow at most `cap_gb` beyond what its imports took."""
    script = textwrap.dedent("""
        import resource, torch, gpt2.llmc, gpt2.hf, gpt2.checkpoint, gpt2.weights
        size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (size + int({cap} * 2**30),) * 2)
    """).format(cap=cap_gb) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=600)


def _named_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    for fragment in fragments:
        assert fragment in last, result.stderr[-2000:]


def test_a_1kb_llmc_file_whose_header_asks_for_40gb_is_refused_naming_it(tmp_path):
    header = np.zeros(256, dtype="<i4")
    header[:8] = (20240326, 3, 100000, 50257, 1, 1, 100000, 50304)
    path = tmp_path / "crafted.bin"
    path.write_bytes(header.tobytes() + b"\0" * 64)
    result = _read_in_capped_memory(f"gpt2.llmc.read_model_file({str(path)!r})")
    _named_error(result, "ValueError", str(path), "the file is truncated")


def test_a_1kb_hugging_face_folder_of_a_huge_config_is_refused_naming_it(tmp_path):
    """Finding 10: n_embd=10000 and 1-element tensors took the process to 2.4 GB before the shape error."""
    from safetensors.torch import save_file

    directory = tmp_path / "hf"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "n_layer": 12, "n_head": 10, "n_embd": 10000, "n_positions": 1024, "vocab_size": 50257}))
    save_file({"wte.weight": torch.zeros(1), "wpe.weight": torch.zeros(1)}, str(directory / "model.safetensors"))
    result = _read_in_capped_memory(f"gpt2.hf.import_hf({str(directory)!r})", cap_gb=1.0)
    _named_error(result, "ValueError", str(directory), "describes a model of 14,914,390,000 weights", "but holds 2;")


def test_a_checkpoint_whose_state_json_claims_a_huge_model_is_refused_naming_it(tmp_path):
    """Finding 9/10: a planted model_config in state.json; the weights stored beside it are a tiny model's."""
    from gpt2.checkpoint import COMPLETE_MARKER, DATA_FILE, write_initial_checkpoint
    from common.files import sha256_file, write_json

    path = write_initial_checkpoint(tmp_path / "run", "n_layer=1,n_head=1,n_embd=8,block_size=8", seed=1)
    data = json.loads((path / DATA_FILE).read_text())
    data["model_config"] = {"n_layer": 1, "n_head": 1, "n_embd": 100000, "block_size": 100000}
    (path / DATA_FILE).write_text(json.dumps(data))
    marker = json.loads((path / COMPLETE_MARKER).read_text())  # planted consistently: the marker vouches for it
    marker["files"][DATA_FILE] = {"size": (path / DATA_FILE).stat().st_size, "sha256": sha256_file(path / DATA_FILE)}
    write_json(path / COMPLETE_MARKER, marker)
    result = _read_in_capped_memory(f"gpt2.weights.load_model({str(path)!r})")
    _named_error(result, "CheckpointError", str(path / DATA_FILE), "describes a model of")


@pytest.mark.parametrize("header_length", [2**62, 50_000_000])
def test_a_safetensors_header_larger_than_its_file_is_refused_naming_it(tmp_path, header_length):
    """Finding 9: an oversized safetensors header; safetensors checks it against the file before reading it, and
    its error did not name the file."""
    import struct

    from gpt2.hf import import_hf

    directory = tmp_path / "hf"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "n_layer": 1, "n_head": 1, "n_embd": 8, "n_positions": 8, "vocab_size": 16}))
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", header_length) + b"{}" + b" " * 100)
    with pytest.raises(ValueError, match=rf"{directory / 'model.safetensors'}: cannot be loaded \(SafetensorError"):
        import_hf(directory)


def test_a_hellaswag_file_with_tokens_outside_the_vocabulary_is_refused_naming_it(tmp_path):
    from data.hellaswag import EvalFileError, Example, read_eval_file, write_eval_file

    path = tmp_path / "hellaswag_val.bin"
    write_eval_file(path, [Example(index=0, label=1, ctx_tokens=[1, 60000], ending_tokens=[[3], [4], [5], [6]])])
    with pytest.raises(EvalFileError, match=rf"{path}: example 0 holds token 60000, outside GPT-2's vocabulary"):
        read_eval_file(path)


def test_a_deeply_nested_hellaswag_line_names_the_file_and_line(tmp_path):
    from data.hellaswag import EvalFileError, iter_jsonl

    path = tmp_path / "hellaswag.jsonl"
    good = {"ctx": "a", "endings": ["b", "c", "d", "e"], "label": 0}
    path.write_text(json.dumps(good) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(EvalFileError, match=rf"{path} line 2: JSON nested too deeply"):
        list(iter_jsonl(path))
