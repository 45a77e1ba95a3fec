"""The README's run command (scripts/run.sh) from a fresh clone: server, work pool, deployments, worker, run.

On a real PostgreSQL started here with a stage deployment, and interrupted (Ctrl-C, SIGTERM) while it trains.
Each uses a clone of the committed tree, whose .venv is a link to this checkout's, so nothing is written
into the working tree. The default deployment on the embedded SQLite database, from a fresh clone, is
tests/test_terminal.py's two run.sh at once.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shutil
import signal
import sqlite3
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.fixtures.deployed import seeded_home
from tests.fixtures.processes import (environ_without_prefect_settings, free_port, lower_priority,
                                      prefect_processes_of, training_processes, wait_for)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 600


@pytest.fixture
def clone(tmp_path) -> Path:
    """A fresh clone of the committed tree, sharing this checkout's virtual environment."""
    path = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(path)], check=True)
    if (path / "pyproject.toml").read_bytes() != (REPO / "pyproject.toml").read_bytes():
        pytest.skip("pyproject.toml has uncommitted changes: setup.sh in the clone would reinstall the shared .venv")
    # the shared environment must be installed from this checkout, so that setup.sh in the clone is a no-op
    subprocess.run(["bash", "scripts/setup.sh"], cwd=REPO, check=True, capture_output=True)
    (path / ".venv").symlink_to(REPO / ".venv")
    seeded_home(path / ".prefect")  # scripts/run.sh's PREFECT_HOME, its database already made (tests/fixtures/deployed.py)
    return path


def run_sh(clone: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environment = environ_without_prefect_settings()
    environment.update(PREFECT_PORT=str(free_port()), **(env or {}))
    result = subprocess.run(["bash", "scripts/run.sh", *args], cwd=clone, env=environment, capture_output=True,
                            text=True, timeout=RUN_TIMEOUT_S)
    worker_log = clone / ".prefect" / "worker.log"
    assert result.returncode == 0, (f"run.sh failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}\n"
                                    f"worker log:\n{worker_log.read_text()[-3000:] if worker_log.exists() else ''}")
    return result


# ---------------------------------------------------------------------------------------------------------
# PostgreSQL


def _postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb")) or ([shutil.which("initdb")] if shutil.which("initdb") else [])
    return Path(found[-1]).parent if found else None


@pytest.fixture
def postgres():
    """A throwaway PostgreSQL server on a free port; yields its SQLAlchemy URL for Prefect."""
    bindir = _postgres_bin()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (scripts/install_postgres.sh installs it)")
    # the server refuses to run as root: run it as the package's postgres user, in a folder it owns
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    data = Path(tempfile.mkdtemp(prefix="gpt2-pipeline-pg-"))
    if as_postgres:
        user = pwd.getpwnam("postgres")
        os.chown(data, user.pw_uid, user.pw_gid)
    port = free_port()
    subprocess.run([*as_postgres, str(bindir / "initdb"), "-D", str(data / "db"), "-U", "postgres", "--auth=trust",
                    "-E", "UTF8"], check=True, capture_output=True)
    subprocess.run([*as_postgres, str(bindir / "pg_ctl"), "-D", str(data / "db"), "-l", str(data / "log"), "-w",
                    "-o", f"-p {port} -k {data} -h 127.0.0.1", "start"], check=True, capture_output=True)
    try:
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/postgres", port
    finally:
        subprocess.run([*as_postgres, str(bindir / "pg_ctl"), "-D", str(data / "db"), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


def test_run_sh_on_a_postgresql_backed_server(clone, postgres):
    url, port = postgres
    sqlite_db = clone / ".prefect" / "prefect.db"  # the clone's copy of a made database (the clone fixture)
    before = sqlite_db.read_bytes()
    result = run_sh(clone, "gpt2-hellaswag/smoke", env={"PREFECT_API_DATABASE_CONNECTION_URL": url})
    assert "gpt2-hellaswag/smoke finished with exit code 0" in result.stdout
    assert sqlite_db.read_bytes() == before and not sqlite_db.with_name("prefect.db-wal").exists()  # nothing went to SQLite

    def query(sql: str) -> list[str]:
        out = subprocess.run([str(_postgres_bin() / "psql"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
                              "-tAc", sql], check=True, capture_output=True, text=True).stdout
        return out.split()

    # the deployments and the flow runs are rows of PostgreSQL tables
    assert int(query("select count(*) from deployment")[0]) == len(_deployments())
    runs = query("select f.name || ':' || r.state_type from flow_run r join flow f on f.id = r.flow_id")
    assert [r for r in runs if r.startswith("gpt2-hellaswag:")] == ["gpt2-hellaswag:COMPLETED"]
    assert "gpt2-evaluate:SCHEDULED" in runs  # the scheduler filled in gpt2-evaluate/scheduled's interval
    assert len(list((clone / "artifacts/eval/hellaswag").glob("*/hellaswag_val.bin"))) == 1  # one folder per source


def _deployments() -> list[dict]:
    import yaml

    return yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]


# ---------------------------------------------------------------------------------------------------------
# Ctrl-C and SIGTERM of run.sh: the flow run is cancelled and its training processes stop


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm", "ctrl-c, server hung"])
def test_interrupting_run_sh_cancels_the_flow_run_and_stops_training(clone, how):
    """Ctrl-C (SIGINT to run.sh's process group) or SIGTERM (run.sh alone) while training runs: the run ends
    Cancelled, run.sh exits 130 and nothing of it is left. With the server hung (SIGSTOP: a stalled database,
    a frozen host) nothing can be cancelled: run.sh still ends in bounded time, saying so, and stopping its
    worker takes the flow run's processes with it."""
    run_name = "interrupted-" + re.sub(r"\W+", "-", how)
    environment = environ_without_prefect_settings()
    environment["PREFECT_PORT"] = str(free_port())
    # a training run that would go on for hours
    args = ["gpt2-train/smoke", "--param", f"run_name={run_name}", "--param", "max_steps=1000000",
            "--param", "checkpoint_every=0", "--param", "val_every=0"]
    # its own session, as a terminal's foreground job: Ctrl-C is SIGINT to the whole group, and SIGINT is not
    # ignored (it would be if pytest had been started with `nohup ... &` from a script, and bash cannot trap a
    # signal ignored when it starts); its output goes to a file, so that what it said is there however it ends
    log_path = clone.parent / "run_sh.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(["bash", "scripts/run.sh", *args], cwd=clone, env=environment, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    server = None
    try:
        assert wait_for(lambda: len(training_processes(run_name)) >= 2, RUN_TIMEOUT_S), "training did not start"
        if how.endswith("server hung"):
            server = int((clone / ".prefect" / "server.pid").read_text())  # setsid: its own process group
            os.killpg(server, signal.SIGSTOP)
            # nothing reaches training until run.sh stops its worker (after flows.cancel's 90 s): it waits at the
            # lowest priority meanwhile
            lower_priority((pid for pid, _ in training_processes(run_name)), 19)
        if how.startswith("ctrl-c"):
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)  # run.sh alone, as `kill` or a batch system would
        # flows.cancel's 90 s, then stopping worker (3 s) and server (20 s), with room for a loaded machine
        try:
            returncode = proc.wait(timeout=240)
        except subprocess.TimeoutExpired:
            returncode = None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if server is not None:
            with contextlib.suppress(ProcessLookupError):  # whatever the test found: no stopped server is left
                os.killpg(server, signal.SIGKILL)
    output = log_path.read_text()
    assert returncode == 130, output[-3000:]
    assert wait_for(lambda: not training_processes(run_name), 30), training_processes(run_name)
    assert wait_for(lambda: not prefect_processes_of(clone), 30), prefect_processes_of(clone)
    if how.endswith("server hung"):
        assert "did not end within 90 s of the cancel (the server did not answer" in output, output[-3000:]
        return
    # the flow run's final state, as recorded in the (stopped) server's database
    with sqlite3.connect(clone / ".prefect" / "prefect.db") as db:
        states = db.execute("select f.name, r.state_type from flow_run r join flow f on f.id = r.flow_id "
                            "where f.name = 'gpt2-train'").fetchall()
    assert states == [("gpt2-train", "CANCELLED")], output[-3000:]
    assert re.search(r"\[run\] flow run [0-9a-f-]{36}: CANCELLED\n", output), output[-3000:]
