"""Small file helpers shared by every layer: atomic writes (files and directories), appends of whole records,
JSON and JSON lines, hashing; every writer here names a full disk (`DiskFull`)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import math
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

_logger = logging.getLogger(__name__)

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
    into DiskFull naming `path`: also one a write of a part of it raised (a file of a directory being
    assembled), so the error names the output and its total, never a temporary file."""
    try:
        yield
    except Exception as e:
        if is_disk_full(e) and not (isinstance(e, DiskFull) and e.path == Path(path)):
            raise DiskFull(path, needed() if callable(needed) else needed) from e
        raise


PID_MAX_LIMIT = 2**22  # the largest pid Linux hands out (the ceiling of kernel.pid_max on 64-bit): 7 digits


def temporary_name(name: str, pid: int | None = None) -> str:
    """The name `atomic_path` writes `name` under until it is complete (this process's pid by default)."""
    return f"{name}.{os.getpid() if pid is None else pid}.tmp"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, size: int | None = None) -> Iterator[Path]:
    """Yield a temporary path next to `path`; on success rename it to `path`, on error delete it.

    A crash leaves at most a `*.tmp` file behind, never a half-written file under the final name. With `size`
    (the bytes to be written), a filesystem with less free is DiskFull before the first byte; a full disk
    raises DiskFull naming `path` and `size` (unknown: what was written until then).
    """
    path = Path(path)
    if size is not None:
        require_free_space(path, size)
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


def _tree_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, size: int | None = None) -> Iterator[Path]:
    """Yield an empty hidden directory next to `path` to fill; on success make its files durable and rename
    it to `path` (replacing an existing one), on error delete it.

    A crash leaves at most a `.tmp_*` directory behind (`remove_stale_tmp_dirs` clears them), never a
    half-written directory under the final name. The caller writes any marker that vouches for the other
    files last, inside the block. With `size` (every byte its files will hold), a filesystem with less free
    is DiskFull before the first byte; a full disk raises DiskFull naming `path` and `size` (unknown: what
    was written until then), whichever of its files met it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if size is not None:
        require_free_space(path, size)
    tmp = path.with_name(f"{TMP_DIR_PREFIX}{path.name}_{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    written = size
    with naming_disk_full(path, lambda: written or 0):  # outside the clean-up: the free space it reports is real
        try:
            yield tmp
            _publish_directory(tmp, path)
        finally:
            if written is None and tmp.exists():
                written = _tree_bytes(tmp)
            shutil.rmtree(tmp, ignore_errors=True)


def _publish_directory(tmp: Path, path: Path) -> None:
    """Make `tmp`'s files durable and rename it to `path`, replacing an existing one."""
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


def new_file_mode() -> int:
    """The mode `open()` gives a new file: 0o666 less the process's umask (which can only be read by setting it)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def remove_stale_tmp_dirs(directory: str | os.PathLike) -> None:
    """Delete the `.tmp_*` directories that interrupted `atomic_directory` blocks left in `directory`."""
    for stale in Path(directory).glob(f"{TMP_DIR_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)


class NotJsonNumber(ValueError):
    """A float JSON has no spelling for (NaN, Infinity) in a record about to be written; the message names the
    file and the key that holds it."""


def json_text(obj: object, where: str | os.PathLike, indent: int | None = None, ensure_ascii: bool = True) -> str:
    """`obj` as strict JSON: the one serializer of every JSON file this project writes (write_json, JSON-lines
    logs, checkpoints, an export's tokenizer). Python's default writes NaN and Infinity, which no JSON reader has
    to accept; a missing number is written `null`, with a field saying why, by the code that knows. A non-finite
    float raises NotJsonNumber naming `where` (the file) and the key that holds it. `ensure_ascii` as json.dumps's."""
    try:
        return json.dumps(obj, indent=indent, allow_nan=False, ensure_ascii=ensure_ascii)
    except ValueError:
        found = _first_non_finite(obj)
        if found is None:  # another ValueError (a circular reference): not ours to name
            raise
    key, value = found
    raise NotJsonNumber(f"{where}: {key} is {value}, which JSON cannot hold; nothing was written (a number that "
                        "is missing is written as null, with the reason)")


def _first_non_finite(obj: object, key: str = "") -> tuple[str, float] | None:
    """(the path of the first NaN or infinite float in `obj`, e.g. `hellaswag.acc` or `rows[2]`, the float), or
    None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return key or "the value", obj
    if isinstance(obj, dict):
        children = [(f"{key}.{name}" if key else str(name), value) for name, value in obj.items()]
    elif isinstance(obj, (list, tuple)):
        children = [(f"{key}[{i}]", value) for i, value in enumerate(obj)]
    else:
        return None
    return next(filter(None, (_first_non_finite(value, child) for child, value in children)), None)


def json_file_text(obj: object, where: str | os.PathLike) -> str:
    """`obj` as the text of a JSON file `write_json` writes: indented strict JSON (`json_text`) and a newline.
    Also what a writer counts before a pre-check of free space."""
    return json_text(obj, where, indent=2) + "\n"


def write_json(path: str | os.PathLike, obj: object) -> None:
    """Write `obj` as indented strict JSON (`json_text`), atomically (its folder created if missing)."""
    text = json_file_text(obj, path)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
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
    """Read a JSON file written by `write_json`, with an error that names the file if it is not UTF-8 JSON."""
    advice = "delete it and rerun the stage"
    text = utf8_text(Path(path).read_bytes(), str(path), ValueError, advice=advice)
    try:
        return parse_json(text, str(path))
    except ValueError as e:
        raise ValueError(f"{e}; {advice}") from e


def warn(message: str) -> None:
    """The default way a reader names what it skipped: a warning on the `common.files` logger (stderr when
    logging is not configured, e.g. in gpt2.train)."""
    _logger.warning("%s", message)


def iter_jsonl_records(
    path: str | os.PathLike, error: type[Exception] = ValueError, name: str | None = None,
    skip_bad: Callable[[str], None] | None = None,
) -> Iterator[tuple[str, object]]:
    """("FILE line N", parsed value) for each non-blank line. A line that is not UTF-8 or not JSON raises `error`
    naming the file and line (and the bad byte's offset in the file); with `skip_bad` (the readers of our own
    logs, which one bad line must never stop) it is skipped instead and named once through `skip_bad`. `name`
    replaces the path in messages (e.g. the URL it came from)."""
    name = name or str(path)
    with open(path, "rb") as f:  # bytes: each line is decoded by itself, so a bad byte is named where it is
        yield from _parsed_lines(_decoded_lines(f, name, error, replace=skip_bad is not None), name, error, skip_bad)


def _decoded_lines(lines: Iterable[bytes], name: str, error: type[Exception],
                   replace: bool) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of each line of a file read as bytes. A log's damaged bytes are one bad line
    (`replace`: they become U+FFFD and the line fails as JSON, if at all); an input's are an error naming the
    line and the byte's offset in the file (`utf8_text`), never silently replaced."""
    offset = 0
    for line_no, raw in enumerate(lines, start=1):
        text = raw.decode(errors="replace") if replace else utf8_text(raw, f"{name} line {line_no}", error, offset)
        offset += len(raw)
        yield line_no, text


def utf8_text(raw: bytes, where: str, error: type[Exception], offset: int = 0, of: str = "the file",
              advice: str = "save the input as UTF-8, or remove the bad bytes") -> str:
    """`raw` decoded as UTF-8, the one check of every reader of user text (JSON lines, parquet values, config
    files) and of our own JSON files. Bytes that are not UTF-8 raise `error` naming `where` (a file and line, or
    row and column), the first bad byte and its offset in `of` (`offset`: where `raw` starts in it), then
    `advice`. Python's own error names no file, and its position counts from the start of whatever buffer it was
    decoding."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{where}: not UTF-8 text: byte 0x{raw[e.start]:02x} at byte offset {offset + e.start:,} of {of} "
                    f"({e.reason}); {advice}") from None


def _parsed_lines(numbered: Iterable[tuple[int, str]], name: str, error: type[Exception],
                  skip_bad: Callable[[str], None] | None) -> Iterator[tuple[str, object]]:
    """The one place a line of a JSON-lines file is parsed (iter_jsonl_records, JsonLinesTail)."""
    for line_no, line in numbered:
        if not line.strip():
            continue
        where = f"{name} line {line_no}"
        try:
            yield where, parse_json(line, where, error)
        except error as e:
            if skip_bad is None:
                raise
            skip_bad(f"{e}; line skipped")


class JsonLinesTail:
    """The whole lines appended to a JSON-lines log since the last look (`new_records`), for a reader that
    follows a log while it is written: a line still being written waits for the next look, a file replaced
    or shortened is read again from its start, and a bad line is skipped and named once through `skip_bad`."""

    def __init__(self, path: str | os.PathLike, skip_bad: Callable[[str], None] = warn):
        self.path, self.skip_bad = Path(path), skip_bad
        self.offset, self.lines_read, self.inode = 0, 0, None

    def new_records(self) -> list[object]:
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return []
        if stat.st_ino != self.inode or stat.st_size < self.offset:  # replaced (a resume rewrites it): reread
            self.inode, self.offset, self.lines_read = stat.st_ino, 0, 0
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        lines = complete.decode(errors="replace").split("\n")[:-1]
        numbered = enumerate(lines, start=self.lines_read + 1)
        self.lines_read += len(lines)
        return [record for _, record in _parsed_lines(numbered, str(self.path), ValueError, self.skip_bad)]


def read_log_records(path: str | os.PathLike, skip_bad: Callable[[str], None] = warn) -> list[dict]:
    """The JSON objects of one of our own JSON-lines logs (metrics.jsonl, ...), oldest first; [] if there is
    none. A line that is not a JSON object (torn by a crash, edited by hand) is skipped and named once through
    `skip_bad`: a reader of a log never kills the work it reports on."""
    if not Path(path).exists():
        return []
    records = []
    for where, record in iter_jsonl_records(path, skip_bad=skip_bad):
        if isinstance(record, dict):
            records.append(record)
        else:
            skip_bad(f"{where}: a {type(record).__name__}, not a JSON object; line skipped")
    return records


class AppendOnlyFile:
    """A file that grows by whole records only (`append`): a record the disk cannot take is cut back off and
    raised as DiskFull naming the file, the record's bytes and the free space, so the file never ends torn
    by a write of ours. Also a file object for writers that frame their own records (TensorBoard's)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        with naming_disk_full(self.path, 0):
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o666)

    def append(self, data: bytes) -> None:
        end = os.lseek(self.fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:  # a short write (the disk filled up mid-record) goes on until it raises
                view = view[os.write(self.fd, view):]
        except OSError as e:
            os.ftruncate(self.fd, end)  # the part that fitted goes: the file ends after the record before
            if is_disk_full(e):
                raise DiskFull(self.path, len(data)) from e
            raise

    write = append  # the file-object face (tensorboard's RecordWriter writes one framed record per call)

    def flush(self) -> None:
        """Nothing to do: every append went to the operating system whole."""

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    @property
    def closed(self) -> bool:
        return self.fd < 0


class JsonLinesFile(AppendOnlyFile):
    """A JSON-lines log appended to one whole line at a time. A torn tail (the part of a line that a crash
    left without its newline) is cut off when the file is opened, and named, so the next record never
    continues it."""

    def __init__(self, path: str | os.PathLike, skip_bad: Callable[[str], None] = warn):
        repair_torn_tail(path, skip_bad)
        super().__init__(path)

    def append_record(self, record: object) -> None:
        self.append((json_text(record, self.path) + "\n").encode())


def repair_torn_tail(path: str | os.PathLike, skip_bad: Callable[[str], None] = warn) -> None:
    """Cut the bytes after the last newline of `path` (a line a crash tore), naming them through `skip_bad`."""
    try:
        with open(path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            keep = _end_of_last_line(f, size)
            if keep == size:
                return
            f.truncate(keep)
    except FileNotFoundError:
        return
    skip_bad(f"{path}: its last line was torn ({size - keep:,} bytes without a newline, left by an interrupted "
             "write); cut off before appending")


def _end_of_last_line(f, size: int) -> int:
    """The offset just past the last newline of the open file `f` of `size` bytes (0: none), read from the end."""
    end = size
    while end > 0:
        start = max(0, end - (1 << 16))
        f.seek(start)
        chunk = f.read(end - start)
        if b"\n" in chunk:
            return start + chunk.rfind(b"\n") + 1
        end = start
    return 0


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
