"""The train stage's Slurm launcher on a real Slurm cluster of this one host (tests/fixtures/slurm.py), through a
real Prefect server and worker running the `gpt2-train/smoke-slurm` deployment as a user starts it.

Two torchrun launchers as two srun tasks ("nodes") train exactly like one local launcher with both ranks;
the job id, nodes and output reach the artifact; a cancelled flow run, a task timeout and a flow-run
process killed outright leave nothing in squeue; a failed job is resubmitted by the task's retry and a
requeued job reruns, both resuming from the run's checkpoint, and the task completes; a partition that does
not exist, or more nodes than the partition has, fails the task at once with Slurm's reason.
"""

from __future__ import annotations

import json
import os
import re
import signal
import urllib.request

import pytest
import torch

from tests.fixtures.processes import free_port, training_processes, wait_for
from tests.fixtures.slurm import missing_reason, start_cluster
from tasks.common import run_artifact_key
from tests.fixtures.deployed import LONG_TRAINING, flow_run_logs, latest_artifact, task_states, wait_for_final_state

pytestmark = [pytest.mark.slow, pytest.mark.skipif(missing_reason() is not None, reason=str(missing_reason()))]

DEPLOYMENT = "gpt2-train/smoke-slurm"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    yield cluster
    for job in cluster.queue():  # a failed test may leave one
        cluster.run("scancel", job.split()[0], check=False)
    cluster.stop()


@pytest.fixture
def worker(server, cluster):
    """The suite's worker, its flow runs reaching the cluster as a login node's shell does: through SLURM_CONF."""
    return server.worker(env={"SLURM_CONF": cluster.env["SLURM_CONF"]})


def start(server, run_name: str, *args: str, slurm: dict | None = None) -> str:
    slurm = {"rdzv_port": free_port(), **(slurm or {})}
    return server.run(DEPLOYMENT, "--param", f"run_name={run_name}", "--param", f"slurm={json.dumps(slurm)}", *args)


def running_job(cluster, run_name: str) -> str:
    """The id of `run_name`'s job once squeue lists it RUNNING and its training processes are up."""
    def job():
        jobs = [line.split() for line in cluster.queue()]
        return next((id_ for id_, state, name in jobs if state == "RUNNING" and run_name in name
                     and len(training_processes(run_name)) >= 4), None)  # 2 torchruns + 2 ranks
    found = wait_for(job, 300)
    assert found, f"no running job of {run_name}: {cluster.queue()}"
    return found


def assert_nothing_left(cluster, run_name: str, timeout_s: float = 60) -> None:
    wait_for(lambda: not cluster.queue() and not training_processes(run_name), timeout_s)
    assert cluster.queue() == []
    assert training_processes(run_name) == []


def run_dir(server, run_name: str):
    (found,) = (server.tree / "artifacts" / "runs" / run_name).glob("*/launch_config.json")
    return found.parent


def output(server, run_name: str, job_id: str) -> str:
    return (run_dir(server, run_name) / "slurm" / f"job-{job_id}.out").read_text()


def losses(run: os.PathLike) -> list[float]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r.get("kind") == "train"]


def test_two_slurm_tasks_train_like_one_local_launcher_with_both_ranks(cluster, server, worker):
    flow_run_id = start(server, "on-slurm")
    run = wait_for_final_state(server, flow_run_id)
    assert run["state"]["type"] == "COMPLETED", flow_run_logs(server, flow_run_id)[-30:]
    # the reference: the same settings on one local launcher with both ranks
    local_id = server.run("gpt2-train/smoke", "--param", "run_name=local", "--param", "nproc=2",
                          "--param", "batch_size=2")
    assert wait_for_final_state(server, local_id)["state"]["type"] == "COMPLETED", flow_run_logs(server, local_id)[-30:]

    slurm_run, local_run = run_dir(server, "on-slurm"), run_dir(server, "local")
    assert json.loads((slurm_run / "config.json").read_text())["resolved"]["world_size"] == 2
    assert len(losses(slurm_run)) == 20
    torch.testing.assert_close(torch.tensor(losses(slurm_run)), torch.tensor(losses(local_run)), rtol=1e-6, atol=1e-6)

    # the job: finished, as Slurm says; its id, nodes and output in the artifact; its output in the task's log
    (job_output,) = (slurm_run / "slurm").glob("job-*.out")
    job_id = job_output.stem.removeprefix("job-")
    job = cluster.job(job_id)
    assert (job["JobState"], job["NumTasks"]) == ("COMPLETED", "2")
    summary = latest_artifact(server, run_artifact_key("train-summary", slurm_run))["data"]
    assert f"Slurm job {job_id} (COMPLETED, requeued 0 time(s)) on nodes {cluster.node}" in summary
    assert str(job_output) in summary
    logs = flow_run_logs(server, flow_run_id)
    assert f"[slurm] submitted job {job_id} ({slurm_run / 'slurm' / f'job-{job_id}.sh'})" in logs
    # gpt2.train's console lines, read from the job's output, as the local launcher forwards them
    last = [r for r in map(json.loads, (slurm_run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"][-1]
    assert f"step {last['step']:5d}/20 | loss {last['loss']:.6f}" in "\n".join(logs)
    assert latest_artifact(server, run_artifact_key("train-progress", slurm_run))["data"] == 100.0
    assert cluster.queue() == []


def test_a_refused_resubmission_leaves_the_completed_jobs_script_and_record_alone(cluster, server, worker):
    slurm_run = run_dir(server, "on-slurm")  # trained by the test above
    (script,) = (slurm_run / "slurm").glob("job-*.sh")
    before = script.read_bytes()
    flow_run_id = start(server, "on-slurm", "--param", "force=true", slurm={"partition": "no-such-partition"})
    run = wait_for_final_state(server, flow_run_id, 300)
    assert run["state"]["type"] == "FAILED" and "Invalid partition name" in run["state"]["message"]
    assert sorted(p.name for p in (slurm_run / "slurm").glob("job*")) == sorted(
        p.name for p in (slurm_run / "slurm").glob("job-*"))  # no draft left
    assert list((slurm_run / "slurm").glob("job-*.sh")) == [script] and script.read_bytes() == before
    assert str(script) in latest_artifact(server, run_artifact_key("train-summary", slurm_run))["data"]


def test_cancelling_the_flow_run_cancels_the_job(cluster, server, worker):
    flow_run_id = start(server, "slurm-cancelled", *LONG_TRAINING)
    job_id = running_job(cluster, "slurm-cancelled")
    server.prefect("flow-run", "cancel", flow_run_id)  # what the UI's Cancel button does
    assert_nothing_left(cluster, "slurm-cancelled", timeout_s=30)  # well before the heartbeat's 60 s
    assert cluster.job(job_id)["JobState"] == "CANCELLED"
    assert "not touched" not in output(server, "slurm-cancelled", job_id)  # cancelled by the task, not its watchdog
    assert wait_for_final_state(server, flow_run_id, 120)["state"]["type"] == "CANCELLED"


def test_a_train_timeout_cancels_the_job_and_is_not_retried(cluster, server, worker):
    flow_run_id = start(server, "slurm-timeout", *LONG_TRAINING, "--param", "train_timeout_s=20")
    job_id = wait_for(lambda: next((line.split()[0] for line in cluster.queue() if "slurm-timeout" in line), None), 60)
    assert job_id, "no job was submitted"
    assert wait_for_final_state(server, flow_run_id, 180)["state"]["type"] == "FAILED"
    assert task_states(server, flow_run_id)["train"] == "TimedOut"
    assert_nothing_left(cluster, "slurm-timeout")
    assert cluster.job(job_id)["JobState"] == "CANCELLED"


def test_a_killed_flow_run_process_leaves_a_job_that_cancels_itself(cluster, server, worker):
    """SIGKILL of the worker and of the flow-run process: none of our code runs; the heartbeat goes stale."""
    flow_run_id = start(server, "slurm-orphaned", *LONG_TRAINING, slurm={"heartbeat_timeout_s": 10})
    job_id = running_job(cluster, "slurm-orphaned")
    (flow_process,) = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
                       if _parent(pid) == worker.pid and _flow_run_of(pid) == flow_run_id]
    # the flow-run process first: killing the worker first would SIGTERM it (it dies with its worker), and its
    # own clean-up could cancel the job before the SIGKILL lands, which is not what this test is about
    os.kill(flow_process, signal.SIGKILL)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    assert_nothing_left(cluster, "slurm-orphaned", timeout_s=90)
    assert cluster.job(job_id)["JobState"] == "CANCELLED"
    assert "not touched for over 10 s" in output(server, "slurm-orphaned", job_id)


def _flow_run_of(pid: int) -> str | None:
    """The flow run a worker's child process runs (Prefect hands it the id in its environment)."""
    try:
        environ = dict(v.split("=", 1) for v in open(f"/proc/{pid}/environ").read().split("\0") if "=" in v)
    except OSError:
        return None
    return environ.get("PREFECT__FLOW_RUN_ID")


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError):
        return None


def test_a_failed_job_is_resubmitted_and_a_requeued_one_reruns_both_resuming_from_the_newest_checkpoint(
        cluster, server, worker):
    flow_run_id = start(server, "slurm-resumed", "--param", "max_steps=40", "--param", "checkpoint_every=10",
                        "--param", "val_every=0")
    checkpoints = server.tree / "artifacts" / "runs" / "slurm-resumed"

    def checkpoint_after(step: int) -> int | None:
        steps = [int(p.parent.name[-8:]) for p in checkpoints.glob("*/checkpoints/step_*/COMPLETE")]
        return max(steps) if steps and max(steps) > step else None

    first_job = running_job(cluster, "slurm-resumed")
    assert (failed_at := wait_for(lambda: checkpoint_after(0), 300)), "no checkpoint"
    rank = next(pid for pid, cmdline in training_processes("slurm-resumed")
                if "-m gpt2.train" in cmdline and "torch.distributed.run" not in cmdline)
    os.kill(rank, signal.SIGKILL)  # a rank dies (a node failure, OOM): the job fails, the task's retry resubmits
    second_job = wait_for(lambda: (job := running_job(cluster, "slurm-resumed")) != first_job and job, 120)
    assert second_job, f"no new job after {first_job} failed: {cluster.queue()}"
    assert (requeued_at := wait_for(lambda: checkpoint_after(failed_at), 300)), "the new job wrote no checkpoint"
    cluster.requeue(second_job)
    final = wait_for_final_state(server, flow_run_id)
    assert final["state"]["type"] == "COMPLETED", flow_run_logs(server, flow_run_id)[-30:]

    assert cluster.job(first_job)["JobState"] == "FAILED"
    assert (cluster.job(second_job)["JobState"], cluster.job(second_job)["Restarts"]) == ("COMPLETED", "1")
    # the resubmitted job resumed from the failed one's checkpoint, its requeued run from its own
    starts = [int(step) for step in re.findall(r"start step (\d+)/40", output(server, "slurm-resumed", second_job))]
    assert len(starts) == 2 and starts[0] >= failed_at and starts[1] >= requeued_at, starts
    summary = json.loads((run_dir(server, "slurm-resumed") / "summary.json").read_text())
    assert summary["checkpoint"].endswith("step_00000040")
    assert task_states(server, flow_run_id)["train"] == "Completed"
    assert cluster.queue() == []


@pytest.mark.parametrize("slurm, reason", [
    ({"partition": "no-such-partition"}, "Invalid partition name specified"),
    # sbatch takes it; it would pend forever (Slurm names the partition's limits first, then its node limit)
    ({"nodes": 2, "tasks_per_node": 1}, "cannot start: Partition(Config|NodeLimit)"),
])
def test_a_job_slurm_refuses_fails_the_task_at_once_with_slurms_reason(cluster, server, worker, slurm, reason):
    flow_run_id = start(server, "slurm-refused", slurm=slurm)
    run = wait_for_final_state(server, flow_run_id, 300)
    assert run["state"]["type"] == "FAILED"
    assert re.search(reason, run["state"]["message"]), run["state"]["message"]
    (train,) = [r for r in task_runs(server, flow_run_id) if r["name"].startswith("train")]
    assert (train["state"]["name"], train["run_count"]) == ("Failed", 1)  # deterministic: not retried
    assert cluster.queue() == []


def task_runs(server, flow_run_id: str) -> list[dict]:
    request = urllib.request.Request(f"{server.env['PREFECT_API_URL']}/task_runs/filter", method="POST",
                                     data=json.dumps({"flow_runs": {"id": {"any_": [flow_run_id]}}}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        return json.load(response)
