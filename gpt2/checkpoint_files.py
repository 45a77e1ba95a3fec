"""A checkpoint's files: which complete checkpoints a run has, and whether their files are the ones their marker
lists (layout and format: gpt2.checkpoint).

No torch: the pipeline's flow process checks checkpoints (a stage's record, the evaluation scan) without paying
torch's import (~2.5 CPU-seconds a process); gpt2.checkpoint reads and writes the tensors.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.files import read_json, sha256_file
from common.paths import listed_file
from gpt2.run_dir import RunDir

TENSORS_FILE = "state.safetensors"
DATA_FILE = "state.json"
PICKLED_STATE_FILE = "state.pt"  # the older format: converted by `python -m gpt2.checkpoint convert`, never loaded
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
    files = marker.get("files") if isinstance(marker, dict) else None
    if not isinstance(files, dict) or not files:
        raise CheckpointError(f"{marker_path} lists no file sizes and hashes (written by an older version): "
                              "the checkpoint cannot be verified")
    if not isinstance(marker.get("step"), int):
        raise CheckpointError(f"{marker_path} records no step (an integer); the marker is damaged")
    for name, expected in files.items():
        try:
            file = listed_file(path, name, marker_path)
        except ValueError as e:
            raise CheckpointError(str(e)) from None
        if not (isinstance(expected, dict) and isinstance(expected.get("size"), int)
                and isinstance(expected.get("sha256"), str)):
            raise CheckpointError(f"{marker_path}: the entry of {name} is {expected!r}, not {{\"size\": bytes, "
                                  "\"sha256\": hex digest}; the marker is damaged")
        if not file.is_file():
            raise CheckpointError(f"{file} is missing (listed in {marker_path})")
        size = file.stat().st_size
        if size != expected["size"]:
            raise CheckpointError(f"{file} has {size} bytes, {marker_path} records {expected['size']} "
                                  f"({'truncated' if size < expected['size'] else 'grown'})")
        if hashes and sha256_file(file) != expected["sha256"]:
            raise CheckpointError(f"{file}: content differs from the sha256 {marker_path} records (corrupted)")
    return marker


def require_current_format(path: Path, marker: dict[str, Any]) -> dict[str, Any]:
    """`marker`, or CheckpointError if the checkpoint is of the older pickled format, naming the command that
    converts it (its files are intact: it is kept, for conversion, never loaded)."""
    if PICKLED_STATE_FILE in marker["files"]:
        raise CheckpointError(
            f"{path} holds {PICKLED_STATE_FILE}, the older pickled checkpoint format, which is not loaded (unpickling "
            f"can run code); convert it once with `python -m gpt2.checkpoint convert {path}`")
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
