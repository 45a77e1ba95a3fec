"""Several starts of one output at the same moment, through the suite's real server and worker: a training
run started two or three times at once is trained by one session and every start ends Completed, resumed
from what that session left; two exports of one checkpoint at once publish it once, whole; an init of the
weights a training run starts from waits until it ends. The moment that decides the race is forced: the
test holds the output's lock (common.locks, as a running writer holds it) until every start has decided to
write it and waits, then lets them all go at once.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from common.locks import folder_lock
from gpt2.run_dir import RunDir
from tests.fixtures.deployed import (flow_run_logs, start_at_once, task_states, wait_for_final_state, wait_until)
from tests.fixtures.processes import lower_priority, training_processes, wait_for
from tests.test_pipeline_integrity import state_once_logged

pytestmark = pytest.mark.slow

STEPS = 4


def _all_waiting(server, flow_run_ids: list[str], holder: str) -> None:
    """Every flow run has logged that it waits for the lock `holder` names."""
    wait_until(lambda: all(any(holder in line for line in flow_run_logs(server, i)) for i in flow_run_ids), 300,
               f"every start to wait for {holder}")


def _started_together(server, run: tuple[str, ...], lock_of: Path, starts: int = 2) -> list[str]:
    """`starts` flow runs of `run`, all of them past their decision to write `lock_of`'s folder before any can:
    the test holds its lock until each has said it waits, then lets go."""
    with folder_lock(lock_of):
        started = start_at_once(server, {n: run for n in range(starts)})
        flow_run_ids = [s.flow_run_id for s in started.values()]
        _all_waiting(server, flow_run_ids, f"{lock_of.name} is being written by pid ")
    return flow_run_ids


def _completed(server, flow_run_id: str) -> list[str]:
    """The logs of a flow run that must have ended Completed."""
    state = wait_for_final_state(server, flow_run_id)
    logs = flow_run_logs(server, flow_run_id)
    assert state["state"]["type"] == "COMPLETED", (state["state"]["message"], logs[-20:])
    return logs


@pytest.mark.parametrize("starts, run_name", [(2, "twice"), (3, "thrice")])
def test_starts_of_one_run_at_once_are_one_training_session_and_all_complete(server, worker, starts, run_name):
    """Before: a start ended Failed, `Flow run encountered an exception: CommandFailed: .../python -m
    common.loopback_torchrun ...` and was not retried: the stage held the lock only while it wrote the run's
    config, so the trainers raced for it and the losers were refused (FolderLocked)."""
    run = ("gpt2-train/smoke", f"run_name={run_name}", f"max_steps={STEPS}", "val_every=0")
    first = server.run(*run[:1], *[a for p in run[1:] for a in ("--param", p)])
    _completed(server, first)  # the run's directory, whose name (the run's id) the test must know to hold its lock
    (run_dir,) = (server.tree / "artifacts" / "runs" / run_name).glob("[0-9a-f]*")
    shutil.rmtree(run_dir)  # the run as if never trained: its cached record's files are gone, so each start trains

    flow_run_ids = _started_together(server, run, run_dir, starts)
    logs = [_completed(server, i) for i in flow_run_ids]

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(STEPS))  # one session, no duplicate
    sessions = [next(line for line in said if "start step " in line) for said in logs]
    assert sorted(s.split("start step ")[1] for s in sessions) == [f"0/{STEPS}"] + [f"{STEPS}/{STEPS}"] * (starts - 1)
    for said in logs:  # each start that had to wait said so once, however often it waited
        assert sum("waiting for the lock: " in line and run_dir.name in line for line in said) == 1, said


def test_two_exports_of_one_checkpoint_at_once_publish_it_once_whole(server, worker):
    """Before: the export stage took no lock (`timed out after 300 s waiting for every start to wait for
    <run id> is being written by pid`), and each export removes the directory in place before it renames its
    own in, under the other's feet."""
    run = ("gpt2-export/smoke", "run_name=exported", f"max_steps={STEPS}", "val_every=0")
    first = server.run(*run[:1], *[a for p in run[1:] for a in ("--param", p)])
    _completed(server, first)
    (run_dir,) = (server.tree / "artifacts" / "runs" / "exported").glob("[0-9a-f]*")
    (export,) = run_dir.glob("hf_step_*")
    whole = sorted(p.name for p in export.iterdir())
    shutil.rmtree(export)  # its cached record's files are gone: each start exports again

    flow_run_ids = _started_together(server, run, run_dir)
    for flow_run_id in flow_run_ids:
        _completed(server, flow_run_id)
        assert task_states(server, flow_run_id)["export"] == "Completed"
    assert sorted(p.name for p in export.iterdir()) == whole
    assert not list(run_dir.glob(".tmp_*"))


def test_an_init_of_the_weights_a_training_run_starts_from_waits_until_training_ends(server, worker):
    """Before: a second init of the same folder (a run started at the same moment, or force=true) replaced the
    step-0 checkpoint while a trainer was reading it."""
    settings = ("run_name=initread", "seed=4343", "max_steps=1000000", "checkpoint_every=0", "val_every=0")
    train_id = server.run("gpt2-train/smoke", *[a for p in settings for a in ("--param", p)])
    try:
        assert wait_for(lambda: len(training_processes("initread")) >= 2, 600), "training did not start"
        lower_priority((pid for pid, _ in training_processes("initread")), 19)  # it only has to hold the weights
        (launch_config,) = (server.tree / "artifacts" / "runs" / "initread").glob("*/launch_config.json")
        weights = RunDir.of_checkpoint(json.loads(launch_config.read_text())["init_from"]).root
        before = sorted((p.name, p.stat().st_mtime_ns) for p in weights.rglob("*") if p.is_file() and p.name != "LOCK")
        init_id = server.run("gpt2-init/smoke", "--param", "seed=4343", "--param", "force=true")
        state = state_once_logged(server, init_id, f"{weights.name} is being read by pid ")
        assert state == "RUNNING", f"the init did not wait while training read {weights}: {state}"
        after = sorted((p.name, p.stat().st_mtime_ns) for p in weights.rglob("*") if p.is_file() and p.name != "LOCK")
        assert after == before
    finally:
        server.prefect("flow-run", "cancel", train_id, check=False)
    assert wait_for_final_state(server, train_id)["state"]["type"] == "CANCELLED"
    assert wait_for_final_state(server, init_id)["state"]["type"] == "COMPLETED"
