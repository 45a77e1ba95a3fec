"""Server outages, through a real Prefect server, worker and CLI.

The server is SIGKILLed mid-training and kept down for over a minute -- long enough for the worker's
cancellation observers to give up ("Cancellation observer failed") and for the API client's own retries to
run out -- then restarted on the same database. Training goes on through the outage, the same processes,
never failed or retried for it (tasks/retry.py, best_effort); `prefect flow-run cancel` afterwards (what the UI's button does) stops it within a minute, no
later stage runs, and the run ends Cancelled (tasks/cancel_watch.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.fixtures.deployed import (serving_this_tree, task_runs, task_states, wait_for_final_state,
                                     wait_until)
from tests.fixtures.processes import (environ_without_prefect_settings, lower_priority, training_processes,
                                      wait_for)

pytestmark = pytest.mark.slow

# beyond the API client's retries of one request (about a minute), and over the minute in which the worker's
# websocket and polling cancellation observers both give up
LONG_OUTAGE_S = 110
CANCEL_DEADLINE_S = 60


@pytest.fixture
def killable_server(tmp_path):
    """A server of this test's own: the test kills it and starts it again on the same database."""
    with serving_this_tree(tmp_path) as s:
        yield s


def _progress(killable_server, flow_run_id: str) -> float | None:
    """The training progress artifact's percent, as the UI shows it."""
    request = urllib.request.Request(
        f"{killable_server.env['PREFECT_API_URL']}/artifacts/filter", method="POST",
        data=json.dumps({"artifacts": {"type": {"any_": ["progress"]}, "flow_run_id": {"any_": [flow_run_id]}}}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        artifacts = json.load(response)
    return max((float(a["data"]) for a in artifacts if a["key"].startswith("train-progress")), default=None)


def test_training_outlasts_a_long_server_outage_and_a_later_cancel_stops_it_and_every_later_stage(killable_server):
    """With the server away for LONG_OUTAGE_S, training goes on: the same processes, on its first attempt (finding
    7: the progress update from the training output callback raised ConnectError about 68 s into a 93 s outage,
    and training was killed). The worker's cancellation observers gave up meanwhile; a cancel afterwards still
    stops training within CANCEL_DEADLINE_S, no later stage runs, and the run ends Cancelled."""
    worker = killable_server.start_worker("outage")
    try:
        # 3000 steps: a whole percent every 30 steps, so progress is sent again and again during the outage, and
        # training outlasts it even on an idle machine (the run is cancelled once checked)
        flow_run_id = killable_server.run("gpt2-pretrain/smoke", "--param", "run_name=outage", "--param", "max_steps=3000",
                                 "--param", "checkpoint_every=0", "--param", "val_every=0")
        wait_until(lambda: (_progress(killable_server, flow_run_id) or 0) >= 1 and len(training_processes("outage")) >= 2,
                   600, "training to run and report progress")
        before = sorted(pid for pid, _ in training_processes("outage"))
        lower_priority(before, 10)  # through the outage it still steps and reports progress, at a fraction of a core
        worker_log = killable_server.logs / "worker-outage.log"

        killable_server.kill()
        time.sleep(LONG_OUTAGE_S)
        assert sorted(pid for pid, _ in training_processes("outage")) == before, \
            f"training was killed (or restarted) during the outage:\n{worker_log.read_text()[-3000:]}"
        killable_server.start()
        assert sorted(pid for pid, _ in training_processes("outage")) == before
        assert "Cancellation observer failed" in worker_log.read_text(), "the worker's observers did not give up"
        train = task_runs(killable_server, flow_run_id)["train"]
        assert (train["state"]["type"], train["run_count"]) == ("RUNNING", 1), train

        started = time.monotonic()
        killable_server.prefect("flow-run", "cancel", flow_run_id)  # what the UI's Cancel button does
        wait_for(lambda: not training_processes("outage"), CANCEL_DEADLINE_S)
        assert training_processes("outage") == [], f"training still runs {CANCEL_DEADLINE_S} s after the cancel"
        assert time.monotonic() - started < CANCEL_DEADLINE_S

        run = wait_for_final_state(killable_server, flow_run_id, 120)
        assert run["state"]["type"] == "CANCELLED", run["state"]
        stages = task_states(killable_server, flow_run_id)
        assert stages["train"] != "Completed" and not {"evaluate", "sample", "export"} & set(stages), stages
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


# ---------------------------------------------------------------------------------------------------------
# an outage during the data stages' progress updates (a relay in front of the suite's server)

TOKENIZE_FLOW = "import json, sys; from flows.pipeline import tokenize_flow; tokenize_flow(**json.loads(sys.argv[1]))"


def _corpus(path, documents: int = 30_000, words: int = 300):
    """A local corpus whose tokenization takes some seconds: progress is reported every 1000 documents."""
    import random

    rng = random.Random(0)
    vocabulary = "the of and a to in is you that it he was for on are as with his they at be this have from".split()
    with open(path, "w") as f:
        for _ in range(documents):
            f.write(json.dumps({"text": " ".join(rng.choice(vocabulary) for _ in range(words))}) + "\n")
    return path


def test_an_outage_during_tokenizes_progress_updates_costs_an_update_not_the_stage(prefect_server, tmp_path):
    """Before: with the server away during tokenize, `update_progress_artifact` raised ConnectError
    and failed the stage and the flow. The relay cuts the flow's connection to the server at tokenize's first
    progress update and restores it a second later (client retries off, so the update fails at once)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.settings import PREFECT_API_URL

    from flows.config import check_settings
    from tasks.common import artifact_key

    from tests.fixtures.outage import Relay
    from tests.test_pipeline_flows import REPO, smoke_params

    relay = Relay(PREFECT_API_URL.value()).start()
    relay.cut_on(b"PATCH /api/artifacts/", outage_s=1.0)  # the first update after the artifact was created
    params = smoke_params(tmp_path / "out", source=str(_corpus(tmp_path / "corpus.jsonl")), dataset="outage")
    env = environ_without_prefect_settings()
    env.update(PREFECT_API_URL=relay.url, PREFECT_CLIENT_MAX_RETRIES="0", PREFECT_HOME=str(tmp_path / "home"),
               PREFECT_LOCAL_STORAGE_PATH=str(tmp_path / "results"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    try:
        flow = subprocess.run([sys.executable, "-c", TOKENIZE_FLOW, json.dumps(params)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=600)
    finally:
        relay.stop()
    output = flow.stdout + flow.stderr
    assert relay.cuts >= 1, "the outage never happened: no progress update was sent"
    assert flow.returncode == 0, output[-4000:]
    assert "could not send progress tokenize-progress-outage" in output, output[-4000:]
    with get_client(sync_client=True) as client:
        settings = check_settings(params)
        key = ArtifactFilter(key=ArtifactFilterKey(any_=[artifact_key("tokenize-progress", "outage",
                                                                      folder=settings.shards_dir)]))
        (artifact,) = client.read_artifacts(artifact_filter=key)
    assert float(artifact.data) == 100.0  # the last update went through once the server answered again
