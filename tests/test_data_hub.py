"""The hub path over HTTP: `python -m data.fineweb` against a local hub replica, through the real clients.

The replica (tests/fixtures/hub_replica.py) serves a repository laid out like HuggingFaceFW/fineweb through the
hub's endpoints; the command reaches it by HF_ENDPOINT, as it would reach huggingface.co. Each test breaks one
promise of docs/data.md on purpose: an interruption at a random byte (SIGKILL), a 5xx, a reset connection, a
slow response, a short body, corrupted bytes, a branch that moves during the download, an unknown revision.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.fixtures.hub_replica import HubReplica, fineweb_like
from tests.fixtures.processes import wait_for

REPO = Path(__file__).resolve().parent.parent
DATASET = "HuggingFaceFW/fineweb"
CONFIG_FILES = "sample/10BT/*.parquet"


@pytest.fixture
def hub():
    replica = HubReplica()
    replica.old, replica.main = fineweb_like(replica)
    replica.start()
    yield replica
    replica.stop()


def hub_env(replica: HubReplica, home: Path, **extra: str) -> dict[str, str]:
    """The environment of a user whose HF_ENDPOINT is the replica (and whose hub cache is fresh)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_ENDPOINT=replica.url, HF_HOME=str(home), HF_HUB_DISABLE_TELEMETRY="1", **extra)
    return env


def download_args(out: Path, *extra: str) -> list[str]:
    """The documented command: python -m data.fineweb --source HuggingFaceFW/fineweb --config sample-10BT --out ..."""
    return [sys.executable, "-m", "data.fineweb", "--source", DATASET, "--config", "sample-10BT", "--out", str(out),
            *extra]


def run_download(replica: HubReplica, tmp_path: Path, out: Path, *extra: str, check: bool = True,
                 **env: str) -> subprocess.CompletedProcess:
    result = subprocess.run(download_args(out, *extra), cwd=REPO, env=hub_env(replica, tmp_path / "hf-home", **env),
                            capture_output=True, text=True, timeout=300)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def repo_files(replica: HubReplica, sha: str) -> dict[str, bytes]:
    """The config's parquet files at commit `sha`, by path, in the hub's (sorted) order."""
    files = replica.repos[DATASET].commits[sha].files
    return {p: files[p] for p in sorted(files) if Path(p).match(CONFIG_FILES)}


def texts_of(files: dict[str, bytes], tmp_path: Path) -> list[str]:
    texts = []
    for i, data in enumerate(files.values()):
        (tmp_path / f"expected_{i}.parquet").write_bytes(data)
        texts += pq.read_table(tmp_path / f"expected_{i}.parquet", columns=["text"]).column(0).to_pylist()
    return texts


def documents(out: Path) -> list[str]:
    from data.fineweb import iter_documents

    return list(iter_documents(out))


def data_bytes_served(replica: HubReplica) -> int:
    return sum(n for path, n in replica.bytes_served.items() if path.endswith(".parquet"))


def on_disk(out: Path, index: int) -> int:
    """Bytes of the config's file `index` (part_NNNNN.parquet) in `out`, whole or partial."""
    return sum(f.stat().st_size for f in out.glob(f"part_{index:05d}.parquet*") if f.is_file())


def assert_complete(replica: HubReplica, out: Path, sha: str, tmp_path: Path) -> dict:
    """The folder holds the config's files at `sha`, byte for byte, and its manifest says so."""
    files = repo_files(replica, sha)
    assert documents(out) == texts_of(files, tmp_path)
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["hub"], manifest["config"], manifest["revision"]) == (DATASET, "sample-10BT", sha)
    assert [(f["path"], f["sha256"], f["size"]) for f in manifest["files"]] == [
        (p, hashlib.sha256(b).hexdigest(), len(b)) for p, b in files.items()]
    return manifest


# ---------------------------------------------------------------------------------------------------------
# a clean download, parallel, pinned, verified


def test_a_clean_download_fetches_each_file_once_in_parallel_and_records_revision_and_sha256(hub, tmp_path):
    for path in repo_files(hub, hub.main):  # slow enough that the files are on the wire together
        hub.inject("slow", path, delay_s=0.5)
    out = tmp_path / "raw"
    run_download(hub, tmp_path, out)
    assert_complete(hub, out, hub.main, tmp_path)
    files = repo_files(hub, hub.main)
    assert dict(hub.bytes_served) == {**{p: len(b) for p, b in files.items()}, "README.md": len(
        hub.repos[DATASET].commits[hub.main].files["README.md"])}  # each file once; no other config's files
    assert hub.most_concurrent_files >= 2, "the files came down one after the other"

    hub.reset_counts()
    run_download(hub, tmp_path, out)  # finished and intact: nothing is fetched again
    assert data_bytes_served(hub) == 0


def test_every_request_names_the_commit_the_revision_resolved_to_even_when_the_branch_moves(hub, tmp_path):
    """The branch `main` moves to a new commit while the download runs: it still completes from the first one."""
    first = repo_files(hub, hub.main)
    stalled = list(first)[2]
    hub.inject("stall", stalled, after_bytes=1000, delay_s=3)
    proc = subprocess.Popen(download_args(tmp_path / "raw"), cwd=REPO, env=hub_env(hub, tmp_path / "hf-home"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: hub.bytes_served[stalled] >= 1000, 120), "the download never reached the stalled file"
    moved = hub.add_commit(DATASET, {**hub.repos[DATASET].commits[hub.main].files,
                                     "sample/10BT/000_00000.parquet": b"replaced on main"})
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    assert_complete(hub, tmp_path / "raw", hub.main, tmp_path)
    after_first = [path for _, path, _ in hub.requests[1:]]
    assert all(hub.main in path for path in after_first), f"a request not pinned to {hub.main}: {after_first}"
    assert not any(moved in path for _, path, _ in hub.requests)


def test_a_revision_pin_downloads_that_commit_and_is_recorded(hub, tmp_path):
    out = tmp_path / "raw"
    run_download(hub, tmp_path, out, "--revision", hub.old)
    assert_complete(hub, out, hub.old, tmp_path)
    assert all(hub.old in path for _, path, _ in hub.requests)


def test_an_unknown_revision_is_a_named_error_and_not_retried(hub, tmp_path):
    result = run_download(hub, tmp_path, tmp_path / "raw", "--revision", "no-such-branch", check=False)
    assert result.returncode != 0
    assert "HuggingFaceFW/fineweb: the hub dataset has no revision 'no-such-branch'" in result.stderr
    assert len(hub.requests) == 1


def test_limit_fetches_only_the_files_that_hold_those_documents(hub, tmp_path):
    files = repo_files(hub, hub.main)
    out = tmp_path / "raw"
    run_download(hub, tmp_path, out, "--limit", "350")  # 300 documents per file: the first two files
    assert {p for p in hub.bytes_served if p.endswith(".parquet")} == set(list(files)[:2])
    manifest = json.loads((out / "manifest.json").read_text())
    assert [f["path"] for f in manifest["files"]] == list(files)[:2] and manifest["limit"] == 350
    from data.fineweb import iter_documents

    assert list(iter_documents(out, limit=350)) == texts_of(files, tmp_path)[:350]


# ---------------------------------------------------------------------------------------------------------
# interrupted at a random byte: the rerun fetches only what is missing


def test_a_download_killed_at_a_random_byte_resumes_fetching_only_the_missing_bytes(tmp_path):
    replica = HubReplica()
    _, main = fineweb_like(replica, large_file_bytes=24 << 20)  # one file of 24 MB: partial files reach the disk
    replica.start()
    try:
        files = repo_files(replica, main)
        large = max(files, key=lambda p: len(files[p]))
        large_index = list(files).index(large)
        cut = random.Random(os.getpid()).randrange(11 << 20, len(files[large]) - (1 << 20))
        replica.inject("stall", large, after_bytes=cut, delay_s=600)
        out = tmp_path / "raw"
        proc = subprocess.Popen(download_args(out), cwd=REPO, env=hub_env(replica, tmp_path / "hf-home"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_for(lambda: replica.bytes_served[large] >= cut, 120), "the download never reached the cut"
        wait_for(lambda: all(replica.bytes_served[p] == len(b) for p, b in files.items() if p != large), 60)
        # Bytes the replica sent may still sit in socket buffers: kill once the client has written some to disk.
        assert wait_for(lambda: on_disk(out, large_index) >= 10 << 20, 120), f"{large}: no 10 MB on disk"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        kept = sum(f.stat().st_size for f in out.rglob("*") if f.is_file() and not f.name.endswith(".json"))

        replica.reset_counts()
        replica.faults.clear()
        run_download(replica, tmp_path, out)
        assert data_bytes_served(replica) == sum(map(len, files.values())) - kept
        assert_complete(replica, out, main, tmp_path)
    finally:
        replica.stop()


def test_a_download_killed_after_a_files_last_byte_checks_it_without_fetching_it_again(hub, tmp_path):
    out = tmp_path / "raw"
    run_download(hub, tmp_path, out)
    done = out / "part_00001.parquet"  # killed between its last byte's write and its check: the partial is whole
    done.rename(done.with_name(done.name + ".partial"))
    (out / "manifest.json").unlink()

    hub.reset_counts()
    run_download(hub, tmp_path, out)
    assert_complete(hub, out, hub.main, tmp_path)
    assert data_bytes_served(hub) == 0


# ---------------------------------------------------------------------------------------------------------
# faults: transient ones are retried (a partial file resumes), the others are named


@pytest.mark.parametrize("fault", [
    dict(kind="status", status=503),
    dict(kind="status", status=500, times=2),
    dict(kind="reset", after_bytes=20_000),
    dict(kind="short", after_bytes=30_000),
    dict(kind="slow", delay_s=6),  # past HF_HUB_DOWNLOAD_TIMEOUT=2: a read timeout, retried
], ids=["503", "500-twice", "reset-mid-file", "short-body", "slow-past-timeout"])
def test_a_transient_fault_is_retried_and_the_download_completes(hub, tmp_path, fault):
    target = list(repo_files(hub, hub.main))[1]
    hub.inject(path=target, **fault)
    out = tmp_path / "raw"
    run_download(hub, tmp_path, out, HF_HUB_DOWNLOAD_TIMEOUT="2")
    assert_complete(hub, out, hub.main, tmp_path)
    assert not [f for f in hub.faults if f.times > 0], "the fault was never hit"


def test_a_5xx_from_the_hub_api_is_retried(hub, tmp_path):
    hub.inject("status", f"/api/datasets/{DATASET}", status=502)  # the commit lookup
    hub.inject("status", "/api/datasets/*/tree/*", status=503)
    out = tmp_path / "raw"
    run_download(hub, tmp_path, out)
    assert_complete(hub, out, hub.main, tmp_path)
    assert not [f for f in hub.faults if f.times > 0], "a fault was never hit"


def test_a_file_that_keeps_failing_is_named_and_its_partial_bytes_are_kept(hub, tmp_path):
    target = list(repo_files(hub, hub.main))[1]
    hub.inject("reset", target, times=100, after_bytes=20_000)
    out = tmp_path / "raw"
    result = run_download(hub, tmp_path, out, check=False)
    assert result.returncode != 0
    assert target in result.stderr and "rerun the same command to resume" in result.stderr
    assert not (out / "manifest.json").exists()
    kept = sum(f.stat().st_size for f in out.glob("*.partial"))

    hub.faults.clear()
    hub.reset_counts()
    run_download(hub, tmp_path, out)
    assert_complete(hub, out, hub.main, tmp_path)
    assert data_bytes_served(hub) == len(repo_files(hub, hub.main)[target]) - kept  # only that file's missing bytes


def test_a_file_the_hub_refuses_is_a_named_error_and_not_retried(hub, tmp_path):
    target = list(repo_files(hub, hub.main))[2]
    hub.inject("status", target, times=100, status=403)
    result = run_download(hub, tmp_path, tmp_path / "raw", check=False)
    assert result.returncode != 0 and target in result.stderr and "403" in result.stderr
    assert sum(1 for method, path, _ in hub.requests if method == "GET" and path.endswith(target)) == 1


def test_a_corrupted_file_is_caught_by_its_sha256_and_fetched_again(hub, tmp_path):
    target = list(repo_files(hub, hub.main))[0]
    hub.inject("corrupt", target)
    out = tmp_path / "raw"
    run_download(hub, tmp_path, out)
    assert_complete(hub, out, hub.main, tmp_path)
    assert hub.bytes_served[target] == 2 * len(repo_files(hub, hub.main)[target])


def test_a_file_that_never_matches_its_sha256_is_named(hub, tmp_path):
    target = list(repo_files(hub, hub.main))[0]
    hub.inject("corrupt", target, times=100)
    out = tmp_path / "raw"
    result = run_download(hub, tmp_path, out, check=False)
    assert result.returncode != 0
    expected = hashlib.sha256(repo_files(hub, hub.main)[target]).hexdigest()
    assert target in result.stderr and expected in result.stderr
    assert not (out / "manifest.json").exists()


def test_a_file_damaged_on_disk_after_the_download_is_fetched_again_alone(hub, tmp_path):
    out = tmp_path / "raw"
    run_download(hub, tmp_path, out)
    manifest = json.loads((out / "manifest.json").read_text())
    damaged = out / manifest["files"][1]["file"]
    data = bytearray(damaged.read_bytes())
    data[100] ^= 0xFF
    damaged.write_bytes(bytes(data))  # same size
    hub.reset_counts()
    run_download(hub, tmp_path, out)
    assert {p for p in hub.bytes_served if p.endswith(".parquet")} == {manifest["files"][1]["path"]}
    assert_complete(hub, out, hub.main, tmp_path)


def test_a_rerun_keeps_the_recorded_commit_without_asking_the_hub_for_it(hub, tmp_path, monkeypatch):
    """A damaged file of a finished download is fetched again from the recorded commit, not the branch's newest."""
    import huggingface_hub

    from data import fineweb
    from tests.fixtures.hub_replica import point_clients_at

    point_clients_at(hub.url, monkeypatch)
    out = fineweb.download(DATASET, "sample-10BT", tmp_path / "raw")
    hub.add_commit(DATASET, {"README.md": hub.repos[DATASET].commits[hub.main].files["README.md"]})  # main moves
    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", lambda *a, **k: pytest.fail("asked the hub"))
    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_tree", lambda *a, **k: pytest.fail("asked the hub"))
    (out / "part_00002.parquet").unlink()
    hub.reset_counts()
    fineweb.download(DATASET, "sample-10BT", out)
    assert [path.split("/resolve/")[1] for _, path, _ in hub.requests] == [
        f"{hub.main}/{list(repo_files(hub, hub.main))[2]}"]
    assert_complete(hub, out, hub.main, tmp_path)


def test_a_folder_of_another_revision_is_refused_naming_the_difference_or_replaced(hub, tmp_path):
    out = tmp_path / "raw"
    run_download(hub, tmp_path, out, "--revision", hub.old)
    result = run_download(hub, tmp_path, out, check=False)
    assert result.returncode != 0
    assert f"requested_revision: recorded {hub.old!r}, requested None" in result.stderr and "--replace" in result.stderr
    run_download(hub, tmp_path, out, "--replace")
    assert_complete(hub, out, hub.main, tmp_path)


# ---------------------------------------------------------------------------------------------------------
# the streaming path (data.shards --source HuggingFaceFW/...) reads the pinned revision through `datasets`


def test_streaming_through_datasets_reads_the_pinned_revision(hub, tmp_path):
    code = ("from data.fineweb import iter_documents; import json, sys; "
            f"print(json.dumps(list(iter_documents({DATASET!r}, 'sample-10BT', 5, revision={hub.old!r}))))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=hub_env(hub, tmp_path / "hf-home"),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout) == texts_of(repo_files(hub, hub.old), tmp_path)[:5]
    assert not any(hub.main in path or "/main/" in path for _, path, _ in hub.requests)
