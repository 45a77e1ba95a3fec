"""Deployment runs through a real Prefect server and a real process worker, as a user starts them.

One server per module (its own PREFECT_HOME), serving a copy of this working tree with the deployments
of prefect.yaml. Covered: `--param NAME=VALUE` overrides one setting and keeps the deployment's others,
nested values merge, bad settings fail before any stage naming the setting; and no training process
outlives its flow run -- cancelled from the API, worker killed by SIGKILL, task timeout -- with the run
ending Cancelled, Crashed or TimedOut, never RUNNING. Training processes are found in /proc.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures.processes import free_port, training_processes, wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
PREFECT = str(REPO / ".venv" / "bin" / "prefect")
# a training run that would go on for hours: the CPU smoke model, no checkpoints or evaluations on the way
LONG_TRAINING = ["--param", "max_steps=1000000", "--param", "checkpoint_every=0", "--param", "val_every=0"]


def copy_tree(dest: Path) -> Path:
    """This working tree as it is (tracked and untracked files git does not ignore), sharing its .venv."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    (dest / ".venv").symlink_to(REPO / ".venv")
    return dest


@dataclass
class Server:
    tree: Path
    env: dict[str, str]
    logs: Path

    def prefect(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        result = subprocess.run([PREFECT, *args], cwd=self.tree, env=self.env, capture_output=True, text=True,
                                timeout=timeout)
        if check:
            assert result.returncode == 0, f"prefect {' '.join(args)}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        return result

    def start_worker(self, name: str) -> subprocess.Popen:
        log = open(self.logs / f"worker-{name}.log", "w")
        return subprocess.Popen([PREFECT, "worker", "start", "--pool", "gpt2-local", "--name", name], cwd=self.tree,
                                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def run(self, deployment: str, *args: str) -> str:
        """Start a deployment run (without waiting) exactly as a user would; returns the flow run id."""
        out = self.prefect("deployment", "run", deployment, *args).stdout
        return re.search(r"UUID: ([0-9a-f-]{36})", out).group(1)


@contextmanager
def serving_this_tree(root: Path, env: dict[str, str] | None = None) -> Iterator[Server]:
    """A Prefect server (its own PREFECT_HOME under `root`) with the work pool and the deployments of a copy of
    this working tree; `env` is added to the environment of the server, its workers and their flow runs."""
    tree = copy_tree(root / "tree")
    port = free_port()
    server_env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    server_env.update(env or {}, PREFECT_HOME=str(root / "home"), PREFECT_API_URL=f"http://127.0.0.1:{port}/api",
                      PREFECT_SERVER_ANALYTICS_ENABLED="false")
    logs = root / "logs"
    logs.mkdir()
    with open(logs / "server.log", "w") as log:
        proc = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)], cwd=tree,
                                env=server_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_until(lambda: _healthy(server_env["PREFECT_API_URL"]), 180, "the server to answer")
        s = Server(tree, server_env, logs)
        s.prefect("work-pool", "create", "gpt2-local", "--type", "process", "--overwrite")
        s.prefect("--no-prompt", "deploy", "--all")
        yield s
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving_this_tree(tmp_path_factory.mktemp("server")) as s:
        yield s


def _healthy(api_url: str) -> bool:
    try:
        urllib.request.urlopen(f"{api_url}/health", timeout=2)
        return True
    except OSError:
        return False


def _wait_until(condition, timeout_s: float, what: str):
    if value := wait_for(condition, timeout_s):
        return value
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture
def worker(server, request):
    proc = server.start_worker(request.node.name[:40])
    yield proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # Prefect's worker turns SIGTERM into a SIGINT it may ignore
        proc.wait()


def flow_run(server: Server, flow_run_id: str) -> dict:
    with urllib.request.urlopen(f"{server.env['PREFECT_API_URL']}/flow_runs/{flow_run_id}") as response:
        return json.load(response)


def wait_for_final_state(server: Server, flow_run_id: str, timeout_s: float = 600) -> dict:
    return _wait_until(lambda: (run := flow_run(server, flow_run_id))["state"]["type"] in
                       ("COMPLETED", "FAILED", "CANCELLED", "CRASHED") and run, timeout_s, f"flow run {flow_run_id} to end")


def flow_run_logs(server: Server, flow_run_id: str) -> list[str]:
    request = urllib.request.Request(f"{server.env['PREFECT_API_URL']}/logs/filter", method="POST",
                                     data=json.dumps({"logs": {"flow_run_id": {"any_": [flow_run_id]}},
                                                      "limit": 200}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        return [entry["message"] for entry in json.load(response)]


def task_states(server: Server, flow_run_id: str) -> dict[str, str]:
    request = urllib.request.Request(f"{server.env['PREFECT_API_URL']}/task_runs/filter", method="POST",
                                     data=json.dumps({"flow_runs": {"id": {"any_": [flow_run_id]}}}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        return stage_states(json.load(response))


def stage_states(task_runs: list[dict]) -> dict[str, str]:
    """{stage: state name} of task runs as the API lists them (tokenize-3f2, evaluate-step-20). A task run the
    server has just created can still be without a state: it is Pending (seen once as a TypeError in CI)."""
    return {run["name"].split("-")[0]: (run["state"] or {"name": "Pending"})["name"] for run in task_runs}


def start_long_training(server: Server, run_name: str, *args: str) -> str:
    flow_run_id = server.run("gpt2-train/smoke", "--param", f"run_name={run_name}", *LONG_TRAINING, *args)
    # torchrun and its rank are up: the training process itself has started
    _wait_until(lambda: len(training_processes(run_name)) >= 2, 300, f"training of {run_name} to start")
    return flow_run_id


def assert_no_training_left(run_name: str) -> None:
    """Within a few seconds nothing of the run is left (torchrun's SIGTERM grace is 15 s at most)."""
    wait_for(lambda: not training_processes(run_name), 30)
    assert training_processes(run_name) == []


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


@pytest.mark.parametrize("args, message", [
    (["--param", "warmup_steps=50"], "warmup_steps=50 exceeds max_steps=20"),
    (["--param", "max_steps=ten"], "max_steps"),
    (["--param", "max_stepz=5"], "max_stepz"),
    (["--param", "run_name=../../escape"], "run_name: Value error, run_name must be a plain name"),
    (["--param", "dataset=../../../../tmp/x"], "dataset: Value error, dataset must be a plain name"),
])
def test_bad_setting_fails_the_run_before_any_stage_naming_it(server, worker, args, message):
    result = server.prefect("deployment", "run", "gpt2-pretrain/smoke", "--param", "run_name=bad", *args, check=False)
    found = re.search(r"UUID: ([0-9a-f-]{36})", result.stdout)
    if found is None:  # refused by the server's parameter schema: the command says why
        assert result.returncode != 0 and message in result.stdout + result.stderr
        return
    run = wait_for_final_state(server, found.group(1))
    assert run["state"]["type"] in ("FAILED", "CRASHED")
    assert message in "\n".join(flow_run_logs(server, found.group(1))) + run["state"]["message"]
    assert task_states(server, found.group(1)) == {}  # nothing was downloaded, tokenized or trained


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
    assert_no_training_left("timeout")
    run = wait_for_final_state(server, flow_run_id, 120)
    assert run["state"]["type"] == "FAILED"
    assert task_states(server, flow_run_id)["train"] == "TimedOut"
