"""Integrity of the outputs, probed through a real server and worker with the commands a user types
(`prefect deployment run ... --param ...`): names stay names and paths stay under `root` (symlinks included),
one writer per output folder at a time and none while a training run reads it, a failed rebuild deletes nothing, the cache re-verifies completeness
markers and keys on the world shape, the scheduled scan survives any bad checkpoint, and the leftovers of a
killed writer are removed at the next start. One server and worker for the module; tests share its artifacts.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.processes import free_port, training_processes, wait_for
from tests.test_pipeline_server import flow_run, flow_run_logs, serving_this_tree, task_states, wait_for_final_state

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
HELLASWAG = REPO / "tests" / "fixtures" / "pipeline" / "hellaswag_mini.jsonl"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_this_tree(tmp_path_factory.mktemp("integrity")) as s:
        yield s


@pytest.fixture(scope="module")
def worker(server):
    proc = server.start_worker("integrity")
    yield proc
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run(server, deployment: str, *params: str, timeout_s: float = 600) -> tuple[str, dict]:
    """Start `deployment` with `--param` for each of `params`, wait for its end; (flow run id, flow run)."""
    flow_run_id = server.run(deployment, *[arg for p in params for arg in ("--param", p)])
    return flow_run_id, wait_for_final_state(server, flow_run_id, timeout_s)


def completed(server, deployment: str, *params: str) -> str:
    flow_run_id, state = run(server, deployment, *params)
    assert state["state"]["type"] == "COMPLETED", (state["state"]["message"], flow_run_logs(server, flow_run_id)[-20:])
    return flow_run_id


def failure(server, flow_run_id: str, state: dict) -> str:
    """The flow run's logs and state message; it must have failed."""
    assert state["state"]["type"] in ("FAILED", "CRASHED"), f"the flow run ended {state['state']['type']}"
    return "\n".join(flow_run_logs(server, flow_run_id)) + state["state"]["message"]


def state_once_logged(server, flow_run_id: str, told: str, timeout_s: float = 300) -> str:
    """The flow run's state type once one of its log lines contains `told`, or once it ended without; "told
    nothing" if neither happened within `timeout_s`."""
    def logged_or_ended() -> bool:
        return (any(told in m for m in flow_run_logs(server, flow_run_id))
                or flow_run(server, flow_run_id)["state"]["type"] not in ("SCHEDULED", "PENDING", "RUNNING"))

    if not wait_for(logged_or_ended, timeout_s):
        return f"told nothing within {timeout_s} s"
    return flow_run(server, flow_run_id)["state"]["type"]


def folder_snapshot(folder: Path) -> dict[str, str]:
    """sha256 of each file in `folder` but its LOCK (whose text names the last writer)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.is_file() and p.name != "LOCK"}


def eval_file_examples(path: Path) -> int:
    return int(np.fromfile(path, dtype="<i4", count=3)[2])


@pytest.fixture(scope="module")
def trained(server, worker) -> Path:
    """The smoke training run (run_name=integrity): its run directory."""
    completed(server, "gpt2-train/smoke", "run_name=integrity")
    (run_dir,) = (server.tree / "artifacts" / "runs" / "integrity").iterdir()
    return run_dir


# ---------------------------------------------------------------------------------------------------------
# data lost, wrong data trained on, writes outside root


def test_a_rebuild_that_fails_deletes_nothing_of_the_dataset(server, worker):
    completed(server, "gpt2-tokenize/smoke", "dataset=wipe")
    shards = server.tree / "artifacts" / "data" / "wipe" / "shards"
    before = folder_snapshot(shards)
    flow_run_id, state = run(server, "gpt2-tokenize/smoke", "dataset=wipe", "shard_size=1000000000000000000")
    failure(server, flow_run_id, state)
    assert folder_snapshot(shards) == before


@pytest.mark.parametrize("param", ["dataset=sm[o]ke", "dataset=*", "run_name=sm?ke"])
def test_a_name_that_is_a_glob_pattern_is_refused_before_any_stage(server, worker, param):
    flow_run_id, state = run(server, "gpt2-tokenize/smoke", param)
    name = param.split("=")[0]
    assert f"{name} must be a plain name" in failure(server, flow_run_id, state)
    assert task_states(server, flow_run_id) == {}


def test_training_reads_the_shards_its_manifest_lists_not_a_pattern(server, worker, trained):
    shards = server.tree / "artifacts" / "data" / "smoke" / "shards"
    stray = shards / "smoke_train_000999.bin"  # a file that matches `smoke_train_*.bin`, listed nowhere
    stray.write_bytes(b"not a shard")
    try:
        completed(server, "gpt2-train/smoke", "run_name=integrity", "max_steps=12")
    finally:
        stray.unlink()


@pytest.mark.parametrize("deployment, name, folder", [
    ("gpt2-train/smoke", "run_name=symrun", "runs/symrun"),
    ("gpt2-tokenize/smoke", "dataset=symdata", "data/symdata"),
])
def test_a_name_whose_folder_is_a_symlink_out_of_root_is_refused(server, worker, tmp_path, deployment, name, folder):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = server.tree / "artifacts" / folder
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(elsewhere)
    try:
        flow_run_id, state = run(server, deployment, name)
        message = failure(server, flow_run_id, state)
        assert f"{name.split('=')[0]}: " in message and "outside" in message and str(elsewhere) in message
        assert task_states(server, flow_run_id) == {}
        assert list(elsewhere.iterdir()) == []
    finally:
        link.unlink()


def test_a_second_writer_of_a_folder_waits_for_its_lock(server, worker):
    completed(server, "gpt2-tokenize/smoke")
    shards = server.tree / "artifacts" / "data" / "smoke" / "shards"
    with open(shards / "LOCK", "a+") as lock:  # another writer holds the folder, as a running build does
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.truncate(0)
        lock.write(json.dumps({"pid": os.getpid(), "host": "probe-host"}))
        lock.flush()
        flow_run_id = server.run("gpt2-tokenize/smoke", "--param", "force=true")
        state = state_once_logged(server, flow_run_id, f"is being written by pid {os.getpid()} on host probe-host")
        assert state == "RUNNING", f"the run did not wait while another writer held {shards}: {state}"
    assert wait_for_final_state(server, flow_run_id)["state"]["type"] == "COMPLETED"
    assert task_states(server, flow_run_id)["tokenize"] == "Completed"


def test_hellaswag_files_of_different_sources_live_in_different_folders(server, worker, tmp_path):
    three = tmp_path / "three.jsonl"
    three.write_text("".join(HELLASWAG.read_text().splitlines(keepends=True)[:3]))
    completed(server, "gpt2-hellaswag/smoke")
    completed(server, "gpt2-hellaswag/smoke", f"hellaswag_source={three}")
    files = sorted((server.tree / "artifacts" / "eval").rglob("hellaswag_val.bin"))
    assert sorted(eval_file_examples(f) for f in files) == [3, 8], files


# ---------------------------------------------------------------------------------------------------------
# stale results served


def test_a_final_checkpoint_without_its_complete_marker_is_not_served_from_cache(server, worker, trained):
    final = sorted((trained / "checkpoints").glob("step_*"))[-1]
    (final / "COMPLETE").rename(trained / "COMPLETE.moved")
    flow_run_id = completed(server, "gpt2-train/smoke", "run_name=integrity")
    assert task_states(server, flow_run_id)["train"] == "Completed"
    assert (final / "COMPLETE").is_file()


def test_another_world_shape_is_not_served_from_cache(server, worker):
    params = ("run_name=world", "batch_size=2")  # 2 x 32 x 2 processes divides the 128 tokens per step
    completed(server, "gpt2-train/smoke", *params)
    rendezvous = json.dumps({"nnodes": 2, "rdzv_endpoint": f"127.0.0.1:{free_port()}"})
    flow_run_id = server.run("gpt2-train/smoke", *[a for p in (*params, f"rendezvous={rendezvous}")
                                                   for a in ("--param", p)])
    started = ("Running", "Completed", "Cached", "Failed", "Crashed")  # past Pending: served or launched
    train = wait_for(lambda: (state := task_states(server, flow_run_id).get("train")) in started and state, 300)
    try:
        assert train == "Running", f"a 2-node run came back {train} from a 1-node run's cache"
    finally:
        server.prefect("flow-run", "cancel", flow_run_id, check=False)  # the old code's run had completed
        wait_for_final_state(server, flow_run_id, 120)


# ---------------------------------------------------------------------------------------------------------
# readers of our own logs


def test_a_bad_line_in_metrics_jsonl_is_named_and_skipped_and_training_completes(server, worker):
    """Before: this line as the 4th of metrics.jsonl made the train stage's progress reader raise
    JSONDecodeError (with two processes, torchrun prints before training rewrites the file, so the stage reads
    it first), and the train task failed on every rerun."""
    params = ("run_name=badline", "nproc=2", "batch_size=2")  # 2 x 32 x 2 processes divides the 128 tokens
    completed(server, "gpt2-train/smoke", *params)
    (metrics,) = (server.tree / "artifacts" / "runs" / "badline").glob("*/metrics.jsonl")
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text("".join(lines[:3] + ['{"step": 2, "kind": "tra\n'] + lines[3:]))
    flow_run_id = completed(server, "gpt2-train/smoke", *params, "force=true")
    assert task_states(server, flow_run_id)["train"] == "Completed"
    assert "metrics.jsonl line 4: not valid JSON" in "\n".join(flow_run_logs(server, flow_run_id))
    assert all(json.loads(line) for line in metrics.read_text().splitlines())  # the resumed session dropped it


# ---------------------------------------------------------------------------------------------------------
# the scheduled scan


def _artifact_rows(server, flow_run_id: str) -> list[dict]:
    request = urllib.request.Request(
        f"{server.env['PREFECT_API_URL']}/artifacts/filter", method="POST", headers={"Content-Type": "application/json"},
        data=json.dumps({"artifacts": {"key": {"any_": ["gpt2-evaluations"]},
                                       "flow_run_id": {"any_": [flow_run_id]}}}).encode())
    with urllib.request.urlopen(request) as response:
        (artifact,) = json.load(response)
    data = artifact["data"]
    return json.loads(data) if isinstance(data, str) else data


def _copy_run(run_dir: Path, dest: Path) -> Path:
    """A copy of a run's config and its newest complete checkpoint (what the scan reads)."""
    final = sorted(p for p in (run_dir / "checkpoints").glob("step_*") if (p / "COMPLETE").is_file())[-1]
    shutil.copytree(final, dest / "checkpoints" / final.name)
    shutil.copy2(run_dir / "config.json", dest / "config.json")
    return dest / "checkpoints" / final.name


def _rewrite_marker(checkpoint: Path, edit) -> None:
    marker = json.loads((checkpoint / "COMPLETE").read_text())
    edit(marker)
    (checkpoint / "COMPLETE").write_text(json.dumps(marker))


def test_the_scheduled_scan_skips_and_reports_each_bad_checkpoint(server, worker, trained, tmp_path):
    runs = server.tree / "artifacts" / "scanned"
    good = _copy_run(trained, runs / "zz-good")  # listed last: every bad one comes first
    malformed = _copy_run(trained, runs / "malformed")
    _rewrite_marker(malformed, lambda m: m.update(files={name: 5 for name in m["files"]}))
    hostname = Path("/etc/hostname")
    escaping = _copy_run(trained, runs / "escaping")
    _rewrite_marker(escaping, lambda m: m["files"].update({str(hostname): {
        "size": hostname.stat().st_size, "sha256": hashlib.sha256(hostname.read_bytes()).hexdigest()}}))
    no_manifest = _copy_run(trained, runs / "no-manifest").parent.parent
    val = tmp_path / "val"
    val.mkdir()
    config = json.loads((no_manifest / "config.json").read_text())
    shards = Path(config["val_data"]).parent
    for shard in shards.glob("*_val_*.bin"):
        shutil.copy2(shard, val / shard.name)
    config["val_data"] = str(val / "smoke_val_000000.bin")
    (no_manifest / "config.json").write_text(json.dumps(config))
    elsewhere = tmp_path / "elsewhere"
    _copy_run(trained, elsewhere)
    (runs / "planted").mkdir()
    shutil.copy2(trained / "config.json", runs / "planted" / "config.json")
    (runs / "planted" / "checkpoints").symlink_to(elsewhere / "checkpoints")

    flow_run_id, state = run(server, "gpt2-evaluate/scheduled", "runs_dir=artifacts/scanned")
    assert state["state"]["type"] == "COMPLETED", (state["state"]["message"], flow_run_logs(server, flow_run_id)[-20:])
    rows = {row["run"]: row for row in _artifact_rows(server, flow_run_id)}
    assert rows["zz-good"]["val_loss"] is not None and not rows["zz-good"]["skipped"]
    assert (runs / "zz-good" / "evaluations" / f"{good.name}.json").is_file()
    for bad, why in (("malformed", "COMPLETE"), ("escaping", str(hostname)), ("no-manifest", "manifest.json"),
                     ("planted", "outside")):
        assert why in rows[bad]["skipped"], rows[bad]
    assert not (elsewhere / "evaluations").exists() and not (elsewhere / "tensorboard").exists()
    assert str(hostname) not in "".join(p.read_text() for p in runs.rglob("evaluations/*.json"))


def test_a_rebuild_of_the_shards_a_training_run_reads_waits_until_training_ends(server, worker):
    """The tokenize stage rerun with another shard_size while a training run reads the dataset: before, it
    replaced the shards under the training run; now it waits, naming the reader, and builds once training ends."""
    train_id = server.run("gpt2-train/smoke", *[a for p in ("dataset=readlock", "run_name=reading", "max_steps=1000000",
                                                            "checkpoint_every=0", "val_every=0") for a in ("--param", p)])
    try:
        assert wait_for(lambda: len(training_processes("reading")) >= 2, 600), "training did not start"
        shards = server.tree / "artifacts" / "data" / "readlock" / "shards"
        before = folder_snapshot(shards)
        rebuild_id = server.run("gpt2-tokenize/smoke", "--param", "dataset=readlock", "--param", "shard_size=4096")
        state = state_once_logged(server, rebuild_id, f"waiting for the lock: {shards.resolve()} is being read by pid ")
        assert state == "RUNNING", f"the rebuild did not wait while training read {shards}: {state}"
        assert folder_snapshot(shards) == before
        assert training_processes("reading"), "training stopped while the rebuild waited"
    finally:
        server.prefect("flow-run", "cancel", train_id, check=False)
    assert wait_for_final_state(server, train_id)["state"]["type"] == "CANCELLED"
    assert wait_for_final_state(server, rebuild_id)["state"]["type"] == "COMPLETED"
    assert folder_snapshot(shards) != before  # rebuilt with 4096 tokens a shard once the reader was gone


# ---------------------------------------------------------------------------------------------------------
# leftovers of a killed writer


def test_a_killed_inits_temporary_folder_is_removed_at_the_next_start(server, worker):
    completed(server, "gpt2-init/smoke")
    (checkpoints,) = (server.tree / "artifacts" / "init").glob("*/checkpoints")
    leftover = checkpoints / ".tmp_step_00000000_424242"  # what a SIGKILL during the write leaves
    leftover.mkdir()
    (leftover / "state.safetensors").write_bytes(os.urandom(1 << 20))
    completed(server, "gpt2-init/smoke", "force=true")
    assert not leftover.exists()
