"""Small file helpers shared by every layer: atomic writes (files and directories), JSON and JSON lines,
hashing."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to `path`; on success rename it to `path`, on error delete it.

    A crash leaves at most a `*.tmp` file behind, never a half-written file under the final name.
    """
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


TMP_DIR_PREFIX = ".tmp_"  # a directory being assembled by `atomic_directory`; never a finished output


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a directory's entries (new names, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty hidden directory next to `path` to fill; on success make its files durable and rename
    it to `path` (replacing an existing one), on error delete it.

    A crash leaves at most a `.tmp_*` directory behind (`remove_stale_tmp_dirs` clears them), never a
    half-written directory under the final name. The caller writes any marker that vouches for the other
    files last, inside the block.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{TMP_DIR_PREFIX}{path.name}_{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        mode = new_file_mode()
        for file in tmp.iterdir():
            if file.is_file():  # one mode for all: some writers (safetensors) create their files 0600
                file.chmod(mode)
            with open(file, "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(tmp)
        if path.exists():  # rename cannot replace a non-empty directory: drop the old copy first
            shutil.rmtree(path)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def new_file_mode() -> int:
    """The mode `open()` gives a new file: 0o666 less the process's umask (which can only be read by setting it)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def remove_stale_tmp_dirs(directory: str | os.PathLike) -> None:
    """Delete the `.tmp_*` directories that interrupted `atomic_directory` blocks left in `directory`."""
    for stale in Path(directory).glob(f"{TMP_DIR_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)


def write_json(path: str | os.PathLike, obj: object) -> None:
    """Write `obj` as indented JSON, atomically (its folder created if missing)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2) + "\n")


def read_json(path: str | os.PathLike) -> dict:
    """Read a JSON file written by `write_json`, with an error that names the file if it is not JSON."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); delete it and rerun the stage") from e


def iter_jsonl_records(
    path: str | os.PathLike, error: type[Exception] = ValueError, name: str | None = None
) -> Iterator[tuple[str, object]]:
    """("FILE line N", parsed value) for each non-blank line; a line that is not JSON raises `error`
    naming the file and line. `name` replaces the path in messages (e.g. the URL it came from)."""
    name = name or str(path)
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{name} line {line_no}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{where}: not valid JSON ({e})") from e


def sha256_file(path: str | os.PathLike, chunk_bytes: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            h.update(chunk)
    return h.hexdigest()


def remove_stale_tmp_files(directory: str | os.PathLike) -> None:
    """Delete `*.tmp` files that an interrupted run of `atomic_path` left in `directory`."""
    for tmp in Path(directory).glob("*.tmp"):
        tmp.unlink(missing_ok=True)
