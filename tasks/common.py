"""Small helpers shared by the stage tasks: log forwarding, child-process commands, artifact keys, the locks a
stage holds on the folder it writes and on the folders it reads."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ContextManager, Protocol

from prefect import get_run_logger

from common.locks import folder_lock, folder_read_lock


def artifact_key(*parts: str, folder: str | os.PathLike | None = None) -> str:
    """The Prefect artifact key of `parts` joined by dashes, for an artifact about `folder` (a run, a dataset's
    shards, an eval file's folder) where one is given. Keys hold lowercase letters, digits and dashes only, so
    other characters become dashes. Eight hex digits of a digest follow where that changed anything, so that names
    the key could not tell apart ("Run_1", "run-1") keep keys of their own; and always for a folder, the digest then
    covering its absolute path too, so that folders of one name under two roots on one server keep theirs."""
    joined = "-".join(parts)
    key = re.sub(r"[^a-z0-9]+", "-", joined.lower()).strip("-")
    identity = [*parts] if folder is None else [*parts, str(Path(folder).resolve())]
    if key != joined or folder is not None:
        key += "-" + hashlib.sha256("\0".join(identity).encode()).hexdigest()[:8]
    return key


def run_artifact_key(kind: str, run_dir: Path) -> str:
    """The key of a run directory's artifact (`root/runs/<run name>/<run id>`): `<kind>-<run name>-<run id>-<digest>`.
    The run id hashes what determines the training, not the run's name or root: two run names trained with the same
    settings share it, each in its own folder, and keyed on the id alone one run's artifact would become a newer
    version of the other run's."""
    return artifact_key(kind, run_dir.parent.name, run_dir.name, folder=run_dir)


def log_lines() -> Callable[[str], None]:
    """A line callback (for `run_streaming`) that logs each non-blank line of a child process to the task run."""
    logger = get_run_logger()
    return lambda line: logger.info(line) if line.strip() else None


def python_module(module: str, args: list[str]) -> list[str]:
    """The command that runs `python -m module args...` with this interpreter."""
    return [sys.executable, "-m", module, *args]


class ReadInput(Protocol):
    """A stage's output another stage reads (DocumentsRecord, ShardsRecord, EvalFileRecord, WeightsRecord)."""

    @property
    def folder(self) -> Path | None:  # the folder the stage that made it writes under its lock; None: no stage does
        ...


@contextlib.contextmanager
def reading(*inputs: ReadInput | None) -> Iterator[None]:
    """Hold the read lock (common.locks.folder_read_lock) of each input's folder (another stage's output:
    downloaded documents, shards, HellaSwag file; None for an input not given) while a stage reads it: a rerun of
    the stage that writes it waits until the reading is done, logging who reads; a writer holding one is waited
    for, and the wait is logged. An input no stage writes (a local corpus) is read without a lock."""
    with contextlib.ExitStack() as held:
        folders = (i.folder for i in inputs if i is not None)
        for folder in dict.fromkeys(f for f in folders if f is not None):  # each once, in the order given
            held.enter_context(folder_read_lock(folder, on_wait=get_run_logger().warning))
        yield


def writing(folder: str | os.PathLike) -> ContextManager[Path]:
    """Hold `folder`'s writer lock (common.locks) for a stage's write: a run already writing it is waited for,
    and the wait is logged naming that writer (pid, host) and the folder. (A run directory's lock:
    gpt2.run_dir.RunDir.lock, with the same semantics.)"""
    return folder_lock(folder, wait=True, on_wait=get_run_logger().warning)
