"""What scripts/run.sh shows while a run goes on (`python -m flows.watch`), against a real Prefect server: lines in
the order things happened, and a stage waiting for a retry says why (a run directory locked by another run)."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.fixtures.processes import environ_without_prefect_settings, wait_for

REPO = Path(__file__).resolve().parent.parent

LOCKED = "RunDirLocked: artifacts/runs/smoke/1 is being written by pid 1874 on host-a; it is retried"
STEPS = 25
CUT_S = 20  # an outage shorter than the minute Prefect's client retried for by default


def _log_steps(logger, steps: int, step_s: float = 0.0) -> None:
    """gpt2.train's console lines (gpt2/train.py, _step_line), one every `step_s` seconds."""
    for step in range(steps):
        logger.info(f"step {step:5d}/{steps} | loss {10.8 - step / 100:.6f} | lr 6.00e-04 | norm 1.2345 | "
                    f"120.0 ms | 1,530 tok/s")
        time.sleep(step_s)


def _a_flow_running(stage, name: str, started: queue.Queue):
    """A flow named `name` that puts its run id on `started`, then runs the task `stage`."""
    from prefect import flow, runtime

    @flow(name=name)
    def watched():
        started.put(runtime.flow_run.id)
        stage()

    return watched


def _a_flow_whose_train_stage_waits_for_a_lock_then_trains(started: queue.Queue):
    from prefect import get_run_logger, task

    attempts = []

    @task(name="train", retries=1, retry_delay_seconds=2)
    def train():
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError(LOCKED)
        _log_steps(get_run_logger(), STEPS)

    return _a_flow_running(train, "watched", started)


@pytest.mark.slow
def test_lines_come_in_the_order_things_happened_and_a_retry_says_why(prefect_server, capsys):
    from flows.watch import watch

    started: queue.Queue = queue.Queue()
    run = threading.Thread(target=_a_flow_whose_train_stage_waits_for_a_lock_then_trains(started), daemon=True)
    run.start()
    flow_run_id = started.get(timeout=300)
    assert watch(flow_run_id, poll_s=0.2, progress_every_s=3600) == 0
    run.join(timeout=60)

    lines = [re.sub(r"^\[\d\d:\d\d:\d\d\] ", "", line) for line in capsys.readouterr().out.splitlines()]
    flow_running = next(i for i, line in enumerate(lines) if re.fullmatch(r"flow run \S+: Running", line))
    first_stage = next(i for i, line in enumerate(lines) if line.startswith("train: "))
    assert flow_running < first_stage, lines

    waiting = [line for line in lines if line.startswith("train: AwaitingRetry")]
    assert waiting and LOCKED in waiting[0], lines

    last_step = lines.index(f"train: step {STEPS - 1}/{STEPS} | loss 10.5600 | 1,530 tok/s | ETA 0:00:00")
    assert last_step < lines.index("train: Completed"), lines


def _a_flow_that_trains_for_a_while(started: queue.Queue, steps: int, step_s: float):
    from prefect import get_run_logger, task

    @task(name="train")
    def train():
        _log_steps(get_run_logger(), steps, step_s)

    return _a_flow_running(train, "watched-through-an-outage", started)


@pytest.mark.slow
def test_the_watcher_outlives_a_server_outage_and_says_so_once_each_way(prefect_server, tmp_path):
    """Before: run.sh's watcher died with an httpx traceback when the server went away, and run.sh
    printed `finished with exit code 1` while the run went on. Here `python -m flows.watch`, as run.sh starts
    it, reaches the server through a relay that is cut for 20 s mid-run; the run itself goes on, on the server. The
    watcher's client retries nothing itself (Prefect's default client retried for about a minute before a call
    failed: a 45 s outage showed nothing, a longer one was reported late and its time away short), so the outage
    is reported at its first failed call and the time away it reports is the cut's."""
    from prefect.settings import PREFECT_API_URL

    from tests.fixtures.outage import Relay

    relay = Relay(PREFECT_API_URL.value()).start()
    started: queue.Queue = queue.Queue()
    run = threading.Thread(target=_a_flow_that_trains_for_a_while(started, steps=80, step_s=0.5), daemon=True)
    run.start()
    flow_run_id = started.get(timeout=300)
    env = environ_without_prefect_settings()
    env.update(PREFECT_API_URL=relay.url, PREFECT_HOME=str(tmp_path / "home"))
    watcher = subprocess.Popen([sys.executable, "-m", "flows.watch", str(flow_run_id), "--progress-every", "0"],
                               cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(watcher.stdout), daemon=True)
    reader.start()
    try:
        assert wait_for(lambda: any("train: step" in line for line in lines), 120), lines
        relay.cut()
        cut_at = time.monotonic()
        time.sleep(CUT_S)
        relay.restore()
        cut_s = time.monotonic() - cut_at
        assert watcher.wait(timeout=180) == 0, "".join(lines)
    finally:
        relay.stop()
        if watcher.poll() is None:
            watcher.kill()
    run.join(timeout=60)
    reader.join(timeout=10)

    shown = [re.sub(r"^\[\d\d:\d\d:\d\d\] ", "", line.rstrip("\n")) for line in lines]
    assert len([line for line in shown if line.startswith("lost the Prefect server")]) == 1, shown
    (again,) = [line for line in shown if line.startswith("the Prefect server answers again")]
    away_s = float(re.fullmatch(r"the Prefect server answers again \(away (\d+) s\)", again).group(1))
    # the first failed call comes within a poll (1 s) of the cut, the first answer within a retry (2 s) of the end
    assert cut_s - 2 <= away_s <= cut_s + 3, (cut_s, shown)
    assert not any("Traceback" in line for line in shown), shown
    assert shown.index("train: step 79/80 | loss 10.0100 | 1,530 tok/s | ETA 0:00:00") < shown.index("train: Completed")
    assert re.fullmatch(r"flow run \S+: Completed", shown[-1]), shown


@pytest.mark.slow
def test_a_run_no_worker_starts_is_given_up_in_one_line_and_cancelled_at_once(prefect_server):
    """Before: a run left Pending (its worker stopped by scripts/stop.sh while it was being submitted) kept
    flows.watch, and run.sh with it, waiting for ever, and run.sh's cancel left it Cancelling for good (no worker
    to stop it). Here a run of a flow no deployment serves, so no worker ever starts it: the watcher gives up after
    the bound it names, in one line, and flows.cancel ends the run Cancelled."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    @flow(name="never-started")
    def never_started():
        pass

    with get_client(sync_client=True) as client:
        flow_run_id = client.create_flow_run(never_started).id  # Pending, in no work pool
        env = environ_without_prefect_settings()
        env.update(PREFECT_API_URL=PREFECT_API_URL.value())
        watched = subprocess.run([sys.executable, "-m", "flows.watch", str(flow_run_id), "--start-within", "2"],
                                 cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert watched.returncode == 3, watched.stdout + watched.stderr
        assert re.fullmatch(rf"error: NotStarted: no worker started flow run {flow_run_id} within 2 s of its start "
                            r"time \(it is Pending\); is a worker of its pool running\? Stop and start again: bash "
                            r"scripts/stop\.sh, then bash scripts/run\.sh\n", watched.stdout), watched.stdout
        cancelled = subprocess.run([sys.executable, "-m", "flows.cancel", str(flow_run_id), "--timeout-s", "30"],
                                   cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert cancelled.returncode == 0, cancelled.stderr
        assert client.read_flow_run(flow_run_id).state.type.value == "CANCELLED"


def _a_flow_whose_train_stage_fails_in_torchrun(started: queue.Queue):
    """A stage as the train stage runs gpt2.train: torchrun through tasks.launch, each output line logged; its child
    (tests.fixtures.failing_child) ends with one `error:` line and torchrun follows with its traceback. The flow run
    fails of the stage's error, as flows.pipeline's do (Stages.root_cause)."""
    from prefect import task

    from tasks.common import log_lines
    from tasks.launch import run_streaming, torchrun_command

    @task(name="train")
    def train():
        run_streaming(torchrun_command("tests.fixtures.failing_child", ["overflow"], nproc=1), log_lines())

    return _a_flow_running(train, "watched-failing-stage", started)


@pytest.mark.slow
def test_a_failed_stage_shows_its_child_s_output_once(prefect_server):
    """Before: the failed stage's line showed the child's error and torchrun's traceback, and the flow run's Failed
    line, whose message is the same error, showed them all again. Here the watcher, as run.sh starts
    it, follows a run whose train stage fails in torchrun: the error and the traceback come once, with the stage,
    and the flow run's line names the stage instead."""
    from prefect.settings import PREFECT_API_URL

    started: queue.Queue = queue.Queue()

    def run() -> None:
        _a_flow_whose_train_stage_fails_in_torchrun(started)(return_state=True)

    threading.Thread(target=run, daemon=True).start()
    flow_run_id = started.get(timeout=300)
    env = environ_without_prefect_settings()
    env.update(PREFECT_API_URL=PREFECT_API_URL.value())
    watched = subprocess.run([sys.executable, "-m", "flows.watch", str(flow_run_id)], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=300)
    assert watched.returncode == 1, watched.stdout + watched.stderr
    lines = watched.stdout.splitlines()
    error = "error: RuntimeError: value cannot be converted to type float without overflow"
    assert lines.count(error) == 1, watched.stdout
    assert len([line for line in lines if line.startswith("Traceback (most recent call last):")]) == 1, watched.stdout
    stage = next(i for i, line in enumerate(lines) if re.match(r"\[\d\d:\d\d:\d\d\] train: Failed: ", line))
    assert stage < lines.index(error), watched.stdout  # the child's output comes with the stage that ran it
    assert re.fullmatch(r"\[\d\d:\d\d:\d\d\] flow run \S+: Failed: CommandFailed in train, shown above", lines[-2]), \
        watched.stdout
    assert lines[-1] == f"  flow run id: {flow_run_id}", watched.stdout
