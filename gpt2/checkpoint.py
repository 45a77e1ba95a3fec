"""Training checkpoints: one directory per step, written atomically, verified before anything uses it.

Inside a run directory (gpt2.run_dir), `checkpoints/step_00001000/` holds:

    state.pt     model, optimizer, per-rank data-loader and RNG states, guard, step, config
    model.bin    the same weights as an llm.c model file (gpt2.llmc)
    COMPLETE     JSON marker, written last: {"step", "model_file_dtype", "files": {name: {"size", "sha256"}}}

A checkpoint is assembled in a hidden temporary directory and renamed into place (common.files.
atomic_directory), so a crash at any moment leaves either the whole checkpoint or none. A directory
without the marker is never used; one whose files differ from the sizes or hashes its marker lists fails
`verify_checkpoint` with an error naming the file and what is wrong. An init checkpoint
(`write_initial_checkpoint`, the pipeline's init stage) holds only the model, at step 0.
"""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.files import atomic_directory, read_json, remove_stale_tmp_dirs, sha256_file, write_json
from gpt2.config import GPTConfig, parse_model_spec
from gpt2.model import GPT
from gpt2.run_dir import RunDir

STATE_FILE = "state.pt"
MODEL_FILE = "model.bin"
COMPLETE_MARKER = "COMPLETE"
REJECTED_SUFFIX = ".rejected"  # a checkpoint that failed verification, set aside by the trainer (never used)


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and what is wrong with it."""


@dataclass(frozen=True)
class RejectedCheckpoint:
    path: str
    problem: str


def is_complete(path: str | os.PathLike) -> bool:
    return (Path(path) / COMPLETE_MARKER).is_file()


def list_checkpoints(out_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint of a run (marker present, not yet verified), oldest first."""
    return [(step, path) for step, path in RunDir(out_dir).checkpoint_dirs() if is_complete(path)]


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    """The complete checkpoint with the highest step, or None (not verified: see `newest_valid_checkpoint`)."""
    checkpoints = list_checkpoints(out_dir)
    return checkpoints[-1][1] if checkpoints else None


def verify_checkpoint(path: str | os.PathLike, hashes: bool = True) -> dict[str, Any]:
    """The COMPLETE marker of a checkpoint whose files match it: every listed file present with its recorded
    size and (with `hashes`) sha256. Raises CheckpointError naming the file and the problem."""
    path = Path(path)
    marker_path = path / COMPLETE_MARKER
    if not marker_path.is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (no {COMPLETE_MARKER} marker)")
    try:
        marker = read_json(marker_path)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    files = marker.get("files")
    if not isinstance(files, dict) or not files:
        raise CheckpointError(f"{marker_path} lists no file sizes and hashes (written by an older version): "
                              "the checkpoint cannot be verified")
    for name, expected in files.items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{file} is missing (listed in {marker_path})")
        size = file.stat().st_size
        if size != expected["size"]:
            raise CheckpointError(f"{file} has {size} bytes, {marker_path} records {expected['size']} "
                                  f"({'truncated' if size < expected['size'] else 'grown'})")
        if hashes and sha256_file(file) != expected["sha256"]:
            raise CheckpointError(f"{file}: content differs from the sha256 {marker_path} records (corrupted)")
    return marker


def newest_valid_checkpoint(out_dir: str | os.PathLike) -> tuple[Path | None, list[RejectedCheckpoint]]:
    """The newest complete checkpoint that verifies (sizes and hashes), and the newer ones that did not."""
    rejected = []
    for _, path in reversed(list_checkpoints(out_dir)):
        try:
            verify_checkpoint(path)
            return path, rejected
        except CheckpointError as e:
            rejected.append(RejectedCheckpoint(str(path), str(e)))
    return None, rejected


def set_aside(rejected: RejectedCheckpoint) -> Path:
    """Rename a checkpoint that failed verification to step_XXXXXXXX.rejected: no lookup sees it again, the
    step can be written anew, and its files stay for inspection (delete them by hand)."""
    path = Path(rejected.path)
    aside = path.with_name(path.name + REJECTED_SUFFIX)
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(path, aside)
    return aside


def save_checkpoint(
    out_dir: str | os.PathLike,
    step: int,
    state: dict[str, Any],
    model: GPT,
    model_file_dtype: str = "float32",
    keep_last: int | None = None,
) -> Path:
    """Write `state` (must hold "model") and an llm.c model file as checkpoint `step`, atomically; the marker,
    written last, lists each file's size and sha256 (hashed from disk, so it vouches for what was written).

    Then delete all but the newest `keep_last` complete checkpoints (step 0 is kept: it is an init
    checkpoint) and temporary directories that crashed writers left behind.
    """
    from gpt2.llmc import write_model_file

    final = RunDir(out_dir).checkpoint(step)
    with atomic_directory(final) as tmp:
        torch.save(state, tmp / STATE_FILE)
        write_model_file(model, tmp / MODEL_FILE, dtype=model_file_dtype)
        files = {name: {"size": (tmp / name).stat().st_size, "sha256": sha256_file(tmp / name)}
                 for name in (STATE_FILE, MODEL_FILE)}
        write_json(tmp / COMPLETE_MARKER, {"step": step, "model_file_dtype": model_file_dtype, "files": files})
    if keep_last is not None:
        prune_checkpoints(out_dir, keep_last)
    return final


def prune_checkpoints(out_dir: str | os.PathLike, keep_last: int) -> None:
    """Keep step 0 and the newest `keep_last` complete checkpoints; remove stale temporary directories."""
    remove_stale_tmp_dirs(RunDir(out_dir).checkpoints)
    checkpoints = [c for c in list_checkpoints(out_dir) if c[0] != 0]
    for _, path in checkpoints[: max(0, len(checkpoints) - keep_last)]:
        shutil.rmtree(path, ignore_errors=True)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                    hashes: bool = True) -> dict[str, Any]:
    """The state dict of a checkpoint directory that verifies (`verify_checkpoint`; `hashes=False` checks
    sizes only, for a checkpoint verified moments ago)."""
    path = Path(path)
    verify_checkpoint(path, hashes)
    try:
        # weights_only=False: the state holds numpy RNG states and plain Python objects we wrote ourselves
        return torch.load(path / STATE_FILE, map_location=map_location, weights_only=False)
    except Exception as e:  # torch's own errors (e.g. a zip error) do not say which file
        raise CheckpointError(f"{path / STATE_FILE}: cannot be loaded ({type(e).__name__}: {e})") from e


def model_config_of(state: dict[str, Any]) -> GPTConfig:
    return GPTConfig(**state["model_config"])


def model_from_state(state: dict[str, Any], device: str | torch.device = "cpu", use_kernels: bool = False) -> GPT:
    model = GPT.empty(model_config_of(state), use_kernels=use_kernels)
    model.load_state_dict(state["model"])
    return model.to(device)


def write_initial_checkpoint(
    out_dir: str | os.PathLike, model: str | GPTConfig = "d12", seed: int = 42, model_file_dtype: str = "float32"
) -> Path:
    """Checkpoint step 0 of `out_dir`: the model initialised in llm.c's RNG order (gpt2.init) from `seed`.

    `model` is a descriptor (`d12`), an explicit shape spec (gpt2.config.parse_model_spec) or a GPTConfig.
    Training starts from it when given as its `init_from`.
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
