"""Bounded settings and the retry policy through a real Prefect server, worker and CLI, as a user starts runs.

A setting out of bounds fails the run before any stage, naming it, and touches nothing (findings 1, 10, 11);
an error a rerun would meet again fails its stage on the first attempt (finding 8).
"""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

from tests.test_pipeline_server import (flow_run, flow_run_logs, serving_this_tree, task_states,  # noqa: F401
                                        wait_for_final_state, worker)

pytestmark = pytest.mark.slow

HUGE_MODEL = "n_layer=1,n_head=1,n_embd=100000,block_size=100000"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_this_tree(tmp_path_factory.mktemp("bounds")) as s:
        yield s


def task_runs(server, flow_run_id: str) -> dict[str, dict]:
    request = urllib.request.Request(f"{server.env['PREFECT_API_URL']}/task_runs/filter", method="POST",
                                     data=json.dumps({"flow_runs": {"id": {"any_": [flow_run_id]}}}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        return {run["name"].split("-")[0]: run for run in json.load(response)}


def run_to_the_end(server, deployment: str, *params: str) -> tuple[str | None, dict | None, str]:
    """Start a deployment run as a user does; (flow run id, final flow run, everything said about it). The id
    is None when the server's parameter schema refused the run (then the text is the CLI's output)."""
    args = [a for p in params for a in ("--param", p)]
    result = server.prefect("deployment", "run", deployment, *args, check=False)
    found = re.search(r"UUID: ([0-9a-f-]{36})", result.stdout)
    if found is None:
        assert result.returncode != 0, result.stdout
        return None, None, result.stdout + result.stderr
    run = wait_for_final_state(server, found.group(1))
    return found.group(1), run, "\n".join(flow_run_logs(server, found.group(1))) + (run["state"]["message"] or "")


def test_a_shard_size_beyond_the_format_fails_before_the_dataset_folder_is_touched(server, worker):
    """Finding 1: shard_size=10**18 passed the check, cleared the dataset folder, then died of a 1.73 EiB
    allocation without naming shard_size."""
    flow_run_id, run, _ = run_to_the_end(server, "gpt2-tokenize/smoke", "dataset=wipe")
    assert run["state"]["type"] == "COMPLETED", flow_run_logs(server, flow_run_id)[-20:]
    shards = server.tree / "artifacts" / "data" / "wipe" / "shards"
    before = {p.name: p.read_bytes() for p in shards.iterdir()}
    assert any(name.endswith(".bin") for name in before)

    flow_run_id, run, said = run_to_the_end(server, "gpt2-tokenize/smoke", "dataset=wipe",
                                            "shard_size=1000000000000000000")
    assert run["state"]["type"] == "FAILED"
    assert "shard_size=1000000000000000000: must lie in [1, 2147483647]" in said
    assert task_states(server, flow_run_id) == {}  # no stage ran
    assert {p.name: p.read_bytes() for p in shards.iterdir()} == before


@pytest.mark.parametrize("param, message", [
    ("seed=18446744073709551616", "seed=18446744073709551616 is out of range"),
    ('eval={"batch_size": -1}', "eval.batch_size must be >= 1"),
    ("lr=NaN", "field 'lr'"),  # JSON has no NaN: the client sends null, which the parameter schema refuses
    ('rendezvous={"nnodes": 0}', "rendezvous.nnodes must be >= 1"),
    ("eps=-1e-8", "eps must be > 0"),
    (f"model={HUGE_MODEL}", "has 135,031,900,000 parameters"),
    ("tokenize_workers=4096", "tokenize_workers=4096: this machine has"),
])
def test_a_setting_out_of_bounds_fails_the_run_before_any_stage_naming_it(server, worker, param, message):
    """Findings 10 and 11: each of these was accepted and failed late, silently or without naming the setting."""
    flow_run_id, run, said = run_to_the_end(server, "gpt2-pretrain/smoke", "run_name=bounds", param)
    assert message in said
    if flow_run_id is not None:
        assert run["state"]["type"] == "FAILED"
        assert task_states(server, flow_run_id) == {}


def test_a_run_name_too_long_for_the_filesystem_fails_at_once(server, worker):
    """Finding 8: a 300-character run_name (OSError [Errno 36]) was tried 3 times."""
    flow_run_id, run, said = run_to_the_end(server, "gpt2-train/smoke", "run_name=" + "r" * 300)
    assert run["state"]["type"] == "FAILED"
    assert "File name too long" in said or "run_name" in said
    runs = task_runs(server, flow_run_id)
    assert "train" not in runs or runs["train"]["run_count"] == 1, runs["train"]


def test_a_diverged_run_fails_at_once(server, worker):
    """Finding 8: lr=1e308 (TrainingDivergedError) was tried 3 times. (1e308 is now refused before any stage:
    float32, AdamW's type, holds at most 3.4e38; 1e30 still diverges.)"""
    flow_run_id, run, said = run_to_the_end(server, "gpt2-train/smoke", "run_name=diverged", "lr=1e30",
                                            "max_bad_steps=2", "warmup_steps=0")
    assert run["state"]["type"] == "FAILED"
    assert "TrainingDivergedError" in said
    train = task_runs(server, flow_run_id)["train"]
    assert (train["state"]["type"], train["run_count"]) == ("FAILED", 1)
