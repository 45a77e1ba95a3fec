"""Where a model's weights come from: one of our checkpoints (or a run directory), an llm.c model file or a
Hugging Face GPT-2 directory. Evaluation, sampling and a training run's `init_from` all load through here.

Our checkpoints are verified (sizes and sha256 against their COMPLETE marker) before they are used; a run
directory resolves to its newest checkpoint that verifies, newer ones that do not are named on stderr.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from gpt2.checkpoint import COMPLETE_MARKER, is_complete, load_checkpoint, model_from_state, newest_valid_checkpoint
from gpt2.model import GPT
from gpt2.run_dir import RunDir

# what `load_model` accepts, as the `--checkpoint` flag of the evaluate and sample CLIs describes it
MODEL_SOURCE_HELP = "checkpoint dir, run dir (its newest checkpoint that verifies), llm.c model file or HF dir"

HF_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def resolve_checkpoint(source: str | os.PathLike) -> Path:
    """A run directory or its checkpoints/ folder -> its newest checkpoint that verifies; anything else as is."""
    path = Path(source)
    if is_complete(path):
        return path
    run_dir = RunDir(path.parent) if RunDir(path.parent).checkpoints == path else RunDir(path)
    if not run_dir.checkpoints.is_dir():
        return path
    newest, rejected = newest_valid_checkpoint(run_dir.root)
    for r in rejected:
        print(f"warning: skipping checkpoint {r.path}: {r.problem}", file=sys.stderr, flush=True)
    if newest is None:
        raise FileNotFoundError(f"{run_dir.root}: no complete checkpoint that verifies under {run_dir.checkpoints}")
    return newest


def source_kind(path: str | os.PathLike) -> str:
    """`checkpoint`, `llmc` (a model file) or `hf` (a Hugging Face directory); FileNotFoundError otherwise."""
    path = Path(path)
    if is_complete(path):
        return "checkpoint"
    if path.is_file():
        return "llmc"
    if (path / "config.json").is_file():
        return "hf"
    raise FileNotFoundError(
        f"{path}: not a checkpoint directory (with {COMPLETE_MARKER}), a run directory, an llm.c model file "
        "or a Hugging Face directory (with config.json)"
    )


def source_files(path: str | os.PathLike) -> list[Path]:
    """The files that hold a weight source's content (what identifies it)."""
    path = Path(path)
    kind = source_kind(path)
    if kind == "checkpoint":
        from gpt2.checkpoint import verify_checkpoint

        return [path / name for name in verify_checkpoint(path, hashes=False)["files"]]
    if kind == "llmc":
        return [path]
    return [path / "config.json"] + [path / name for name in HF_WEIGHT_FILES if (path / name).is_file()][:1]


def load_model(source: str | os.PathLike, device: str | torch.device = "cpu",
               use_kernels: bool = False) -> tuple[GPT, int | None]:
    """(model, step or None) from our checkpoint (or a run dir), an llm.c model file, or a Hugging Face dir."""
    path = resolve_checkpoint(source)
    kind = source_kind(path)
    if kind == "checkpoint":
        state = load_checkpoint(path)
        return model_from_state(state, device, use_kernels=use_kernels), state["step"]
    if kind == "llmc":
        from gpt2.llmc import read_model_file

        model = read_model_file(path)
    else:
        from gpt2.hf import import_hf

        model = import_hf(path)
    if use_kernels:
        fused = GPT.empty(model.config, use_kernels=True)
        fused.load_state_dict(model.state_dict())
        model = fused
    return model.to(device), None
