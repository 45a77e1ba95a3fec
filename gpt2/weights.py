"""Where a model's weights come from: one of our checkpoints (or a run directory), an llm.c model file or a
Hugging Face GPT-2 directory. Evaluation, sampling and a training run's `init_from` all load through here.

Our checkpoints are verified (sizes and sha256 against their COMPLETE marker) before they are used; a run
directory resolves to its newest checkpoint that verifies, newer ones that do not are named on stderr.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from common.files import sha256_file
from gpt2.checkpoint import (COMPLETE_MARKER, is_complete, load_checkpoint, model_from_state, newest_valid_checkpoint,
                             verify_checkpoint)
from gpt2.model import GPT
from gpt2.run_dir import RunDir

# what `load_model` accepts, as the `--checkpoint` flag of the evaluate and sample CLIs describes it
MODEL_SOURCE_HELP = "checkpoint dir, run dir (its newest checkpoint that verifies), llm.c model file or HF dir"

HF_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


@dataclass(frozen=True)
class WeightSource:
    """A weight source as it will be loaded: a run directory stands for its newest checkpoint that verifies."""

    path: Path
    kind: str  # `checkpoint`, `llmc` (a model file) or `hf` (a Hugging Face directory)
    marker: dict[str, Any] | None = None  # a checkpoint's COMPLETE marker, every file's size and sha256 checked

    def file_digests(self) -> dict[Path, str]:
        """The sha256 of each file that holds the weights (what identifies them): a checkpoint's from its verified
        marker, plus the marker itself (without it the checkpoint is incomplete), the others' computed now."""
        if self.kind == "checkpoint":
            marker = self.path / COMPLETE_MARKER
            return {**{self.path / name: entry["sha256"] for name, entry in self.marker["files"].items()},
                    marker: sha256_file(marker)}
        if self.kind == "llmc":
            files = [self.path]
        else:
            weights = [self.path / name for name in HF_WEIGHT_FILES if (self.path / name).is_file()]
            files = [self.path / "config.json"] + weights[:1]
        return {f: sha256_file(f) for f in files}


def resolve_source(source: str | os.PathLike) -> WeightSource:
    """A checkpoint directory (verified), a run directory or its checkpoints/ folder (its newest checkpoint that
    verifies), an llm.c model file or a Hugging Face directory; FileNotFoundError otherwise.

    A checkpoint's files are hashed once, here: loading it after this checks their sizes only.
    """
    path = Path(source)
    if is_complete(path):
        return WeightSource(path, "checkpoint", verify_checkpoint(path))
    # a run directory has a config.json too: it is looked for before a Hugging Face directory
    if newest := _newest_run_checkpoint(path):
        return WeightSource(newest, "checkpoint", verify_checkpoint(newest, hashes=False))  # hashed just now
    if path.is_file():
        return WeightSource(path, "llmc")
    if (path / "config.json").is_file():
        return WeightSource(path, "hf")
    raise FileNotFoundError(
        f"{path}: not a checkpoint directory (with {COMPLETE_MARKER}), a run directory, an llm.c model file "
        "or a Hugging Face directory (with config.json)"
    )


def _newest_run_checkpoint(path: Path) -> Path | None:
    """The newest checkpoint that verifies of a run directory or its checkpoints/ folder; None if `path` is
    neither, FileNotFoundError if none verifies. Newer ones that do not verify are named on stderr."""
    run_dir = RunDir(path.parent) if RunDir(path.parent).checkpoints == path else RunDir(path)
    if not run_dir.checkpoints.is_dir():
        return None
    newest, rejected = newest_valid_checkpoint(run_dir.root)
    for r in rejected:
        print(f"warning: skipping checkpoint {r.path}: {r.problem}", file=sys.stderr, flush=True)
    if newest is None:
        raise FileNotFoundError(f"{run_dir.root}: no complete checkpoint that verifies under {run_dir.checkpoints}")
    return newest


def load_model(source: str | os.PathLike | WeightSource, device: str | torch.device = "cpu",
               use_kernels: bool = False) -> tuple[GPT, int | None]:
    """(model, step or None) from our checkpoint (or a run dir), an llm.c model file, or a Hugging Face dir.

    A WeightSource (`resolve_source`) is loaded as resolved: its checkpoint is not hashed again.
    """
    source = source if isinstance(source, WeightSource) else resolve_source(source)
    if source.kind == "checkpoint":
        state = load_checkpoint(source.path, hashes=False)  # resolve_source hashed every file
        return model_from_state(state, device, use_kernels=use_kernels), state["step"]
    if source.kind == "llmc":
        from gpt2.llmc import read_model_file

        model = read_model_file(source.path)
    else:
        from gpt2.hf import import_hf

        model = import_hf(source.path)
    if use_kernels:
        fused = GPT.empty(model.config, use_kernels=True)
        fused.load_state_dict(model.state_dict())
        model = fused
    return model.to(device), None
