"""Caching that cannot lie: content-keyed cache keys and records that are re-validated on every read.

A stage's cache key is everything that determines its output:

* its parameters (plain values, hashed as they are),
* the *content* of its inputs: upstream stages pass `StageRecord`s, which hash as the sha256 of the files
  they describe (manifest, shards, checkpoint), never as paths or mtimes; an input that names its content
  only through what it resolves to when the stage runs (a run directory: its newest checkpoint that verifies;
  a source folder: its files) is resolved first, and its content is hashed (`StageCache.resolve`),
* the version of its code: the sha256 of the source files of the modules that compute the output
  (the stage's entry modules and every gpt2/, data/, gpt2_kernels/ module they import).

Before Prefect looks a key up, `StageCache` reads the cached record for it (if any) and checks that the
files it names are still on disk with their recorded content. A deleted or corrupted output makes the
policy drop that record, so the stage runs again instead of returning a record of files that are gone.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

from prefect.cache_policies import CachePolicy
from prefect.context import TaskRunContext
from prefect.filesystems import LocalFileSystem
from prefect.logging import get_logger
from prefect.results import ResultStore
from prefect.utilities.hashing import hash_objects

from common.files import sha256_file

logger = get_logger(__name__)


@dataclass(frozen=True)
class FileRef:
    """A file a stage wrote, with the identity of its content at the time.

    `problem()` checks the size always and the sha256 whenever the file may have been written since the
    hash was taken: i.e. unless its mtime, ctime and inode are all as recorded. The kernel sets ctime on
    every write, truncation, rename onto the path, chmod and utime, and no user tool can set it back (cp -p,
    touch -d and tar restore the mtime only), so an unchanged triple means the bytes were not rewritten
    through the filesystem. What that leaves out is damage below the filesystem (a failing disk); the
    readers that use the data (the loader, checkpoint resume) verify sha256 themselves. It keeps a cache
    check of untouched 10^8-token shards at a stat per file instead of ~0.4 s of hashing per shard.
    """

    path: str
    size: int
    sha256: str
    mtime_ns: int
    ctime_ns: int = 0  # 0 (records written before these were kept): never matches, so the file is hashed
    inode: int = 0

    @classmethod
    def of(cls, path: str | os.PathLike) -> "FileRef":
        return cls.with_sha256(path, sha256_file(path))

    @classmethod
    def with_sha256(cls, path: str | os.PathLike, sha256: str) -> "FileRef":
        """A ref whose hash is already known (e.g. from a verified shard manifest): saves re-reading a large file."""
        stat = os.stat(path)
        return cls(str(Path(path).resolve()), stat.st_size, sha256, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)

    def problem(self) -> str | None:
        """None if the file still holds the recorded content, else what is wrong with it."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return f"{self.path} is missing"
        if stat.st_size != self.size:
            return f"{self.path} has {stat.st_size} bytes, {self.size} were recorded"
        untouched = (stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino) == (self.mtime_ns, self.ctime_ns, self.inode)
        if not untouched and sha256_file(self.path) != self.sha256:
            return f"{self.path} changed since it was written (sha256 differs)"
        return None


@dataclass(frozen=True)
class StageRecord:
    """What a stage returns: small facts about its output plus the files that hold it.

    Subclasses add fields (paths, counts, metrics). `files` are checked when a cached record is read
    and hashed (by content) when the record is the input of another stage.
    """

    files: tuple[FileRef, ...]

    def problem(self) -> str | None:
        return next((p for f in self.files if (p := f.problem())), None)

    def content_digest(self) -> str:
        h = hashlib.sha256(type(self).__name__.encode())
        for f in self.files:
            h.update(f"{f.size}:{f.sha256};".encode())
        return h.hexdigest()


# the packages whose source determines stage outputs; imports of anything else (torch, prefect) are not followed
PROJECT_PACKAGES = ("common", "gpt2", "data", "gpt2_kernels")


def _source_path(name: str) -> Path | None:
    """The source file of a project module, found on disk without importing anything."""
    top, *rest = name.split(".")
    spec = importlib.util.find_spec(top)  # a top-level lookup runs no package code
    if spec is None or not spec.submodule_search_locations:
        return None
    base = Path(next(iter(spec.submodule_search_locations))).joinpath(*rest)
    candidates = [base / "__init__.py"] + ([base.with_suffix(".py")] if rest else [])
    return next((c for c in candidates if c.is_file()), None)


# Concurrently submitted tasks compute their cache keys in parallel threads, and CPython 3.11's AST
# constructor keeps its recursion counter per interpreter: two parses at once can fail with "SystemError: AST
# constructor recursion depth mismatch" (seen here in a pipeline run; python/cpython#106905)
_PARSE_LOCK = threading.Lock()


def _imported_modules(path: Path) -> set[str]:
    """Project modules named by the import statements of a source file (nested ones included)."""
    names = set()
    with _PARSE_LOCK:
        tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return {n for n in names if n.split(".")[0] in PROJECT_PACKAGES and _source_path(n) is not None}


def code_closure(entry_modules: tuple[str, ...]) -> list[str]:
    """`entry_modules` and every project module they import, directly or not, sorted."""
    seen: set[str] = set()
    todo = list(entry_modules)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _source_path(name)
        if path is None:
            raise ModuleNotFoundError(f"stage code module {name!r} not found; fix the stage's code list")
        seen.add(name)
        todo.extend(_imported_modules(path) - seen)
    return sorted(seen)


def code_version(entry_modules: tuple[str, ...]) -> str:
    """sha256 over the source of `entry_modules` and of every project module they import (read from disk,
    never imported), so a stage's code list names only the modules where its work starts."""
    h = hashlib.sha256()
    for name in code_closure(entry_modules):
        h.update(name.encode())
        h.update(_source_path(name).read_bytes())
    return h.hexdigest()


def content_identity(value: Any) -> Any:
    """A hashable stand-in for a task input: records by content, containers element-wise, the rest as is."""
    if isinstance(value, StageRecord):
        return ("record", value.content_digest())
    if is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, [(f.name, content_identity(getattr(value, f.name))) for f in fields(value)])
    if isinstance(value, dict):
        return sorted((str(k), content_identity(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [content_identity(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def stage_key(stage: str, code: tuple[str, ...], inputs: dict[str, Any]) -> str:
    """The cache key of a stage run: its name, its code version and its inputs by content."""
    return hash_objects(stage, code_version(code), content_identity(inputs), raise_on_failure=True)


# what a stage input resolved at run time stands for in its cache key: its content, found when the key is made
Resolver = Callable[[Any], Any]


@dataclass
class StageCache(CachePolicy):
    """Cache key = hash(stage, code version, inputs by content); stale cached records are dropped.

    stage: the stage's name (two stages with equal inputs never share a key).
    code: modules whose source defines the stage's output; editing any of them invalidates the cache.
    ignore: inputs that do not affect the output (e.g. a progress flag).
    resolve: (input name, resolver) for each input that names its content only through what it resolves to
        when the stage runs (a run directory: its newest checkpoint that verifies; a folder: the files in it; a
        file path: its bytes). The key holds what the resolver returns, the content the stage would read now,
        never the name: a run directory that gained a checkpoint is another key. A value of None is not resolved.
    """

    stage: str = ""
    code: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    resolve: tuple[tuple[str, Resolver], ...] = ()

    def compute_key(
        self, task_ctx: TaskRunContext, inputs: dict[str, Any], flow_parameters: dict[str, Any], **kwargs: Any
    ) -> str | None:
        kept = {k: v for k, v in inputs.items() if k not in self.ignore}
        try:
            keyed = self.key_inputs(kept)
        except Exception as e:  # the stage meets the same error and fails with its own message
            logger.warning("stage %s: an input cannot be resolved for the cache key (%s: %s); running uncached",
                           self.stage, type(e).__name__, e)
            return None
        key = stage_key(self.stage, self.code, keyed)
        return key if self._drop_if_stale(task_ctx, key) else None

    def key_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """What of the task's inputs the key hashes: each input named in `resolve` replaced by what it resolves to
        now. (A stage whose settings resolve to something else, such as train's world shape, extends this.)"""
        resolvers = dict(self.resolve)
        return {name: ("resolved", resolvers[name](value)) if name in resolvers and value is not None else value
                for name, value in inputs.items()}

    def _drop_if_stale(self, task_ctx: TaskRunContext, key: str) -> bool:
        """Validate the record cached under `key`; delete it if its files changed. False: cannot cache.

        Prefect treats any stored record as a hit (its lookup is `ResultStore.exists`, which reads storage),
        so a stale one must be removed from storage before the lookup. Only public API is used: the record
        is read through a ResultStore of our own that keeps no in-memory copy, and the run's store forgets
        any copy it holds (its `cache` field, matched by the record's storage key).
        """
        store = task_ctx.result_store
        if not store.exists(key):
            return True
        reader = ResultStore(result_storage=store.result_storage, metadata_storage=store.metadata_storage,
                             serializer=store.serializer, cache_result_in_memory=False)
        try:
            record = reader.read(key).result
            problem = record.problem() if isinstance(record, StageRecord) else "not a StageRecord"
        except Exception as e:  # unreadable (e.g. written by an older record class): recompute
            problem = f"cached record unreadable ({type(e).__name__}: {e})"
        if problem is None:
            return True
        storage = store.metadata_storage or store.result_storage
        if not isinstance(storage, LocalFileSystem):
            logger.warning("stage %s: cached output is stale (%s) and %s cannot delete it; running uncached",
                           self.stage, problem, type(storage).__name__)
            return False
        logger.warning("stage %s: cached output is stale (%s); recomputing", self.stage, problem)
        Path(storage.basepath or ".").expanduser().joinpath(key).unlink(missing_ok=True)
        for cached_key, cached in list(store.cache.items()):
            if cached.metadata.storage_key == key:
                store.cache.pop(cached_key, None)
        return True
