"""The documented commands, as users type them: every fenced block of README.md and docs/*.md.

Each block is preceded by a marker line `<!-- docs-test: KIND -->`. `run` blocks are run here as written,
in document order, by `bash -e` in one fresh clone of the committed tree, in the shell a reader who
followed the docs has: `.prefect/env.sh` sourced when a kept server (KEEP_RUNNING=1) wrote it. Their outcome
is checked (exit status, "finished successfully" of every watched run, what the stop command leaves).
Blocks of the other kinds cannot run here (a GPU, the internet, a cluster) or are not commands; the test
lists them, so none is forgotten.

Beside the blocks, what the docs promise about those commands: every stage deployment reruns its stage
with `--param force=true` while the stages it needs come from cache, and a failed run shows its cause on
the terminal and in the flow run's state message (`prefect flow-run inspect`). One kept server and worker
serve the whole module.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures.processes import environ_without_prefect_settings, free_port
from tests.fixtures.deployed import stage_states

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
KINDS = ("run", "needs-gpu", "needs-internet", "needs-cluster", "not-a-command")
MARKER = re.compile(r"^<!-- docs-test: (\S+) -->$")
BLOCK_TIMEOUT_S = 600


@dataclass(frozen=True)
class Block:
    doc: str  # relative to the repository root
    line: int  # the opening fence's line, 1-based
    kind: str | None  # None: no marker
    text: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}"


def fenced_blocks(doc: Path) -> list[Block]:
    """Every fenced block of `doc`, with the kind its marker line (the line right above the fence) names."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    blocks, start = [], None
    for i, line in enumerate(lines):
        if not line.startswith("```"):
            continue
        if start is None:
            start = i
            continue
        marker = MARKER.match(lines[start - 1]) if start > 0 else None
        blocks.append(Block(str(doc.relative_to(REPO)), start + 1, marker and marker.group(1),
                            "\n".join(lines[start + 1:i]) + "\n"))
        start = None
    return blocks


ALL_BLOCKS = [block for doc in DOCS for block in fenced_blocks(doc)]
RUN_BLOCKS = [block for block in ALL_BLOCKS if block.kind == "run"]


def test_every_block_is_marked_with_a_known_kind():
    unmarked = [str(b) for b in ALL_BLOCKS if b.kind is None]
    unknown = [f"{b}: {b.kind}" for b in ALL_BLOCKS if b.kind is not None and b.kind not in KINDS]
    assert not unmarked, f"fenced blocks without a `<!-- docs-test: KIND -->` line right above them: {unmarked}"
    assert not unknown, f"unknown kinds (known: {', '.join(KINDS)}): {unknown}"


def test_blocks_that_do_not_run_here_are_listed():
    """What this test cannot run, by kind: printed with the block's first line (pytest -s, or -rA)."""
    for kind in KINDS[1:]:
        blocks = [b for b in ALL_BLOCKS if b.kind == kind]
        print(f"\n{kind}: {len(blocks)} block(s)")
        for b in blocks:
            print(f"  {b}: {b.text.splitlines()[0][:100] if b.text.strip() else '(empty)'}")
    assert RUN_BLOCKS, "no block is marked `run`"


TRAINING_DEPLOYMENT = re.compile(r"^\s*prefect deployment run gpt2-(?:pretrain|train)/\S+.*--watch", flags=re.M)


def test_no_block_follows_training_with_prefects_watch():
    """`prefect deployment run --watch` shows Prefect's events and never a training step: a reader who follows a
    training run that way sees no progress. The docs follow training with run.sh (or flows.watch)."""
    watched = [f"{b}: {line.strip()}" for b in RUN_BLOCKS for line in TRAINING_DEPLOYMENT.findall(b.text)]
    assert not watched, f"training followed with --watch (no step, loss or ETA line ever shows): {watched}"


# ---------------------------------------------------------------------------------------------------------
# one clone, one kept server and worker


@dataclass
class Clone:
    path: Path
    env: dict[str, str]  # no PREFECT_* of the test process; PREFECT_PORT: a free port

    def bash(self, script: str, timeout: float = BLOCK_TIMEOUT_S) -> subprocess.CompletedProcess:
        """`script` in a bash -e shell of the clone, after `source .prefect/env.sh` where that file exists (once
    its server is stopped, sourcing it changes nothing)."""
        prologue = "if [ -f .prefect/env.sh ]; then source .prefect/env.sh 2>/dev/null || true; fi\n"
        return subprocess.run(["bash", "-e", "-c", prologue + script], cwd=self.path, env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def api(self, path: str, body: dict | None = None):
        url = self.api_url() + path
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)

    def api_url(self) -> str:
        env_sh = (self.path / ".prefect" / "env.sh").read_text()
        return re.search(r'PREFECT_API_URL="([^"]+)"', env_sh).group(1)

    def task_states(self, flow_run_id: str) -> dict[str, str]:
        runs = self.api("/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}})
        return stage_states(runs)

    def kept_pids(self) -> list[int]:
        home = self.path / ".prefect"
        return [int((home / f"{name}.pid").read_text()) for name in ("server", "worker")
                if (home / f"{name}.pid").exists()]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Clone:
    path = tmp_path_factory.mktemp("docs") / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(path)], check=True)
    if (path / "pyproject.toml").read_bytes() != (REPO / "pyproject.toml").read_bytes():
        pytest.skip("pyproject.toml has uncommitted changes: setup.sh in the clone would reinstall the shared .venv")
    subprocess.run(["bash", "scripts/setup.sh"], cwd=REPO, check=True, capture_output=True)
    (path / ".venv").symlink_to(REPO / ".venv")
    env = environ_without_prefect_settings()
    env["PREFECT_PORT"] = str(free_port())
    c = Clone(path, env)
    yield c
    pids = c.kept_pids()
    c.bash("bash scripts/stop.sh", timeout=120)
    for pid in pids:  # whatever the stop command left: never outlive the test
        if _alive(pid):
            os.killpg(pid, 9)


def _keep_server(clone: Clone) -> Clone:
    if not (clone.path / ".prefect" / "env.sh").exists():
        result = clone.bash("KEEP_RUNNING=1 bash scripts/run.sh gpt2-hellaswag/smoke")
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return clone


@pytest.fixture
def kept_server(clone) -> Clone:
    """The clone with a kept server and worker up, as the docs start them (a quick deployment)."""
    return _keep_server(clone)


# ---------------------------------------------------------------------------------------------------------
# every stage deployment reruns its stage with force=true; what it needs comes from cache

# Stage deployments by wave: those of one wave write different outputs and read only what earlier waves
# made, so they run at the same time (as a user may start them); the stage each reruns, by deployment.
STAGE_WAVES = [{"download": "download", "hellaswag": "hellaswag", "init": "init"},
               {"tokenize": "tokenize"},
               {"train": "train"},
               {"evaluate-final": "evaluate", "sample": "sample", "export": "export"}]


def _flow_run_id(output: str) -> str:
    found = re.search(r"UUID: ([0-9a-f-]{36})", output) or re.search(r"flow run ([0-9a-f-]{36})", output)
    assert found, output[-3000:]
    return found.group(1)


@pytest.mark.slow
def test_force_reruns_each_stage_deployment_and_the_others_come_from_cache(kept_server):
    states = {}
    for wave in STAGE_WAVES:
        with ThreadPoolExecutor(len(wave)) as pool:
            results = dict(zip(wave, pool.map(
                lambda flow: kept_server.bash(f"prefect deployment run gpt2-{flow}/smoke --param force=true --watch"),
                wave)))
        for flow, stage in wave.items():
            output = results[flow].stdout + results[flow].stderr
            assert results[flow].returncode == 0, f"gpt2-{flow}/smoke --param force=true:\n{output[-3000:]}"
            states[flow] = kept_server.task_states(_flow_run_id(output))
            assert states[flow][stage] == "Completed", (flow, states[flow])
            assert {name: s for name, s in states[flow].items() if name != stage} == \
                {name: "Cached" for name in states[flow] if name != stage}, (flow, states[flow])
    assert set(states["evaluate-final"]) == {"download", "tokenize", "hellaswag", "init", "train", "evaluate"}


# ---------------------------------------------------------------------------------------------------------
# a failed run says why, where the user looks


FAILURES = {
    "batch_size=3": "ConfigError: invalid training config:\n  - total_batch_size=128 is not a multiple of "
                    "batch_size*seq_len*world_size = 3*32*1 = 96",
    "source=work/mydocs": "SourceNotFound: ",
}


@pytest.fixture(scope="module")
def failed_runs(clone) -> dict[str, subprocess.CompletedProcess]:
    """`run.sh` with each bad parameter, all at once on the kept server (as two terminals would)."""
    _keep_server(clone)
    with ThreadPoolExecutor(len(FAILURES)) as pool:
        results = pool.map(lambda param: clone.bash(f"bash scripts/run.sh gpt2-pretrain/smoke --param {param}"),
                           FAILURES)
        return dict(zip(FAILURES, results))


@pytest.mark.slow
@pytest.mark.parametrize("param", FAILURES)
def test_a_failed_run_shows_its_cause_on_the_terminal_and_in_its_state_message(kept_server, failed_runs, param):
    result, cause = failed_runs[param], FAILURES[param]
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    flow_run_id = _flow_run_id(result.stdout)
    assert cause in result.stdout, result.stdout[-3000:]
    assert f"prefect flow-run logs {flow_run_id}" in result.stdout
    inspect = kept_server.bash(f"prefect flow-run inspect {flow_run_id}")
    message = kept_server.api(f"/flow_runs/{flow_run_id}")["state"]["message"]
    assert cause in message and "UnfinishedRun" not in message, message
    assert inspect.returncode == 0 and cause.split(":")[0] in inspect.stdout
    if param.startswith("source="):
        assert "work/mydocs" in message  # the path the user gave, named
    logs = kept_server.bash(f"prefect flow-run logs {flow_run_id}")  # the command the terminal shows
    assert logs.returncode == 0 and cause.split(":")[0] in logs.stdout


# ---------------------------------------------------------------------------------------------------------
# the `run` blocks


def _check_outcome(block: Block, clone: Clone, result: subprocess.CompletedProcess, kept: list[int]) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{block} exited with {result.returncode}:\n{output[-4000:]}"
    assert "Traceback" not in output, f"{block}:\n{output[-4000:]}"
    watched = len(re.findall(r"^\s*prefect deployment run .*--watch", block.text, flags=re.M))
    assert output.count("Flow run finished successfully in 'Completed'") == watched, output[-4000:]
    for deployment in re.findall(r"^\s*(?:\S+=\S+ )*bash scripts/run\.sh ?((?!-)\S*)", block.text, flags=re.M):
        assert f"{deployment or 'gpt2-pretrain/smoke'} finished with exit code 0" in output, output[-4000:]
        _check_watch_lines(result.stdout)
    if re.search(r"^\s*bash scripts/stop\.sh", block.text, flags=re.M):
        kept = kept + [int(pid) for pid in re.findall(r"\(pid (\d+)\)", output)]  # those run.sh left or used
        assert kept and not [pid for pid in kept if _alive(pid)], "the kept server or worker still runs"
        gone = subprocess.run(["bash", "-c", "source .prefect/env.sh"], cwd=clone.path, env=clone.env,
                              capture_output=True, text=True, timeout=60)
        assert gone.returncode == 1 and "start one with: KEEP_RUNNING=1 bash scripts/run.sh" in gone.stderr


WATCH_LINE = re.compile(r"\[\d\d:\d\d:\d\d\] (?:flow run [\w-]+|[a-z][\w-]*): (?:[A-Z][A-Za-z]+(?:: .*)?|"
                        r"step \d+/\d+ \| loss \d+\.\d{4} \| [\d,]+ tok/s \| ETA \d+:\d\d:\d\d)")


def _check_watch_lines(stdout: str) -> None:
    """run.sh's own lines: whole state-change and progress lines, and a progress line when training ran."""
    lines = [line for line in stdout.splitlines() if re.match(r"\[\d\d:", line)]
    assert lines and all(WATCH_LINE.fullmatch(line) for line in lines), "\n".join(lines)
    if any(line.endswith("] train: Completed") for line in lines):  # trained, not from cache
        assert any("] train: step " in line for line in lines), "\n".join(lines)


def _starts_a_server(text: str) -> bool:
    return re.search(r"^\s*(?:\S+=\S+ )*bash scripts/run\.sh", text, flags=re.M) is not None


@pytest.mark.slow
@pytest.mark.parametrize("block", RUN_BLOCKS, ids=str)
def test_run_block_works_as_written(clone, block, request):
    if re.search(r"^\s*prefect ", block.text, flags=re.M) and not _starts_a_server(block.text):
        request.getfixturevalue("kept_server")  # what the docs say to have first: a shell pointed at a server
    kept = clone.kept_pids()
    result = clone.bash(block.text)
    _check_outcome(block, clone, result, kept)
