"""Small file helpers shared by every layer: atomic writes (files and directories), JSON and JSON lines,
hashing."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

# errnos of a full disk or an exhausted quota, and how Rust libraries (safetensors) spell them in messages
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_DISK_FULL_TEXTS = tuple(f"(os error {n})" for n in sorted(DISK_FULL_ERRNOS))


class DiskFull(OSError):
    """No space (or quota) left for a write. Waiting does not free space, so it is not retried; the message
    names the path, the bytes the write needed and the bytes free."""

    def __init__(self, path: str | os.PathLike, needed: int):
        self.path, self.needed, self.free = Path(path), needed, free_bytes(path)
        super().__init__(errno.ENOSPC, f"no space left on {path}: {needed:,} bytes needed, {self.free:,} free")

    def __str__(self) -> str:
        return self.strerror


def free_bytes(path: str | os.PathLike) -> int:
    """Bytes an unprivileged writer can still write on the filesystem of `path` (or of its nearest existing folder)."""
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def is_disk_full(exc: BaseException) -> bool:
    """An OSError whose errno says disk or quota full, or a library's error that wraps one."""
    if isinstance(exc, OSError):
        return exc.errno in DISK_FULL_ERRNOS
    return any(text in str(exc) for text in _DISK_FULL_TEXTS)


def require_free_space(path: str | os.PathLike, needed: int) -> None:
    """DiskFull now, before anything is written, if `path`'s filesystem has less than `needed` bytes free."""
    if free_bytes(path) < needed:
        raise DiskFull(path, needed)


@contextlib.contextmanager
def naming_disk_full(path: str | os.PathLike, needed: int | Callable[[], int]) -> Iterator[None]:
    """Turn a disk-full error in the block, a write of `needed` bytes (or a callable giving them) to `path`,
    into DiskFull."""
    try:
        yield
    except Exception as e:
        if is_disk_full(e) and not isinstance(e, DiskFull):
            raise DiskFull(path, needed() if callable(needed) else needed) from e
        raise


PID_MAX_LIMIT = 2**22  # the largest pid Linux hands out (the ceiling of kernel.pid_max on 64-bit): 7 digits


def temporary_name(name: str, pid: int | None = None) -> str:
    """The name `atomic_path` writes `name` under until it is complete (this process's pid by default)."""
    return f"{name}.{os.getpid() if pid is None else pid}.tmp"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, size: int | None = None) -> Iterator[Path]:
    """Yield a temporary path next to `path`; on success rename it to `path`, on error delete it.

    A crash leaves at most a `*.tmp` file behind, never a half-written file under the final name. A full disk
    raises DiskFull naming `path` and `size` (the bytes to be written; unknown: what was written until then).
    """
    path = Path(path)
    tmp = path.with_name(temporary_name(path.name))
    written = size
    with naming_disk_full(path, lambda: written or 0):  # outside the clean-up: the free space it reports is real
        try:
            yield tmp
            os.replace(tmp, path)
        finally:
            if written is None and tmp.exists():
                written = tmp.stat().st_size
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
    text = json.dumps(obj, indent=2) + "\n"
    with atomic_path(path, size=len(text.encode())) as tmp:
        tmp.write_text(text)


def parse_json(text: str, where: str, error: type[Exception] = ValueError) -> object:
    """`json.loads(text)`; text that is not JSON, or nested too deeply for the parser (which would otherwise
    raise a RecursionError naming nothing), raises `error` naming `where` (a file, or a file and line)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{where}: not valid JSON ({e})") from e
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply to parse (not a file this pipeline writes)") from None


def read_json(path: str | os.PathLike) -> dict:
    """Read a JSON file written by `write_json`, with an error that names the file if it is not JSON."""
    try:
        return parse_json(Path(path).read_text(), str(path))
    except ValueError as e:
        raise ValueError(f"{e}; delete it and rerun the stage") from e


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
            yield where, parse_json(line, where, error)


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
