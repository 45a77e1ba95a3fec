"""Deployment runs through a real Prefect server and a real process worker, as a user starts them.

The suite's shared server and worker (tests/fixtures/deployed.py), serving a copy of this working tree with
the deployments of prefect.yaml. Covered: `--param NAME=VALUE` overrides one setting and keeps the deployment's others,
nested values merge, bad settings fail before any stage naming the setting; and no training process
outlives its flow run -- cancelled from the API, worker killed by SIGKILL, task timeout -- with the run
ending Cancelled, Crashed or TimedOut, never RUNNING. Training processes are found in /proc.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.fixtures.deployed import (Started, assert_no_training_left, flow_run_logs, refused_before_any_stage,
                                     start_at_once, start_long_training, task_states, wait_for_final_state)

pytestmark = pytest.mark.slow


# ---------------------------------------------------------------------------------------------------------
# parameters


def test_one_parameter_overrides_the_deployment_and_keeps_its_other_values(server, worker):
    flow_run_id = server.run("gpt2-train/smoke", "--param", "max_steps=12", "--param", "run_name=override",
                             "--param", 'eval={"val_steps": 1}')
    run = wait_for_final_state(server, flow_run_id)
    assert run["state"]["type"] == "COMPLETED", flow_run_logs(server, flow_run_id)[-20:]
    (config_path,) = (server.tree / "artifacts" / "runs" / "override").glob("*/config.json")
    config = json.loads(config_path.read_text())
    assert config["max_steps"] == 12  # the override
    # the smoke deployment's other values, not gpt2.train's defaults (d12, B=64, FineWeb)
    assert (config["batch_size"], config["seq_len"], config["device"]) == (4, 32, "cpu")
    assert config["model"] == "n_layer=2,n_head=2,n_embd=64,block_size=64"
    assert "/data/smoke/shards/" in config["train_data"]
    # a nested value merges field by field: the deployment's eval.device stays
    (settings,) = [json.loads(m.split("settings: ", 1)[1]) for m in flow_run_logs(server, flow_run_id)
                   if m.startswith("settings: ")]
    assert settings["eval"] == {"val_steps": 1, "device": "cpu"}


BAD_SETTINGS = {
    "warmup_steps=50": "warmup_steps=50 exceeds max_steps=20",
    "max_steps=ten": "max_steps",
    "max_stepz=5": "max_stepz",
    "run_name=../../escape": "run_name: Value error, run_name must be a plain name",
    "dataset=../../../../tmp/x": "dataset: Value error, dataset must be a plain name",
}


@pytest.fixture(scope="module")
def bad_setting_runs(server) -> dict[str, Started]:
    """A run of each bad setting, all started at once (each test below checks its own)."""
    return start_at_once(server, {param: ("gpt2-pretrain/smoke", "run_name=bad", param) for param in BAD_SETTINGS})


@pytest.mark.parametrize("param", BAD_SETTINGS)
def test_bad_setting_fails_the_run_before_any_stage_naming_it(server, worker, bad_setting_runs, param):
    said = refused_before_any_stage(server, bad_setting_runs[param], ended=("FAILED", "CRASHED"))
    assert BAD_SETTINGS[param] in said


# ---------------------------------------------------------------------------------------------------------
# processes die with their run


def test_cancelling_the_flow_run_stops_training(server, worker):
    flow_run_id = start_long_training(server, "cancelled")
    server.prefect("flow-run", "cancel", flow_run_id)  # what the UI's Cancel button does
    assert_no_training_left("cancelled")
    assert wait_for_final_state(server, flow_run_id, 120)["state"]["type"] == "CANCELLED"


def test_a_killed_worker_takes_training_along_and_the_run_crashes(server, worker):
    flow_run_id = start_long_training(server, "orphaned")
    os.kill(worker.pid, signal.SIGKILL)  # the worker alone: nothing of it runs any more
    worker.wait()
    assert_no_training_left("orphaned")
    assert wait_for_final_state(server, flow_run_id, 120)["state"]["type"] == "CRASHED"


def test_train_timeout_stops_training_and_is_not_retried(server, worker):
    flow_run_id = start_long_training(server, "timeout", "--param", "train_timeout_s=20")
    # the 20 s count from the task's start, before its processes were seen: up to 20 s more, then the stop's 30
    assert_no_training_left("timeout", within_s=20 + 30)
    run = wait_for_final_state(server, flow_run_id, 120)
    assert run["state"]["type"] == "FAILED"
    assert task_states(server, flow_run_id)["train"] == "TimedOut"
