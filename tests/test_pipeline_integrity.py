"""Integrity of the outputs, probed through a real server and worker with the commands a user types
(`prefect deployment run ... --param ...`): names stay names and paths stay under `root` (symlinks included),
one writer per output folder at a time and none while a training run reads it, a failed rebuild deletes nothing, the cache re-verifies completeness
markers and keys on what inputs resolve to (the world shape, a run directory's newest checkpoint), the scheduled
scan survives any bad checkpoint and files a result only under the run whose data it came from, and the leftovers
of a killed writer are removed at the next start. The suite's shared server and worker; tests share its artifacts.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tasks.common import run_artifact_key
from tests.fixtures.processes import free_port, lower_priority, training_processes, wait_for
from tests.fixtures.deployed import (Started, flow_run, flow_run_logs, latest_artifact, start_at_once, task_states,
                                     wait_for_final_state)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
HELLASWAG = REPO / "tests" / "fixtures" / "pipeline" / "hellaswag_mini.jsonl"


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
def trained(server) -> Path:
    """The smoke training run (run_name=integrity): its run directory."""
    server.worker()
    completed(server, "gpt2-train/smoke", "run_name=integrity")
    (run_dir,) = (server.tree / "artifacts" / "runs" / "integrity").iterdir()
    return run_dir


# ---------------------------------------------------------------------------------------------------------
# data lost, wrong data trained on, writes outside root


GLOBS = ["dataset=sm[o]ke", "dataset=*", "run_name=sm?ke"]
# a setting no stage could use: {param: (deployment, what the failure says)}
UNUSABLE = {
    "dataset=" + "d" * 240: ("gpt2-tokenize/smoke", "dataset may have at most 226 bytes"),
    # a JSON string: the CLI refuses a raw newline in --param
    'run_name="x\\ntouch pwned #"': ("gpt2-train/smoke", "no control character"),
    "lr=1e39": ("gpt2-train/smoke", "lr=1e+39 is beyond float32"),
}


@pytest.fixture(scope="module")
def refused_runs(server) -> dict[str, Started]:
    """A run of each setting below that must be refused before any stage, all started at once (each test
    checks its own)."""
    runs = {param: ("gpt2-tokenize/smoke", param) for param in GLOBS}
    runs.update({param: (deployment, param) for param, (deployment, _) in UNUSABLE.items()})
    return start_at_once(server, runs)


@pytest.mark.parametrize("param", GLOBS)
def test_a_name_that_is_a_glob_pattern_is_refused_before_any_stage(server, worker, refused_runs, param):
    flow_run_id = refused_runs[param].flow_run_id
    name = param.split("=")[0]
    assert f"{name} must be a plain name" in failure(server, flow_run_id, wait_for_final_state(server, flow_run_id))
    assert task_states(server, flow_run_id) == {}


@pytest.mark.parametrize("param", UNUSABLE)
def test_a_setting_no_stage_could_use_fails_before_any_stage_naming_it(server, worker, refused_runs, param):
    """Before: the 240-character dataset failed inside tokenize (`File name too long`) after download
    completed; the newline reached the Slurm job script; lr=1e39 failed every attempt of training with
    `RuntimeError: value cannot be converted to type float without overflow`, tried 3 times."""
    flow_run_id = refused_runs[param].flow_run_id
    said = failure(server, flow_run_id, wait_for_final_state(server, flow_run_id))
    assert f"{param.split('=')[0]}" in said and UNUSABLE[param][1] in said, said[-3000:]
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


def test_a_lock_file_hard_linked_to_another_file_is_replaced_not_written_through(server, worker, tmp_path):
    """Before: `ln /tmp/victim.txt .../shards/LOCK`, then tokenize with force=true: Completed, and the victim
    read `{"pid": ..., "host": ...}` (O_NOFOLLOW stops symbolic links only)."""
    completed(server, "gpt2-tokenize/smoke", "dataset=hardlock")
    lock = server.tree / "artifacts" / "data" / "hardlock" / "shards" / "LOCK"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    lock.unlink()
    os.link(victim, lock)
    flow_run_id = completed(server, "gpt2-tokenize/smoke", "dataset=hardlock", "force=true")
    assert task_states(server, flow_run_id)["tokenize"] == "Completed"
    assert victim.read_text() == "precious\n" and os.stat(victim).st_nlink == 1
    assert os.stat(lock).st_nlink == 1 and "pid" in json.loads(lock.read_text())


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


def _init_source(server, flow_run_id: str) -> str:
    """The weights the init stage recorded, as it logged them (logs reach the server in batches, seconds late)."""
    def logged() -> str | None:
        return next((m for m in flow_run_logs(server, flow_run_id) if m.startswith("training starts from ")), None)

    return wait_for(logged, 60) or f"nothing logged by flow run {flow_run_id}"


def test_init_from_a_run_directory_is_keyed_on_its_newest_checkpoint(server, worker, trained, tmp_path):
    """init_from=<run dir> was served from cache (still step 20) after the run gained a newer checkpoint that
    verifies: the key held the folder, not what it resolved to."""
    from gpt2.checkpoint import load_checkpoint, model_from_state, save_checkpoint

    source = tmp_path / "source-run"  # a run of its own, so that no other test sees its new checkpoint
    shutil.copytree(trained, source, ignore=shutil.ignore_patterns("evaluations", "tensorboard", "LOCK"))
    step_20 = source / "checkpoints" / "step_00000020"
    first = completed(server, "gpt2-init/smoke", f"init_from={source}")
    assert task_states(server, first)["init"] == "Completed" and str(step_20) in _init_source(server, first)
    again = completed(server, "gpt2-init/smoke", f"init_from={source}")
    assert task_states(server, again)["init"] == "Cached"  # nothing changed: the key holds still

    state = load_checkpoint(step_20)  # the run trains on: a newer checkpoint, which verifies
    model = model_from_state(state)
    save_checkpoint(source, 22, {**state, "step": 22, "model": model.state_dict()}, model)
    after = completed(server, "gpt2-init/smoke", f"init_from={source}")
    assert task_states(server, after)["init"] == "Completed", "init_from=<run dir> was served from cache"
    assert str(source / "checkpoints" / "step_00000022") in _init_source(server, after)


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


def test_two_run_names_with_the_same_settings_keep_artifacts_of_their_own(server, worker):
    """Before: the train stage keyed its progress and summary artifacts on the run id alone, which hashes the
    settings, not the run's name. A second name trained with the same settings wrote newer versions of the first
    name's keys, so the first name's summary, as the UI shows it, was the other run's (the suite's server showed it:
    a multi-node test's run and the Slurm test's shared an id, and the Slurm test read two progress artifacts)."""
    runs = {name: None for name in ("twin-a", "twin-b")}
    for name in runs:  # one after the other: twin-b's artifacts are the newer
        completed(server, "gpt2-train/smoke", f"run_name={name}", "max_steps=10")
        (runs[name],) = (server.tree / "artifacts" / "runs" / name).glob("*/launch_config.json")
    run_dirs = {name: config.parent for name, config in runs.items()}
    assert len({d.name for d in run_dirs.values()}) == 1  # one run id, two folders
    for name, run_dir in run_dirs.items():
        summary = latest_artifact(server, run_artifact_key("train-summary", run_dir))
        assert summary is not None, name
        assert str(run_dir) in summary["data"] and all(str(d) not in summary["data"] for d in run_dirs.values()
                                                        if d != run_dir), f"{name}'s summary is another run's"
        assert latest_artifact(server, run_artifact_key("train-progress", run_dir))["data"] == 100.0, name


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
    """A copy of a run's config, its data record and its newest complete checkpoint (what the scan reads)."""
    final = sorted(p for p in (run_dir / "checkpoints").glob("step_*") if (p / "COMPLETE").is_file())[-1]
    shutil.copytree(final, dest / "checkpoints" / final.name)
    for name in ("config.json", "data_identity.json"):
        shutil.copy2(run_dir / name, dest / name)
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
    data = json.loads((no_manifest / "data_identity.json").read_text())
    shards = Path(data["val_shards"]["manifest"]).parent
    for shard in shards.glob("*_val_*.bin"):
        shutil.copy2(shard, val / shard.name)
    data["val_shards"]["manifest"] = str(val / "manifest.json")  # the run's val shards, without their manifest
    (no_manifest / "data_identity.json").write_text(json.dumps(data))
    elsewhere = tmp_path / "elsewhere"
    _copy_run(trained, elsewhere)
    (runs / "planted").mkdir()
    for name in ("config.json", "data_identity.json"):
        shutil.copy2(trained / name, runs / "planted" / name)
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


def _val_losses(rows: list[dict], run: str) -> dict[int, float | None]:
    return {row["step"]: row["val_loss"] for row in rows if row["run"] == run}


def test_the_scan_scores_a_run_only_on_the_data_it_recorded(server, worker, tmp_path):
    """A run's dataset rebuilt from another corpus under the same name: the scan filed val losses computed on the
    new shards under the run. Now each evaluation in the ledger names the val shards and
    HellaSwag file it was scored on, and a checkpoint whose run's data changed is skipped with the reason."""
    completed(server, "gpt2-train/smoke", "run_name=refiled", "dataset=refiled")
    runs = server.tree / "artifacts" / "runs" / "refiled"
    (run_dir,) = runs.iterdir()
    metrics = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    logged = {r["step"]: r["val_loss"] for r in metrics if r.get("kind") == "val"}
    steps = sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*"))
    val_shard = server.tree / "artifacts" / "data" / "refiled" / "shards" / "refiled_val_000000.bin"
    trained_on = hashlib.sha256(val_shard.read_bytes()).hexdigest()

    scanned = completed(server, "gpt2-evaluate/scheduled", "runs_dir=artifacts/runs/refiled")
    training_numbers = {step: pytest.approx(logged[step], abs=1e-6) for step in steps}
    assert _val_losses(_artifact_rows(server, scanned), run_dir.name) == training_numbers  # its data: its numbers

    not_yet_scanned = runs / "not-yet-scanned"  # the same run's checkpoints, which no scan has evaluated yet
    shutil.copytree(run_dir, not_yet_scanned, ignore=shutil.ignore_patterns("evaluations", "tensorboard", "LOCK"))
    other = tmp_path / "other-corpus"  # the same documents in the opposite order: other val tokens
    other.mkdir()
    documents = (REPO / "tests" / "fixtures" / "pipeline" / "corpus.jsonl").read_text().splitlines(keepends=True)
    (other / "corpus.jsonl").write_text("".join(reversed(documents)))
    completed(server, "gpt2-tokenize/smoke", "dataset=refiled", f"source={other}")
    assert hashlib.sha256(val_shard.read_bytes()).hexdigest() != trained_on

    rescanned = completed(server, "gpt2-evaluate/scheduled", "runs_dir=artifacts/runs/refiled")
    rows = _artifact_rows(server, rescanned)
    assert "evaluate" not in task_states(server, rescanned), "a checkpoint was scored on the rebuilt shards"
    assert _val_losses(rows, run_dir.name) == training_numbers  # scored on its own data before: those numbers stand
    skipped = {row["step"]: row["skipped"] for row in rows if row["run"] == not_yet_scanned.name}
    assert sorted(skipped) == steps and _val_losses(rows, not_yet_scanned.name) == {step: None for step in steps}
    for why in skipped.values():
        assert "the val shards changed since the run was trained on them" in why and val_shard.name in why, why
    assert not (not_yet_scanned / "evaluations").exists() and not (not_yet_scanned / "tensorboard").exists()
    for step in steps:  # each evaluation names the data it was scored on
        data = json.loads((run_dir / "evaluations" / f"step_{step:08d}.json").read_text()).get("data")
        assert data and data["val_shards"]["sha256"] == {val_shard.name: trained_on}, data
        assert data["hellaswag"]["sha256"] == json.loads((run_dir / "data_identity.json").read_text())["hellaswag"][
            "sha256"]


def test_a_rebuild_of_the_shards_a_training_run_reads_waits_until_training_ends(server, worker):
    """The tokenize stage rerun with another shard_size while a training run reads the dataset: before, it
    replaced the shards under the training run; now it waits, naming the reader, and builds once training ends."""
    train_id = server.run("gpt2-train/smoke", *[a for p in ("dataset=readlock", "run_name=reading", "max_steps=1000000",
                                                            "checkpoint_every=0", "val_every=0") for a in ("--param", p)])
    try:
        assert wait_for(lambda: len(training_processes("reading")) >= 2, 600), "training did not start"
        lower_priority((pid for pid, _ in training_processes("reading")), 19)  # it only has to hold the dataset
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
    inits = server.tree / "artifacts" / "init"
    others = set(inits.glob("*/checkpoints"))
    completed(server, "gpt2-init/smoke", "seed=424242")  # a seed of its own: weights no other test made
    (checkpoints,) = set(inits.glob("*/checkpoints")) - others
    leftover = checkpoints / ".tmp_step_00000000_424242"  # what a SIGKILL during the write leaves
    leftover.mkdir()
    (leftover / "state.safetensors").write_bytes(os.urandom(1 << 20))
    completed(server, "gpt2-init/smoke", "seed=424242", "force=true")
    assert not leftover.exists()
