"""One writer per output folder: every writer holds the folder's lock (an flock on its LOCK file) for the
whole write.

The kernel releases an flock when its holder dies however it dies (SIGKILL included), so a lock left by a
killed writer is simply taken by the next one; the file's text only names the holder (pid, host) for the
messages. A second writer either waits (the pipeline's stages: the wait is logged with the holder named) or
is refused with FolderLocked naming the holder (a training run's directory).

Holding the lock is also what makes leftovers safe to remove: nobody else writes the folder, so the
temporary files and folders a killed writer left there are deleted as soon as the lock is taken.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from common.files import remove_stale_tmp_dirs, remove_stale_tmp_files

LOCK_FILE = "LOCK"
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
    lock_file = folder / LOCK_FILE
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # a planted link is an error, not followed
    try:
        _acquire(fd, folder, lock_file, wait, on_wait)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)
        for place in [folder] if leftovers_in is None else leftovers_in:
            remove_stale_tmp_dirs(place)
            remove_stale_tmp_files(place)
        yield folder
    finally:
        os.close(fd)  # releases the flock


def _acquire(fd: int, folder: Path, lock_file: Path, wait: bool, on_wait: Callable[[str], None] | None) -> None:
    told = False
    while not _try_lock(fd):
        held = f"{folder} is being written by {_holder(fd)} (lock {lock_file})"
        if not wait:
            raise FolderLocked(f"{held}; wait for that writer to end or stop it, or write somewhere else")
        if on_wait and not told:
            on_wait(f"waiting for the lock: {held}")
            told = True
        time.sleep(WAIT_POLL_S)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
            raise
        return False


def _holder(fd: int) -> str:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        holder = {}
    if not isinstance(holder, dict):
        holder = {}
    return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
