"""The cache check of tasks/cache.py without a server: what FileRef verifies, and the Prefect result-store
behaviour (public API only) that dropping a stale record relies on."""

from __future__ import annotations

import os
import types

import pytest

from tasks.cache import FileRef, StageCache, StageRecord


def test_a_same_size_overwrite_with_its_mtime_put_back_is_still_caught(tmp_path):
    path = tmp_path / "shard.bin"
    path.write_bytes(b"a" * 100)
    ref = FileRef.of(path)
    path.write_bytes(b"b" * 100)
    os.utime(path, ns=(ref.mtime_ns, ref.mtime_ns))  # as `cp -p` or `touch -d` of the old time would
    assert os.stat(path).st_mtime_ns == ref.mtime_ns and os.stat(path).st_size == ref.size
    assert "sha256 differs" in ref.problem()


def test_a_file_replaced_by_rename_is_hashed_and_an_identical_copy_is_valid(tmp_path):
    path, other = tmp_path / "f", tmp_path / "g"
    path.write_bytes(b"same")
    ref = FileRef.of(path)
    other.write_bytes(b"same")
    os.replace(other, path)  # new inode: hashed, and the content is what was recorded
    assert ref.problem() is None
    other.write_bytes(b"diff")
    os.utime(other, ns=(ref.mtime_ns, ref.mtime_ns))
    os.replace(other, path)
    assert "sha256 differs" in ref.problem()


@pytest.fixture
def store(tmp_path):
    from prefect.filesystems import LocalFileSystem
    from prefect.results import ResultStore

    return ResultStore(result_storage=LocalFileSystem(basepath=str(tmp_path / "results")))


def test_prefects_lookup_reads_storage_not_the_stores_memory(store, tmp_path):
    """StageCache relies on this: `ResultStore.exists` (Prefect's cache lookup) consults storage, so a record
    deleted from storage is a miss even while a store still holds it in memory."""
    data = tmp_path / "out.bin"
    data.write_bytes(b"x")
    store.write(StageRecord(files=(FileRef.of(data),)), key="k")
    assert store.read("k").result.files[0].sha256 == FileRef.of(data).sha256  # now in the store's memory too
    (tmp_path / "results" / "k").unlink()
    assert not store.exists("k")


def test_a_stale_record_is_dropped_from_storage_and_from_the_stores_memory(store, tmp_path):
    data = tmp_path / "out.bin"
    data.write_bytes(b"x" * 10)
    store.write(StageRecord(files=(FileRef.of(data),)), key="k")
    store.read("k")
    policy = StageCache(stage="t")
    context = types.SimpleNamespace(result_store=store)  # the one TaskRunContext field the check uses

    assert policy._drop_if_stale(context, "k") and store.exists("k")  # valid: kept
    data.write_bytes(b"y" * 10)
    assert policy._drop_if_stale(context, "k")
    assert not store.exists("k")
    assert not [r for r in store.cache.values() if r.metadata.storage_key == "k"]
