"""Training checkpoints: one directory per step, written atomically, plus model loading from any source.

Layout inside a run directory:

    <out_dir>/checkpoints/step_00001000/
        state.pt     model, optimizer, per-rank data-loader and RNG states, guard, step, config
        model.bin    the same weights as an llm.c model file (gpt2.llmc)
        COMPLETE     JSON marker, written last; a directory without it is never used

A checkpoint is assembled in a hidden temporary directory and renamed into place, so a crash at any
moment leaves either the whole checkpoint or none. Step 0 (`write_initial_checkpoint`, the pipeline's
init stage) holds only the model; training starts from it when present.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpt2.config import GPTConfig
from gpt2.model import GPT
from gpt2.train_config import parse_model_spec

CHECKPOINTS = "checkpoints"
STATE_FILE = "state.pt"
MODEL_FILE = "model.bin"
COMPLETE_MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"step_(\d{8})")
_TMP_PREFIX = ".tmp_"


def checkpoint_path(out_dir: str | os.PathLike, step: int) -> Path:
    return Path(out_dir) / CHECKPOINTS / f"step_{step:08d}"


def is_complete(path: str | os.PathLike) -> bool:
    return (Path(path) / COMPLETE_MARKER).is_file()


def list_checkpoints(out_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint of a run, oldest first."""
    root = Path(out_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.fullmatch(p.name)) and is_complete(p)]
    return sorted(found)


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    """The complete checkpoint with the highest step, or None."""
    checkpoints = list_checkpoints(out_dir)
    return checkpoints[-1][1] if checkpoints else None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    out_dir: str | os.PathLike,
    step: int,
    state: dict[str, Any],
    model: GPT,
    model_file_dtype: str = "float32",
    keep_last: int | None = None,
) -> Path:
    """Write `state` (must hold "model") and an llm.c model file as checkpoint `step`, atomically.

    Then delete all but the newest `keep_last` complete checkpoints (step 0 is kept: it is the init
    stage's output) and temporary directories that crashed writers left behind.
    """
    from gpt2.llmc import write_model_file

    final = checkpoint_path(out_dir, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f"{_TMP_PREFIX}{final.name}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    with open(tmp / STATE_FILE, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    write_model_file(model, tmp / MODEL_FILE, dtype=model_file_dtype)  # fsyncs itself
    marker = {"step": step, "files": [STATE_FILE, MODEL_FILE], "model_file_dtype": model_file_dtype}
    with open(tmp / COMPLETE_MARKER, "w") as f:
        json.dump(marker, f)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    if final.exists():  # re-saving a step (e.g. after a resume): drop the old copy first
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    if keep_last is not None:
        prune_checkpoints(out_dir, keep_last)
    return final


def prune_checkpoints(out_dir: str | os.PathLike, keep_last: int) -> None:
    """Keep step 0 and the newest `keep_last` complete checkpoints; remove stale temporary directories."""
    root = Path(out_dir) / CHECKPOINTS
    for stale in root.glob(f"{_TMP_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
    checkpoints = [c for c in list_checkpoints(out_dir) if c[0] != 0]
    for _, path in checkpoints[: max(0, len(checkpoints) - keep_last)]:
        shutil.rmtree(path, ignore_errors=True)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The state dict of a complete checkpoint directory."""
    path = Path(path)
    if not is_complete(path):
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {COMPLETE_MARKER} marker)")
    # weights_only=False: the state holds numpy RNG states and plain Python objects we wrote ourselves
    return torch.load(path / STATE_FILE, map_location=map_location, weights_only=False)


def model_config_of(state: dict[str, Any]) -> GPTConfig:
    return GPTConfig(**state["model_config"])


def model_from_state(state: dict[str, Any], device: str | torch.device = "cpu", use_kernels: bool = False) -> GPT:
    model = GPT.empty(model_config_of(state), use_kernels=use_kernels)
    model.load_state_dict(state["model"])
    return model.to(device)


def write_initial_checkpoint(
    out_dir: str | os.PathLike, model: str | GPTConfig = "d12", seed: int = 42, model_file_dtype: str = "float32"
) -> Path:
    """Checkpoint step 0 of a run: the model initialised in llm.c's RNG order (gpt2.init) from `seed`.

    `model` is a descriptor (`d12`), an explicit shape spec (see gpt2.train_config) or a GPTConfig.
    Training in the same `out_dir` starts from these weights.
    """
    config = parse_model_spec(model) if isinstance(model, str) else model
    gpt = GPT.create(config, seed=seed)
    state = {"step": 0, "model": gpt.state_dict(), "model_config": asdict(config), "init_seed": seed}
    return save_checkpoint(out_dir, 0, state, gpt, model_file_dtype=model_file_dtype)


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states: Python, NumPy, torch CPU and (when present) CUDA."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ----------------------------------------------------------------------------------------------------
# loading a model from whatever the user points at


# what `load_model` accepts, as the `--checkpoint` flag of the evaluate and sample CLIs describes it
MODEL_SOURCE_HELP = "checkpoint dir, run dir (latest complete checkpoint), llm.c model file or HF dir"


def resolve_checkpoint(source: str | os.PathLike) -> Path:
    """A run directory or its checkpoints/ folder -> its latest complete checkpoint; anything else as is."""
    path = Path(source)
    if is_complete(path):
        return path
    run_dir = path.parent if path.name == CHECKPOINTS else path
    if not (run_dir / CHECKPOINTS).is_dir():
        return path
    latest = latest_checkpoint(run_dir)
    if latest is None:
        raise FileNotFoundError(f"{run_dir}: no complete checkpoint under {run_dir / CHECKPOINTS}")
    return latest


def load_model(source: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[GPT, int | None]:
    """(model, step or None) from our checkpoint (or a run dir), an llm.c model file, or a Hugging Face dir."""
    path = resolve_checkpoint(source)
    if is_complete(path):
        state = load_checkpoint(path)
        return model_from_state(state, device), state["step"]
    if path.is_file():
        from gpt2.llmc import read_model_file

        return read_model_file(path, device=device), None
    if (path / "config.json").is_file():
        from gpt2.hf import import_hf

        return import_hf(path, device=device), None
    raise FileNotFoundError(
        f"{source}: not a checkpoint directory (with {COMPLETE_MARKER}), a run directory, an llm.c model file "
        "or a Hugging Face directory (with config.json)"
    )
