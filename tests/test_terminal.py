"""scripts/run.sh and scripts/stop.sh as a user meets them on the terminal: two run.sh started at once with no
server up share one and both return, stop.sh stops whatever run.sh started, a wrong deployment name is one line
listing the valid ones, and `.prefect/env.sh` outlives the server it points at with a message saying what to do.

Each test uses a fresh clone of the committed tree (tests/test_pipeline_deployments.py's `clone` fixture) and a
free port of its own.
"""

from __future__ import annotations

import glob
import http.server
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.fixtures.processes import environ_without_prefect_settings, free_port, prefect_processes_of
from tests.test_pipeline_deployments import clone  # noqa: F401  (a fixture)

pytestmark = pytest.mark.slow

RUN_TIMEOUT_S = 600  # two smoke runs at once on a loaded 2-core box take about 5 minutes


def _environment(port: int) -> dict[str, str]:
    environment = environ_without_prefect_settings()
    environment["PREFECT_PORT"] = str(port)
    return environment


@pytest.mark.timeout(RUN_TIMEOUT_S + 180)  # both runs within RUN_TIMEOUT_S, then stop.sh
def test_two_run_sh_at_once_share_one_server_both_complete_and_stop_sh_leaves_nothing(clone):
    """From a fresh clone: both return, one server served them, the default deployment ran every stage (its final
    evaluation, HellaSwag and loss curve are there), `stop.sh` leaves no process, and `.prefect/env.sh`, sourced
    once the server is stopped, says how to start one."""
    environment = environ_without_prefect_settings()  # no PREFECT_PORT, and 4200 taken: run.sh picks another
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 4200))
        taken.listen()
    except OSError:  # in use already: taken all the same
        pass
    commands = [["bash", "scripts/run.sh", "gpt2-hellaswag/smoke"],
                # no deployment named: the default one, gpt2-pretrain/smoke
                ["bash", "scripts/run.sh", "--param", "run_name=second"]]
    procs = [subprocess.Popen(command, cwd=clone, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True) for command in commands]
    outputs = []
    deadline = time.monotonic() + RUN_TIMEOUT_S  # for both: on the old run.sh, one of them never returned
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
    finally:
        taken.close()
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
    for command, proc, output in zip(commands, procs, outputs):
        assert proc.returncode == 0, f"{' '.join(command)}:\n{output[-4000:]}"
    assert "gpt2-hellaswag/smoke finished with exit code 0" in outputs[0]
    assert "gpt2-pretrain/smoke finished with exit code 0" in outputs[1]
    assert sum("starting the Prefect server" in output for output in outputs) == 1, outputs
    server_log = (clone / ".prefect" / "server.log").read_text()
    assert "address already in use" not in server_log.lower()
    chosen = [re.search(r"port 4200 is taken: this run's Prefect server uses port (\d+)", o) for o in outputs]
    assert any(chosen), outputs  # said before set-up, by each run.sh that found no server of the folder up
    for output in outputs:
        assert "Prefect UI:" not in output and "prefect flow-run logs" not in output  # the server stops with them
        assert "Killed" not in output  # the last one out stops the worker and reaps it without bash's job notice
    with sqlite3.connect(clone / ".prefect" / "prefect.db") as db:  # the server's SQLite database lives in the project
        flows = {name for (name,) in db.execute("select f.name from flow_run r join flow f on f.id = r.flow_id")}
    assert {"gpt2-hellaswag", "gpt2-pretrain"} <= flows
    (run_dir,) = [Path(p) for p in glob.glob(str(clone / "artifacts/runs/second/*"))]
    evaluations = sorted((run_dir / "evaluations").glob("*.json"))
    assert [p.name for p in evaluations] == ["step_00000020.json"]  # the smoke deployment's max_steps
    final = json.loads(evaluations[0].read_text())
    assert final["hellaswag"]["n"] == 8
    assert (run_dir / "loss_curve.png").is_file()
    # its last lines: the run folder (under the run's root), its final val loss and HellaSwag accuracy, and only
    # commands that work once run.sh has ended
    lines = outputs[1].strip().splitlines()
    made = lines.index(f"  run folder:   {run_dir}")
    assert lines[made + 1:made + 4] == [
        f"  val loss:     {final['val_loss']:.4f} at step 20",
        f"  HellaSwag:    acc_norm {final['hellaswag']['acc_norm']:.4f} over 8 examples",
        f"  loss curve:   {run_dir / 'loss_curve.png'}"], lines[made:]
    assert re.fullmatch(rf"  TensorBoard:  /\S+/tensorboard --logdir {re.escape(str(run_dir))}", lines[made + 4])
    rest = lines[made + 5:]  # then run.sh's own end, and at most one line of what it leaves running
    assert rest[:3] == ["", "[run] gpt2-pretrain/smoke finished with exit code 0", "  flow logs:    .prefect/worker"
                        ".log (the server stops with this script; KEEP_RUNNING=1 keeps it and its UI)"], rest
    assert len(rest) <= 4, rest
    hellaswag_lines = outputs[0].strip().splitlines()
    assert any(line.startswith(f"  hellaswag made: {clone}/artifacts/eval/") for line in hellaswag_lines), outputs[0]
    assert not any("TensorBoard" in line or "loss curve" in line for line in hellaswag_lines), outputs[0]

    stop = subprocess.run(["bash", "scripts/stop.sh"], cwd=clone, env=environment, capture_output=True, text=True,
                          timeout=120)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert not prefect_processes_of(clone)

    # `.prefect/env.sh` outlives the server it points at: sourced now, it changes nothing and says what to do
    result = subprocess.run(["bash", "-c", "source .prefect/env.sh"], cwd=clone, env=environment,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert re.fullmatch(r"error: no Prefect server answers at http://127\.0\.0\.1:\d+/api; start one with: "
                        r"KEEP_RUNNING=1 bash scripts/run\.sh\n", result.stderr), result.stderr


def _run_sh_fails(clone: Path, *args: str, port: int) -> list[str]:
    result = subprocess.run(["bash", "scripts/run.sh", *args], cwd=clone, env=_environment(port), capture_output=True,
                            text=True, timeout=RUN_TIMEOUT_S)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    return [line for line in result.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize("name, suggested", [("smoke", "gpt2-pretrain/smoke"),
                                             ("gpt2-pretrain/smok", "gpt2-pretrain/smoke")])
def test_an_unknown_deployment_is_one_line_listing_the_valid_names(clone, name, suggested):
    errors = _run_sh_fails(clone, name, port=free_port())
    assert not (clone / ".prefect" / "server.log").exists()  # refused before any server was started
    assert len(errors) == 1, errors
    guesses, listed = errors[0].split("valid names")
    assert f'"{name}"' in guesses and "did you mean" in guesses and suggested in guesses, errors
    for valid in ("gpt2-pretrain/smoke", "gpt2-train/smoke", "gpt2-pretrain/gpt2-124m", "gpt2-evaluate/scheduled"):
        assert valid in listed, errors


def test_a_taken_prefect_port_is_refused_in_one_line_before_set_up(tmp_path):
    """Before: run.sh ran scripts/setup.sh (minutes on a fresh clone) before it looked at the port. Here a folder
    holding only run.sh and kept.sh (no setup.sh, no .venv: any set-up would fail) and a PREFECT_PORT something
    listens on: the one line refusing it, naming the setting, is all run.sh says."""
    repo = Path(__file__).resolve().parent.parent
    (tmp_path / "scripts").mkdir()
    for script in ("run.sh", "kept.sh"):
        (tmp_path / "scripts" / script).write_text((repo / "scripts" / script).read_text())
    with socket.create_server(("127.0.0.1", 0)) as taken:  # listening: connections to it are accepted
        port = taken.getsockname()[1]
        result = subprocess.run(["bash", "scripts/run.sh"], cwd=tmp_path, env=_environment(port), capture_output=True,
                                text=True, timeout=60)
    assert (result.returncode, result.stdout) == (1, ""), result.stdout + result.stderr
    assert result.stderr == (f"error: PortTaken: PREFECT_PORT={port} is in use (another Prefect server?); set "
                             "PREFECT_PORT to a free port, or leave it unset to have one chosen\n"), result.stderr


def test_install_slurm_says_what_it_found():
    from tests.fixtures.slurm import missing_reason

    if reason := missing_reason():
        pytest.skip(reason)
    result = subprocess.run(["bash", "scripts/install_slurm.sh"], cwd=Path(__file__).resolve().parent.parent,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"\[slurm\] found Slurm \d+\.\d+\.\d+ and munge \d+\.\d+\.\d+: nothing to install\n",
                        result.stdout), result.stdout + result.stderr


@pytest.mark.timeout(RUN_TIMEOUT_S + 180)  # the block within RUN_TIMEOUT_S, then the cluster's stop
def test_the_docs_one_host_slurm_block_runs_as_written(clone):
    """docs/pipeline.md's one-host Slurm: install, start the cluster, export SLURM_CONF, run the Slurm smoke
    deployment through run.sh, stop the cluster, as a reader types it."""
    from tests.fixtures.slurm import SCRIPT, missing_reason
    from tests.test_docs_commands import ALL_BLOCKS

    if reason := missing_reason():
        pytest.skip(reason)
    (block,) = [b for b in ALL_BLOCKS if "slurm_single_host.sh start" in b.text]
    cluster_dir = re.search(r"slurm_single_host\.sh start (\S+)", block.text).group(1)
    try:
        result = subprocess.run(["bash", "-e", "-c", block.text], cwd=clone, env=_environment(free_port()),
                                capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    finally:  # a failed line leaves the cluster up
        subprocess.run(["bash", str(SCRIPT), "stop", cluster_dir], capture_output=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{block}:\n{output[-4000:]}"
    assert f"export SLURM_CONF={cluster_dir}/slurm.conf" in result.stdout
    assert "gpt2-train/smoke-slurm finished with exit code 0" in result.stdout, output[-4000:]
    assert "Traceback" not in output


def test_flows_cancel_says_what_it_needs_and_gives_up_in_time():
    """`python -m flows.cancel` (run.sh's Ctrl-C): help, a missing server named; a server that does not answer
    (a port nothing listens on) reported after --timeout-s with the reason, exit 1, no traceback; an answer
    waiting will not change (HTTP 404) reported at once; a second Ctrl-C stops the waiting."""
    repo = Path(__file__).resolve().parent.parent
    environment = _environment(free_port())
    command = [sys.executable, "-m", "flows.cancel"]

    def cancel(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*command, *args], cwd=repo, env=environment, capture_output=True, text=True,
                              timeout=60)

    shown = cancel("--help")
    assert shown.returncode == 0 and "--timeout-s" in shown.stdout and "Cancelling" in shown.stdout, shown.stdout
    run_id = "2f64c8e0-be87-4f31-8ea3-ee45b3dbceca"
    no_server = cancel(run_id)
    assert no_server.returncode == 2 and "set PREFECT_API_URL or pass --api-url" in no_server.stderr

    started = time.monotonic()
    away = cancel(run_id, "--timeout-s", "3", "--api-url", f"http://127.0.0.1:{free_port()}/api")
    assert away.returncode == 1, away.stderr
    assert 3 <= time.monotonic() - started < 30
    assert re.fullmatch(rf"\[run\] flow run {run_id} did not end within 3 s of the cancel \(the server did not "
                        r"answer \(.*Connection refused.*\)\)\n", away.stderr), away.stderr

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802  (the name http.server calls)
            self.send_error(404)

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started = time.monotonic()
        unknown = cancel(run_id, "--timeout-s", "30", "--api-url", f"http://127.0.0.1:{server.server_port}/api")
        server.shutdown()
    assert unknown.returncode == 1 and time.monotonic() - started < 20, unknown.stderr  # not the 30 s
    assert re.fullmatch(rf"\[run\] flow run {run_id} could not be cancelled at http://127\.0\.0\.1:\d+/api: "
                        r"HTTP Error 404: Not Found\n", unknown.stderr), unknown.stderr

    with socket.create_server(("127.0.0.1", 0)) as hung:  # a server that accepts and never answers
        hung.settimeout(60)
        waiting = subprocess.Popen([*command, run_id, "--api-url", f"http://127.0.0.1:{hung.getsockname()[1]}/api"],
                                   cwd=repo, env=environment, stderr=subprocess.PIPE, text=True,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        connection, _ = hung.accept()  # its first request is out: it is waiting for the answer
        waiting.send_signal(signal.SIGINT)
        assert waiting.wait(timeout=10) == 130
        connection.close()
    assert waiting.stderr.read() == f"[run] not waiting for flow run {run_id} to end\n"


def test_stop_sh_says_stopped_only_once_the_process_is_gone(tmp_path):
    """A worker that ignores SIGTERM is killed after its grace; the kernel then frees its memory for tenths of a
    second before the process is gone, and stop.sh returned during that time saying "stopped" (the docs' stop.sh
    block found the server it had just "stopped" still alive, in a full run)."""
    repo = Path(__file__).resolve().parent.parent
    (tmp_path / "scripts").mkdir()
    for script in ("stop.sh", "kept.sh"):
        (tmp_path / "scripts" / script).write_text((repo / "scripts" / script).read_text())
    hold = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); memory = bytearray(2 << 30); "
            "print('ready', flush=True); time.sleep(120)")
    # a stand-in for run.sh's worker: its own session, 'prefect' in its command line (all kept_pid checks)
    worker = subprocess.Popen([sys.executable, "-c", hold, "prefect-worker-stand-in"], stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        assert worker.stdout.readline() == "ready\n"
        (tmp_path / ".prefect").mkdir()
        (tmp_path / ".prefect" / "worker.pid").write_text(f"{worker.pid}\n")
        stop = subprocess.run(["bash", "scripts/stop.sh"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        state = Path(f"/proc/{worker.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]  # our child: Z until reaped
        assert f"[stop] worker (pid {worker.pid}) stopped" in stop.stdout, stop.stdout + stop.stderr
        assert state == "Z", f"stop.sh said stopped while the worker was still in state {state}"
    finally:
        worker.kill()
        worker.wait()


@pytest.mark.timeout(RUN_TIMEOUT_S + 180)
def test_stop_sh_during_a_submission_waits_and_a_cancelled_run_sh_leaves_no_run_pending(clone):
    """Before: run.sh released its lock before `prefect deployment run`, so a stop.sh then stopped the worker under
    a run being submitted: the run stayed Pending for good, run.sh waited with no limit, and its cancel left the
    run Cancelling. Here the run is submitted to start in an hour (`--start-in`, passed on to `prefect deployment
    run`), so it is between submission and start for as long as the test needs: stop.sh waits for run.sh's lock;
    SIGTERM to run.sh ends the run Cancelled (no worker needed for a run none started), then stop.sh goes on and
    nothing is left running."""
    environment = _environment(free_port())
    run = subprocess.Popen(["bash", "scripts/run.sh", "gpt2-hellaswag/smoke", "--start-in", "1 hour"], cwd=clone,
                           env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    stop = None
    lines: list[str] = []
    try:
        for line in run.stdout:
            lines.append(line)
            if line.startswith("[run] flow run "):  # submitted: Scheduled, an hour from its start
                break
        flow_run_id = lines[-1].split()[3]
        stop = subprocess.Popen(["bash", "scripts/stop.sh"], cwd=clone, env=environment, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        assert stop.stdout.readline().startswith("[stop] waiting for another scripts/run.sh"), "stop.sh did not wait"
        os.killpg(run.pid, signal.SIGTERM)
        lines += run.stdout.readlines()
        assert run.wait(timeout=180) == 130, "".join(lines)
        stopped = stop.communicate(timeout=180)[0]
        assert stop.returncode == 0, stopped
    finally:
        for proc in (run, stop):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert f"[run] flow run {flow_run_id}: CANCELLED\n" in lines, "".join(lines)
    with sqlite3.connect(clone / ".prefect" / "prefect.db") as db:  # (the scheduled evaluation's runs beside it)
        states = {str(run_id).replace("-", ""): state for run_id, state in db.execute("select id, state_type from flow_run")}
    assert states[flow_run_id.replace("-", "")] == "CANCELLED", states  # not Scheduled, Pending or Cancelling
    assert not prefect_processes_of(clone)


@pytest.mark.timeout(RUN_TIMEOUT_S + 180)
def test_a_run_no_worker_starts_ends_run_sh_in_one_line_and_is_cancelled(clone):
    """Before: run.sh followed a run no worker would start (its worker gone or hung) with no limit, and its cancel
    left such a run Cancelling. Here the worker run.sh finds running is a stand-in that never asks for runs (a
    process with `prefect` in its command line, in .prefect/worker.pid, as kept_pid checks): the watcher gives up
    RUN_START_WITHIN_S after the run's start time in one line saying what to run, run.sh cancels the run (Cancelled
    at once) and ends 1. On the way, two more of run.sh's own ends, each one line: the `.prefect/keep` of a kept
    server that has since died is dropped saying so (before: silently), and a second run.sh, joining the server
    the first one kept, fails at `prefect deployment run` (a start time it cannot parse) with SubmitFailed."""
    environment = {**_environment(free_port()), "RUN_START_WITHIN_S": "1"}
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)", "prefect-worker-stand-in"],
                                start_new_session=True)
    try:
        (clone / ".prefect" / "worker.pid").write_text(f"{stand_in.pid}\n")
        (clone / ".prefect" / "keep").touch()  # left by KEEP_RUNNING=1; no server runs
        given_up = subprocess.run(["bash", "scripts/run.sh", "gpt2-hellaswag/smoke"], cwd=clone,
                                  env={**environment, "KEEP_RUNNING": "1"}, capture_output=True, text=True,
                                  timeout=RUN_TIMEOUT_S)
        refused = subprocess.run(["bash", "scripts/run.sh", "gpt2-hellaswag/smoke", "--start-in", "not a time"],
                                 cwd=clone, env=environment, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        stop = subprocess.run(["bash", "scripts/stop.sh"], cwd=clone, env=environment, capture_output=True, text=True,
                              timeout=120)
        stopped = stand_in.poll()  # by stop.sh: a SIGTERM to its group, as to any worker it stops
    finally:
        stand_in.kill()
        stand_in.wait()
        if prefect_processes_of(clone):  # a run.sh did not end: stop what it started
            subprocess.run(["bash", "scripts/stop.sh"], cwd=clone, env=environment, capture_output=True, timeout=120)
    output = given_up.stdout + given_up.stderr
    assert given_up.returncode == 1, output[-3000:]
    assert ("[run] the Prefect server kept by KEEP_RUNNING=1 is no longer running; this run starts one, which stops "
            "at its end unless KEEP_RUNNING=1 is set again\n") in given_up.stdout, output[-3000:]
    assert f"[run] using the worker already running (pid {stand_in.pid})" in given_up.stdout, output[-3000:]
    flow_run_id = re.search(r"^\[run\] flow run (\S+) \(UI", given_up.stdout, re.M).group(1)
    (not_started,) = [line for line in output.splitlines() if "NotStarted" in line]
    assert re.fullmatch(rf"error: NotStarted: no worker started flow run {flow_run_id} within 1 s of its start time "
                        r"\(it is (Scheduled|Late)\); is a worker of its pool running\? Stop and start again: bash "
                        r"scripts/stop\.sh, then bash scripts/run\.sh", not_started), output[-3000:]
    assert f"[run] flow run {flow_run_id}: CANCELLED\n" in given_up.stderr, output[-3000:]
    assert "Traceback" not in output and "finished with exit code" not in output, output[-3000:]
    with sqlite3.connect(clone / ".prefect" / "prefect.db") as db:  # (the scheduled evaluation's runs beside it)
        states = {str(run_id).replace("-", ""): state for run_id, state in db.execute("select id, state_type from flow_run")}
    assert states[flow_run_id.replace("-", "")] == "CANCELLED", states

    assert refused.returncode == 1 and "[run] using the server already running" in refused.stdout, refused.stderr
    assert refused.stderr == ("error: SubmitFailed: prefect deployment run gpt2-hellaswag/smoke failed: Unable to parse "
                              "scheduled start time 'in not a time'. (its whole output: .prefect/submit.log)\n"), \
        refused.stdout + refused.stderr

    assert stop.returncode == 0 and stopped == -signal.SIGTERM, (stop.stdout + stop.stderr, stopped)
    assert not prefect_processes_of(clone)
