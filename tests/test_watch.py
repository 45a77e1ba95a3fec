"""What scripts/run.sh shows while a run goes on (`python -m flows.watch`), against a real Prefect server: lines in
the order things happened, and a stage waiting for a retry says why (a run directory locked by another run)."""

from __future__ import annotations

import queue
import re
import threading

import pytest

LOCKED = "RunDirLocked: artifacts/runs/smoke/1 is being written by pid 1874 on host-a; it is retried"
STEPS = 25


def _a_flow_whose_train_stage_waits_for_a_lock_then_trains(started: queue.Queue):
    from prefect import flow, get_run_logger, runtime, task

    attempts = []

    @task(name="train", retries=1, retry_delay_seconds=2)
    def train():
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError(LOCKED)
        logger = get_run_logger()
        for step in range(STEPS):  # gpt2.train's console lines (gpt2/train.py, _step_line)
            logger.info(f"step {step:5d}/{STEPS} | loss {10.8 - step / 100:.6f} | lr 6.00e-04 | norm 1.2345 | "
                        f"120.0 ms | 1,530 tok/s")

    @flow(name="watched")
    def watched():
        started.put(runtime.flow_run.id)
        train()

    return watched


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
