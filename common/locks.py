"""One writer per output folder: every writer holds the folder's lock (an flock on its LOCK file) for the
whole write.

The kernel releases an flock when its holder dies however it dies (SIGKILL included), so a lock left by a
killed writer is simply taken by the next one; the file's text only names the holder (pid, host) for the
messages. A second writer either waits (the pipeline's stages: the wait is logged with the holder named) or
is refused with FolderLocked naming the holder (a training run's directory).

Holding the lock is also what makes leftovers safe to remove: nobody else writes the folder, so the
temporary files and folders a killed writer left there are deleted as soon as the lock is taken.

A stage that reads another's output (training and evaluation read shards and the HellaSwag file) holds the
same lock shared (`folder_read_lock`): readers do not exclude each other, a writer waits until the last reader
is done, and a reader waits for a writer, so a stage rerun with force=true never rewrites files a training
run is reading. Each reader also holds a file of its own in `LOCK.readers/`, which is how a waiting writer
names it.

The LOCK file is only ever opened for writing as a regular file with one link (`_hold_lock_file`, which every
taker goes through): a hard or symbolic link planted under that name, or a FIFO, is replaced by a new empty
file renamed over it, so the file it leads to is never written.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import stat
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from common.files import remove_stale_tmp_dirs, remove_stale_tmp_files

LOCK_FILE = "LOCK"
READERS = "LOCK.readers"  # one file per reader (host.pid.uuid), flocked by it while it reads
WAIT_POLL_S = 1.0  # how often a waiting writer tries the lock again


class FolderLocked(RuntimeError):
    """Another process is writing this folder; the message names it (pid, host), the folder and the lock file."""


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, wait: bool = False, on_wait: Callable[[str], None] | None = None,
                leftovers_in: Iterable[str | os.PathLike] | None = None) -> Iterator[Path]:
    """Hold `folder`'s writer lock for the block (the folder is created if missing); yields the folder.

    Held by another process: with `wait`, `on_wait` gets one message naming the holder and the block runs
    once the lock is free; without, FolderLocked naming the holder. Once held, the temporary files (`*.tmp`)
    and folders (`.tmp_*`) of interrupted writes are removed from `leftovers_in` (default: the folder).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fd = _hold_lock_file(folder, fcntl.LOCK_EX, wait, on_wait)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_me()).encode(), 0)
        shutil.rmtree(folder / READERS, ignore_errors=True)  # no reader holds the lock now: all of them are gone
        for place in [folder] if leftovers_in is None else leftovers_in:
            remove_stale_tmp_dirs(place)
            remove_stale_tmp_files(place)
        yield folder
    finally:
        os.close(fd)  # releases the flock


@contextlib.contextmanager
def folder_read_lock(folder: str | os.PathLike, on_wait: Callable[[str], None] | None = None) -> Iterator[Path]:
    """Hold `folder`'s lock shared for the block, while reading what a writer made there; yields the folder.

    A writer holding it is waited for (`on_wait` gets one message naming it); other readers are not. A folder
    that cannot be written (a read-only mount) has no writer to exclude, and one that does not exist nothing to
    protect: the block runs without a lock (and the reader's own checks report a missing file).
    """
    folder = Path(folder)
    try:
        fd = _hold_lock_file(folder, fcntl.LOCK_SH, wait=True, on_wait=on_wait)
    except OSError as e:
        if e.errno not in (errno.EROFS, errno.EACCES, errno.ENOENT):
            raise
        fd = None
    if fd is None:
        yield folder
        return
    try:
        (folder / READERS).mkdir(exist_ok=True)
        me = folder / READERS / f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        reader_fd = os.open(me, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)  # a new file, never a link
        try:
            fcntl.flock(reader_fd, fcntl.LOCK_EX)  # alive while held: how a writer tells it from a killed reader's
            os.pwrite(reader_fd, json.dumps(_me()).encode(), 0)
            yield folder
        finally:
            me.unlink(missing_ok=True)
            os.close(reader_fd)
    finally:
        os.close(fd)


def _hold_lock_file(folder: Path, mode: int, wait: bool, on_wait: Callable[[str], None] | None) -> int:
    """A descriptor of `folder`'s LOCK holding its flock in `mode` (LOCK_EX or LOCK_SH), waiting or refused as
    `_acquire` says; the file is, once held, a regular file with one link, still under the name LOCK.

    Anything else under that name is replaced by a new empty file (`_replace_lock_file`): a symbolic link or a
    FIFO at once (no writer can hold one), a hard link once its lock is held exclusively, because it may be
    the lock a writer holds that someone linked elsewhere since: replaced under that writer, it would let a
    second writer in. A taker that finds its file replaced while it waited lets it go and takes the new one.
    """
    lock_file = folder / LOCK_FILE
    while True:
        fd = _open_lock_file(lock_file)
        if fd is None:
            _replace_lock_file(lock_file)
            continue
        try:
            plain = _is_lock_file(os.fstat(fd))
            _acquire(fd, mode if plain else fcntl.LOCK_EX, folder, lock_file, wait, on_wait)
            if _still_named(lock_file, fd):
                if _is_lock_file(os.fstat(fd)):
                    return fd
                if not plain:  # held exclusively: whoever held it has finished
                    _replace_lock_file(lock_file)
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # replaced, or linked elsewhere while held shared: take what is under the name now


def _open_lock_file(lock_file: Path) -> int | None:
    """`lock_file` opened for reading and writing (created if missing), never through a symbolic link; None
    where the name holds what no writer can hold: a symbolic link, a FIFO or device, or a hard link to a
    file this process may not write. A directory there is refused, naming it."""
    try:
        found = os.lstat(lock_file)
    except FileNotFoundError:
        found = None
    if found is not None and stat.S_ISDIR(found.st_mode):
        raise IsADirectoryError(errno.EISDIR, f"{lock_file} is a directory, not a lock file; remove it (the folder's "
                                "writers create their lock file there)", str(lock_file))
    if found is not None and not stat.S_ISREG(found.st_mode):
        return None
    try:
        return os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:  # a symbolic link planted since the lstat
            return None
        if e.errno in (errno.EACCES, errno.EPERM) and found is not None and found.st_nlink > 1:
            return None
        raise


def _is_lock_file(found: os.stat_result) -> bool:
    """A regular file with one link: writing it changes no other file."""
    return stat.S_ISREG(found.st_mode) and found.st_nlink == 1


def _still_named(lock_file: Path, fd: int) -> bool:
    """Whether `lock_file` still names the file open as `fd` (not replaced, removed or renamed meanwhile)."""
    try:
        named = os.lstat(lock_file)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _replace_lock_file(lock_file: Path) -> None:
    """Rename a new empty file over `lock_file`: whatever was there leaves the name, and what it led to is
    neither opened nor written. The new file is made beside it (a `*.tmp` name, removed by the next holder if
    this process dies before the rename)."""
    new = lock_file.with_name(f"{lock_file.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    os.close(os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
    try:
        os.replace(new, lock_file)
    except BaseException:
        new.unlink(missing_ok=True)
        raise


def _acquire(fd: int, mode: int, folder: Path, lock_file: Path, wait: bool,
             on_wait: Callable[[str], None] | None) -> None:
    told = False
    while not _try_lock(fd, mode):
        role, holders = _holders(fd, folder)
        held = f"{folder} is being {holders} (lock {lock_file})"
        if not wait:
            raise FolderLocked(f"{held}; wait for that {role} to end or stop it, or write somewhere else")
        if on_wait and not told:
            on_wait(f"waiting for the lock: {held}")
            told = True
        time.sleep(WAIT_POLL_S)


def _try_lock(fd: int, mode: int) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return True
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
            raise
        return False


def _me() -> dict[str, object]:
    return {"pid": os.getpid(), "host": socket.gethostname()}


def _holders(fd: int, folder: Path) -> tuple[str, str]:
    """("writer", "written by pid P on host H"), or ("reader", "read by pid P on host H" and how many more)."""
    readers = _live_readers(folder)
    if readers:
        more = f" and {len(readers) - 1} more reader(s)" if len(readers) > 1 else ""
        return "reader", f"read by {readers[0]}{more}"
    return "writer", f"written by {_named(os.pread(fd, 4096, 0))}"


def _live_readers(folder: Path) -> list[str]:
    """The readers whose file in READERS is still locked (a killed reader's lock went with it)."""
    live = []
    for path in sorted((folder / READERS).glob("*")):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue  # gone since the listing, or not a reader's file
        try:
            if not _try_lock(fd, fcntl.LOCK_SH):
                live.append(_named(os.pread(fd, 4096, 0)))
        finally:
            os.close(fd)
    return live


def _named(text: bytes) -> str:
    try:
        holder = json.loads(text or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        holder = {}
    if not isinstance(holder, dict):
        holder = {}
    return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
