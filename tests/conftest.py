"""Shared test set-up.

Without a GPU, Triton kernels run on CPU tensors through Triton's interpreter. The variable is read
when a kernel is decorated, so it is set here, before any test module imports `gpt2_kernels`.

Every process of the suite computes on one thread (OMP_NUM_THREADS=1, inherited by the servers, workers, flow
runs and training ranks the tests start; set before torch is imported here): the suite runs more processes
than cores, and OpenMP's threads spin while they wait for each other, taking the CPU the other processes need
(a CPU training rank beside one other: 13 CPU-seconds on two threads, 7.5 on one). A value already set wins.

Every Prefect client the suite's processes make trusts one certificate authority (PREFECT_API_SSL_CERT_FILE, kept
by `environ_without_prefect_settings`): Prefect builds a TLS context for each client it makes, by default from
certifi's whole bundle (about 25 ms of CPU), even for an http:// API such as every server the suite starts; a
deploy makes about 75 clients (13 CPU-seconds with the bundle, 8.5 with one certificate), a flow run a dozen.

The end-to-end tier shares one server per test process: a real Prefect server with the deployments and a worker
(`server`, `worker`), which the flows a test calls in this process use too (`prefect_server`), started when a
test first asks for it. It is stopped once the next module of its process does not use it (an idle server still
takes CPU the other processes need: a second or two a minute) and started again, on its database, for a later
one that does.
"""

import os
import re
import sys
import tempfile
from pathlib import Path

import certifi

os.environ.setdefault("OMP_NUM_THREADS", "1")
# Python keeps each module's bytecode beside it (__pycache__, ignored by git) even where the environment said not
# to (PYTHONDONTWRITEBYTECODE): the suite starts about 750 Python processes in this tree, its copies and its
# clones (flow runs, trainings, CLI commands), and each would compile the project's modules again on import
# (about 0.1 CPU-second for the ~40 a flow run imports). Installed packages have theirs already (setup.sh).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# A Prefect client with no API to talk to starts Prefect's temporary server (a subprocess, about 15 CPU-seconds,
# that fails the test where it takes longer than its start-up timeout to answer, as on a loaded machine). No
# test wants one: a test's flows run against the suite's server (`prefect_server`), and a test of a stage
# outside any run gives it an API that is away (tests/fixtures/outage.py). Here such a client fails at once,
# naming PREFECT_API_URL.
os.environ["PREFECT_SERVER_ALLOW_EPHEMERAL_MODE"] = "false"


def _one_certificate_authority() -> str:
    """certifi's first certificate alone, in a file of this user's temporary folder (written whole: several
    test processes start at once)."""
    path = Path(tempfile.gettempdir()) / f"gpt2-tests-ca-{os.getuid()}.pem"
    if not path.exists():
        bundle = Path(certifi.where()).read_text()
        first = re.search(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----\n", bundle, re.S).group(0)
        partial = path.with_name(f"{path.name}.{os.getpid()}")
        partial.write_text(first)
        os.replace(partial, path)
    return str(path)


os.environ.setdefault("PREFECT_API_SSL_CERT_FILE", _one_certificate_authority())

import pytest  # noqa: E402
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# an end-to-end test's own limit, under pyproject.toml's global one: a test that hangs fails on its own, naming
# what it waited for, and its fixtures stop what it started
SLOW_TEST_TIMEOUT_S = 600


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects by marker
def pytest_collection_modifyitems(config, items):
    # a test on the suite's Prefect server is end-to-end, marked or not: the unit tier never starts one (a server,
    # its work pool and deployments are about 20 CPU-seconds, which one unmarked test made the unit tier pay)
    for item in items:
        if "server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    # the end-to-end tier first: under `--dist loadfile` the longest modules start first, not last
    items.sort(key=lambda item: "slow" not in item.keywords)
    for item in items:
        if "slow" in item.keywords and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_TEST_TIMEOUT_S))
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test stopped by its timeout says what it was waiting for (tests/fixtures/processes.py, wait_for)."""
    from tests.fixtures.processes import INTERRUPTED_WAIT

    report = (yield).get_result()
    if report.failed and call.excinfo is not None and "Timeout" in str(call.excinfo.value) and INTERRUPTED_WAIT:
        report.sections.append(("timeout", f"waiting for: {INTERRUPTED_WAIT.pop()}"))


@pytest.fixture(autouse=True)
def _a_flow_run_ending_ends_with_its_test():
    """A flow that failed in this process leaves `tasks.launch` refusing to start any command ("the flow run is
    ending"), as it should in a flow run's own process, which exits next. Here the next test starts as a new
    process would: a module calling `run_streaming` directly failed whole where an earlier module of the same
    pytest process had run such a flow (xdist hands each process its modules in no fixed order)."""
    yield
    if launch := sys.modules.get("tasks.launch"):
        launch._stopping.clear()


@pytest.fixture(scope="module")
def prefect_server(server, tmp_path_factory):
    """The suite's server (`server`) for the flows this module calls in this process, their results stored in a
    folder of the module's own; yields a fresh folder for the module's outputs. Tests find their runs by id, key
    or name, never as the only runs on the server."""
    from prefect.context import _temporary_global_settings_context, get_settings_context
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, PREFECT_LOCAL_STORAGE_PATH, temporary_settings

    with temporary_settings({PREFECT_API_URL: server.api_url,
                             PREFECT_LOCAL_STORAGE_PATH: tmp_path_factory.mktemp("results")}):
        # the settings of threads too, which start without this one's context (a flow a test runs in a thread):
        # as Prefect's own test harness does
        with _temporary_global_settings_context(get_settings_context()):
            yield tmp_path_factory.mktemp("pipeline")
        # the module's logs and events reach the server before it may be stopped (pytest_runtest_teardown)
        APILogWorker.drain_all(timeout=60)
        EventsWorker.drain_all(timeout=60)


_SHARED_SERVER = []  # the `server` fixture's, once started


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """A real server with prefect.yaml's deployments of a copy of this working tree (tests/fixtures/deployed.py),
    shared by every test of this process: each test keeps to its own run_name, dataset or runs_dir."""
    from tests.fixtures.deployed import serving_this_tree

    with serving_this_tree(tmp_path_factory.mktemp("server")) as s:
        _SHARED_SERVER.append(s)
        yield s


def pytest_runtest_setup(item):
    if "server" in item.fixturenames and _SHARED_SERVER and not _SHARED_SERVER[0].running:
        _SHARED_SERVER[0].start()  # stopped after an earlier module (below); the `worker` fixture restarts its worker


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield  # the module's own fixtures end first: runs they started have ended or were given up
    if _SHARED_SERVER and _SHARED_SERVER[0].running and not _next_uses_the_server(item, nextitem):
        _SHARED_SERVER[0].stop()


def _next_uses_the_server(item, nextitem) -> bool:
    return nextitem is not None and (nextitem.module is item.module or "server" in nextitem.fixturenames)


@pytest.fixture
def worker(server):
    """The server's worker (started again where an earlier test killed it)."""
    return server.worker()
