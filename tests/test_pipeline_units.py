"""Pipeline building blocks without a Prefect server: records, cache identity, retry rules, the launcher."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

import pytest

from tasks.cache import FileRef, StageRecord, code_closure, code_version, content_identity
from tasks.launch import CommandFailed, Rendezvous, run_streaming, torchrun_command
from tasks.report import training_figures
from tasks.retry import TransientError, is_transient


# ---------------------------------------------------------------------------------------------------------
# records and cache identity


def test_file_ref_detects_deletion_truncation_and_same_size_corruption(tmp_path):
    path = tmp_path / "shard.bin"
    path.write_bytes(b"a" * 100)
    ref = FileRef.of(path)
    assert ref.sha256 == hashlib.sha256(b"a" * 100).hexdigest()
    assert ref.problem() is None

    path.write_bytes(b"a" * 99 + b"b")  # same size, new content (and a new mtime)
    os.utime(path, ns=(ref.mtime_ns + 10**9, ref.mtime_ns + 10**9))
    assert "sha256 differs" in ref.problem()

    path.write_bytes(b"a" * 50)
    assert "50 bytes, 100 were recorded" in ref.problem()

    path.unlink()
    assert "missing" in ref.problem()


def test_file_ref_touched_but_unchanged_file_is_still_valid(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"xyz")
    ref = FileRef.of(path)
    os.utime(path, ns=(ref.mtime_ns + 5 * 10**9, ref.mtime_ns + 5 * 10**9))  # e.g. copied back with cp
    assert ref.problem() is None


def test_content_identity_ignores_paths_and_mtimes_of_records(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"same")
    b.write_bytes(b"same")
    os.utime(b, ns=(1, 1))
    record_a = StageRecord(files=(FileRef.of(a),))
    record_b = StageRecord(files=(FileRef.of(b),))
    assert content_identity({"x": record_a}) == content_identity({"x": record_b})

    b.write_bytes(b"diff")
    assert content_identity({"x": record_a}) != content_identity({"x": StageRecord(files=(FileRef.of(b),))})
    # plain parameters hash as they are
    assert content_identity({"lr": 6e-4}) != content_identity({"lr": 3e-4})


# ---------------------------------------------------------------------------------------------------------
# retry rules


class _HTTPError(OSError):
    def __init__(self, status: int):
        super().__init__(f"HTTP {status}")
        self.response = type("Response", (), {"status_code": status})()


@pytest.mark.parametrize(
    "exc, transient",
    [
        (ConnectionResetError("reset by peer"), True),
        (TimeoutError("read timed out"), True),
        (urllib.error.URLError("temporary failure in name resolution"), True),
        (urllib.error.HTTPError("u", 503, "unavailable", None, None), True),
        (urllib.error.HTTPError("u", 404, "not found", None, None), False),
        (_HTTPError(429), True),
        (_HTTPError(401), False),
        (TransientError("training process died"), True),
        (FileNotFoundError("no such corpus"), False),
        (PermissionError("read-only"), False),
        (ValueError("bad config"), False),
    ],
)
def test_is_transient(exc, transient):
    assert is_transient(exc) is transient


def test_the_tasks_own_timeout_is_not_retried_though_a_network_timeout_is():
    """Prefect hands the retry condition its TaskRunTimeoutError, a TimeoutError: retrying would only time out again."""
    from prefect.states import Failed
    from prefect.task_engine import TaskRunTimeoutError

    from tasks.retry import retry_if_transient

    assert retry_if_transient(None, None, Failed(data=TaskRunTimeoutError("Scope timed out after 45.0 second(s).")))\
        is False
    assert retry_if_transient(None, None, Failed(data=TimeoutError("read timed out"))) is True


# ---------------------------------------------------------------------------------------------------------
# launcher


def test_run_streaming_streams_lines_and_reports_failure_with_tail():
    lines = []
    cmd = [sys.executable, "-c", "import sys; print('one'); print('two', file=sys.stderr); sys.exit(3)"]
    with pytest.raises(CommandFailed) as info:
        run_streaming(cmd, lines.append)
    assert lines == ["one", "two"]
    assert info.value.returncode == 3
    assert "two" in str(info.value)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) counts as dead
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def test_run_streaming_kills_the_whole_process_group_when_interrupted():
    """The child starts a grandchild (as torchrun starts workers); an exception while streaming kills both."""

    class Cancelled(Exception):
        pass

    seen = []

    def on_line(line: str) -> None:
        seen.append(line)
        raise Cancelled  # what Prefect's SIGTERM bridge or a task timeout does mid-stream

    script = "sleep 300 & echo $!; wait"
    with pytest.raises(Cancelled):
        run_streaming(["bash", "-c", script], on_line, grace_s=2.0)
    grandchild = int(seen[0])
    deadline = time.monotonic() + 5  # the signal is sent; the grandchild's exit follows asynchronously
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_torchrun_command_single_node_and_rendezvous():
    single = torchrun_command("gpt2.train", ["--config", "c.json"], nproc=2, run_id="run7")
    # one machine: torchrun whose stores listen on loopback only (test_launch_loopback.py watches a real one)
    assert single[1:] == ["-m", "common.loopback_torchrun", "--nnodes=1", "--rdzv-backend=c10d",
                          "--rdzv-endpoint=127.0.0.1:0", "--local-addr=127.0.0.1", "--rdzv-id=run7", "--max-restarts=0",
                          "--nproc-per-node=2", "-m", "common.lifetime", sys.executable, "-m", "gpt2.train", "--config",
                          "c.json"]
    elastic = Rendezvous(nnodes=2, rdzv_endpoint="node0:29400", max_restarts=3).torchrun_args("run7")
    assert elastic == ["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=node0:29400", "--rdzv-id=run7",
                       "--max-restarts=3"]  # the run's own id, shared by its nodes, new for every run
    named = Rendezvous(nnodes=2, rdzv_endpoint="node0:29400", rdzv_id="job7").torchrun_args("run7")
    assert "--rdzv-id=job7" in named
    static = Rendezvous(nnodes=2, node_rank=1, master_addr="10.0.0.1").torchrun_args("run7")
    assert static == ["--nnodes=2", "--node-rank=1", "--master-addr=10.0.0.1", "--master-port=29500",
                      "--max-restarts=0"]
    with pytest.raises(ValueError, match="rdzv_endpoint"):
        Rendezvous(nnodes=2).torchrun_args("run7")


def test_command_dies_with_the_thread_that_started_it_even_on_sigkill(tmp_path):
    """A launcher process killed by SIGKILL (no handler runs) takes its command and the command's children along."""
    pids = tmp_path / "pids"
    script = (
        "from tasks.launch import run_streaming\n"
        f"run_streaming(['bash', '-c', 'echo $$ > {pids}; sleep 300'], print)\n"
    )
    launcher = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).resolve().parent.parent)
    deadline = time.monotonic() + 60
    while not (pids.exists() and pids.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    child = int(pids.read_text())
    assert _alive(child)
    launcher.kill()  # SIGKILL: no exception, no finally, no handler in the launcher
    launcher.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


# ---------------------------------------------------------------------------------------------------------
# report figures


def test_training_figures_hand_computed():
    metrics = [
        {"step": 0, "kind": "val", "val_loss": 11.0},
        {"step": 0, "kind": "train", "loss": 10.9, "tok_s": 1.0, "mfu": None},  # warm-up step: excluded
        {"step": 1, "kind": "train", "loss": 10.0, "tok_s": 100.0, "mfu": 0.25},
        {"step": 2, "kind": "train", "loss": 9.0, "tok_s": 300.0, "mfu": 0.35},
        {"step": 2, "kind": "val", "val_loss": 9.5},
    ]
    figures = training_figures(metrics)
    assert figures == {"train_loss": 9.0, "val_loss": 9.5, "tokens_per_s": 200.0, "mfu": pytest.approx(0.30)}


def test_code_version_follows_project_imports_only(tmp_path, monkeypatch):
    # a throwaway project package: a imports b (and numpy), b imports c lazily inside a function, d is unused
    pkg = tmp_path / "gpt2"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import numpy\nfrom gpt2 import b\n")
    (pkg / "b.py").write_text("def f():\n    from gpt2.c import g\n")
    (pkg / "c.py").write_text("def g():\n    return 1\n")
    (pkg / "d.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "gpt2", raising=False)
    assert code_closure(("gpt2.a",)) == ["gpt2", "gpt2.a", "gpt2.b", "gpt2.c"]
    before = code_version(("gpt2.a",))
    (pkg / "d.py").write_text("x = 1\n")  # not imported: no new version
    assert code_version(("gpt2.a",)) == before
    (pkg / "c.py").write_text("def g():\n    return 2\n")  # imported two steps away: a new version
    assert code_version(("gpt2.a",)) != before


def test_train_code_covers_the_modules_training_runs():
    from tasks.train import TRAIN_CODE

    closure = set(code_closure(TRAIN_CODE))
    # imported by gpt2.train directly (loader, evaluation) and through the model (the fused kernels)
    assert {"data.loader", "common.files", "gpt2.evaluate", "gpt2.model", "gpt2_kernels.layernorm", "gpt2_kernels.cross_entropy"} <= closure
    assert not any(name.startswith(("torch", "prefect", "tasks")) for name in closure)


# settings checked at flow start


def test_flow_start_checks_training_settings_before_their_files_exist(tmp_path):
    """gpt2.train's checks run on the settings alone (no shards, HellaSwag file or init_from yet); the
    HellaSwag setting still counts: a model without GPT-2's vocabulary cannot be scored on it."""
    from flows.config import check_settings
    from gpt2.train_config import ConfigError

    small_vocab = "n_layer=1,n_head=1,n_embd=8,block_size=16,vocab_size=64"
    base = dict(root=str(tmp_path), model=small_vocab, batch_size=2, seq_len=16, total_batch_size=32,
                max_steps=4, warmup_steps=1, sample_every=0, init_from=str(tmp_path / "not-yet"), nproc=1)
    check_settings({**base, "hellaswag_source": None})
    with pytest.raises(ConfigError, match="hellaswag_every=.* needs the GPT-2 tokenizer's vocabulary"):
        check_settings(base)  # the default HellaSwag source
    check_settings({**base, "hellaswag_source": None, "hellaswag_every": 5})  # no file: nothing to score
    with pytest.raises(ConfigError, match="warmup_steps=9 exceeds max_steps=4"):
        check_settings({**base, "hellaswag_source": None, "warmup_steps": 9})
    assert not any(tmp_path.iterdir())  # checking made nothing


@pytest.mark.parametrize("name, value", [("run_name", "../../escape"), ("run_name", "/tmp/elsewhere"),
                                         ("run_name", ".."), ("dataset", "../../../../tmp/x"), ("dataset", "a/b")])
def test_names_that_would_climb_out_of_root_are_refused_naming_the_parameter(name, value):
    """run_name and dataset become folder names under root: a separator, `..` or an absolute path is refused
    by the settings check, before anything is written."""
    from flows.config import SettingsError, check_settings

    with pytest.raises(SettingsError, match=f"{name}: .*must be a plain name.*got '{re.escape(value)}'"):
        check_settings({name: value, "hellaswag_source": None, "nproc": 1})


def test_slurm_launcher_world_size_is_nodes_times_tasks_times_processes_and_is_checked_at_flow_start(tmp_path):
    """Under launcher=slurm the world is slurm.nodes x tasks_per_node launchers x gpus_per_node processes (else
    nproc), whatever the worker's host has; the batch check sees that world before any job is submitted."""
    from flows.config import check_settings
    from gpt2.train_config import ConfigError

    base = dict(root=str(tmp_path), model="n_layer=1,n_head=1,n_embd=8,block_size=16", hellaswag_source=None,
                batch_size=2, seq_len=16, max_steps=4, warmup_steps=1, sample_every=0, launcher="slurm")
    check_settings({**base, "total_batch_size": 2 * 16 * 8, "slurm": {"nodes": 2, "gpus_per_node": 4}})
    with pytest.raises(ConfigError, match=r"2\*16\*8 = 256"):
        check_settings({**base, "total_batch_size": 128, "slurm": {"nodes": 2, "gpus_per_node": 4}})
    with pytest.raises(ConfigError, match=r"2\*16\*6 = 192"):  # no GPUs: nproc processes per launcher
        check_settings({**base, "total_batch_size": 128, "nproc": 3, "slurm": {"nodes": 1, "tasks_per_node": 2}})


def test_slurm_job_script_asks_for_the_settings_and_lets_the_shell_fill_in_the_first_node(tmp_path):
    from tasks.slurm import SlurmSettings, job_script

    settings = SlurmSettings(partition="h100", account="lab", time_limit="1:00:00", nodes=8, gpus_per_node=8,
                             sbatch_options=("--qos=high",), setup="module load cuda", python="/opt/py/bin/python")
    script = job_script(settings, ["--config", "/runs/a b/launch_config.json"], 8, "run42", 1, "/runs/job-%j.out",
                        tmp_path / "heartbeat", "gpt2-x", Path("/repo"))
    sbatch = [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]
    assert {"--nodes=8", "--ntasks-per-node=1", "--partition=h100", "--account=lab", "--time=1:00:00",
            "--gpus-per-node=8", "--qos=high", "--requeue", "--chdir=/repo", "--output=/runs/job-%j.out"} <= set(sbatch)
    (srun,) = [line for line in script.splitlines() if line.startswith("srun ")]
    assert ('"--rdzv-endpoint=$RDZV_HOST:29400" --rdzv-id=run42 --max-restarts=1 --nproc-per-node=8' in srun
            and srun.startswith("srun --kill-on-bad-exit=1 /opt/py/bin/python -m torch.distributed.run --nnodes=8 "))
    assert srun.endswith("-m gpt2.train --config '/runs/a b/launch_config.json'")
    assert script.index("module load cuda") < script.index("srun ")
    result = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert result.returncode == 0, result.stderr


def _sbatch_directives(script: str) -> list[list[str]]:
    """The arguments of each `#SBATCH` line, split as a shell splits words (quotes removed)."""
    return [shlex.split(line.removeprefix("#SBATCH ")) for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_slurm_job_script_quotes_every_value_and_each_directive_reads_back_intact(tmp_path):
    """Every value the script writes is quoted; the script parses (`bash -n`), and each `#SBATCH`
    directive, split as the shell splits it, is the value given, whatever quotes, spaces, `$`, `;`, `#` or
    backticks it holds."""
    from tasks.slurm import SlurmSettings, job_script

    odd = "a b'c\"d $(touch pwned) `id`; #e"
    settings = SlurmSettings(partition=f"p {odd}", account=f"acct {odd}", time_limit="1:00:00", nodes=2,
                             sbatch_options=(f"--comment={odd}", "--exclusive"))
    workdir, output = tmp_path / f"repo {odd}", f"/runs/{odd}/job-%j.out"
    script = job_script(settings, ["--config", f"/runs/{odd}/launch_config.json"], 1, "run42", 0, output,
                        tmp_path / f"heart {odd}", f"gpt2-{odd}-run42", workdir)
    result = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert result.returncode == 0, result.stderr
    assert _sbatch_directives(script) == [[option] for option in (
        f"--job-name=gpt2-{odd}-run42", "--nodes=2", "--ntasks-per-node=1", f"--chdir={workdir}", f"--output={output}",
        "--open-mode=append", "--requeue", f"--partition=p {odd}", f"--account=acct {odd}", "--time=1:00:00",
        f"--comment={odd}", "--exclusive")]
    (srun,) = [line for line in script.splitlines() if line.startswith("srun ")]
    assert shlex.split(srun)[-2:] == ["--config", f"/runs/{odd}/launch_config.json"]


@pytest.mark.parametrize("where", ["job_name", "partition", "sbatch_options"])
def test_slurm_job_script_refuses_a_value_that_would_end_its_directive_line(tmp_path, where):
    """Before: `run_name="x\\ntouch pwned #"` made `#SBATCH '--job-name=gpt2-x` and a line `touch pwned
    #-...'` that bash runs as a command (and sbatch stops reading directives there). A comment line cannot be
    quoted across lines: the script refuses the value, naming it."""
    from tasks.slurm import SlurmSettings, job_script

    bad = "x\ntouch pwned #"
    settings = SlurmSettings(partition=bad if where == "partition" else None,
                             sbatch_options=(f"--comment={bad}",) if where == "sbatch_options" else ())
    job_name = f"gpt2-{bad}-run42" if where == "job_name" else "gpt2-x-run42"
    with pytest.raises(ValueError, match=r"a Slurm option holds the control character\(s\) '\\n' \(got '--"):
        job_script(settings, [], 1, "run42", 0, "/runs/job-%j.out", tmp_path / "heartbeat", job_name, Path("/repo"))


def test_slurm_launcher_without_slurms_commands_says_where_the_worker_must_run(tmp_path):
    from tasks.slurm import SlurmSettings, run_job

    draft = tmp_path / "job.sh.tmp"
    draft.write_text("#!/bin/bash\n")
    with pytest.raises(FileNotFoundError, match="sbatch not found: .* start the worker on a login node"):
        run_job(draft, lambda job_id: tmp_path / f"job-{job_id}.sh", tmp_path / "heartbeat",
                lambda job_id: tmp_path / f"job-{job_id}.out", SlurmSettings(), print, env={"PATH": str(tmp_path)})
    assert list(tmp_path.iterdir()) == [tmp_path / "heartbeat"]  # no script is left of a job never submitted


# the init stage's weight sources


def _save_tiny_checkpoint(run_dir: Path, step: int, seed: int) -> Path:
    from dataclasses import asdict

    from gpt2.checkpoint import save_checkpoint
    from gpt2.config import parse_model_spec
    from gpt2.model import GPT
    from tests.fixtures.train.tiny import TINY_MODEL

    model = GPT.create(parse_model_spec(TINY_MODEL), seed=seed)
    return save_checkpoint(run_dir, step, {"step": step, "model": model.state_dict(),
                                           "model_config": asdict(model.config)}, model)


def test_init_from_a_run_directory_is_its_newest_checkpoint_that_verifies(tmp_path):
    """A run directory (it has a config.json, as a Hugging Face directory does) stands for its newest checkpoint
    that verifies: the init stage records that checkpoint, by content, and hands its path to training."""
    from gpt2.checkpoint import TENSORS_FILE
    from tasks.init import CheckpointRecord, _existing_weights
    from tests.fixtures.train.tiny import TINY_MODEL

    run_dir = tmp_path / "run"
    first = _save_tiny_checkpoint(run_dir, 3, seed=1)
    (run_dir / "config.json").write_text("{}")  # gpt2.train writes one in every run directory
    record = _existing_weights(str(run_dir), TINY_MODEL)
    assert (record.source, record.path) == ("checkpoint", str(first.resolve()))
    assert record.files == CheckpointRecord.of(first, TINY_MODEL).files

    newer = _save_tiny_checkpoint(run_dir, 5, seed=2)  # training went on: a new identity
    again = _existing_weights(str(run_dir), TINY_MODEL)
    assert (again.path, again.files) == (str(newer.resolve()), CheckpointRecord.of(newer, TINY_MODEL).files)
    assert again.content_digest() != record.content_digest()

    state = newer / TENSORS_FILE  # a newer checkpoint that no longer verifies is skipped
    state.write_bytes(bytes(b ^ 0xFF for b in state.read_bytes()))
    assert _existing_weights(str(run_dir), TINY_MODEL) == record


def test_a_checkpoint_source_is_hashed_once_and_a_corrupt_one_is_refused(tmp_path, monkeypatch):
    import common.files
    import gpt2.checkpoint_files
    from gpt2.checkpoint import COMPLETE_MARKER, TENSORS_FILE, CheckpointError
    from gpt2.weights import load_model
    from tasks.init import _existing_weights
    from tests.fixtures.train.tiny import TINY_MODEL

    checkpoint = _save_tiny_checkpoint(tmp_path / "run", 2, seed=3)
    hashed = []

    def counting_sha256(path):
        hashed.append(Path(path).name)
        return common.files.sha256_file(path)

    monkeypatch.setattr(gpt2.checkpoint_files, "sha256_file", counting_sha256)
    for source in (checkpoint, tmp_path / "run"):  # the checkpoint itself, its run directory
        for use in (load_model, lambda s: _existing_weights(str(s), TINY_MODEL)):
            hashed.clear()
            use(source)
            assert sorted(hashed) == sorted(p.name for p in checkpoint.iterdir() if p.name != COMPLETE_MARKER), source

    state = checkpoint / TENSORS_FILE
    state.write_bytes(bytes(b ^ 0xFF for b in state.read_bytes()))  # same size, other content
    with pytest.raises(CheckpointError, match="content differs from the sha256"):
        _existing_weights(str(checkpoint), TINY_MODEL)
    with pytest.raises(FileNotFoundError, match="no complete checkpoint that verifies"):
        _existing_weights(str(tmp_path / "run"), TINY_MODEL)


@pytest.mark.parametrize("kind", ["checkpoint", "llmc", "hf"])
def test_init_from_weights_of_another_shape_is_refused_naming_both(tmp_path, kind):
    from gpt2.hf import export_hf
    from gpt2.llmc import write_model_file
    from gpt2.config import parse_model_spec
    from gpt2.model import GPT
    from tasks.init import _existing_weights
    from tests.fixtures.train.tiny import TINY_MODEL

    wider = TINY_MODEL.replace("n_embd=32", "n_embd=48")
    model = GPT.create(parse_model_spec(TINY_MODEL), seed=4)
    if kind == "checkpoint":
        source = _save_tiny_checkpoint(tmp_path / "run", 1, seed=4)
    elif kind == "llmc":
        source = write_model_file(model, tmp_path / "model.bin")
    else:
        source = export_hf(model, tmp_path / "hf")
    assert _existing_weights(str(source), TINY_MODEL).source == kind  # its own shape is accepted
    with pytest.raises(ValueError, match=rf"init_from {source} holds model .*n_embd=32.*, but model='{wider}' is "
                                         r".*n_embd=48.*; set model to the source's shape"):
        _existing_weights(str(source), wider)


# ---------------------------------------------------------------------------------------------------------
# the deployments as written in prefect.yaml


def test_scheduled_evaluation_runs_gpt2_evaluate_on_the_cpu_only(tmp_path):
    """docs/pipeline.md: the scheduled scan never takes GPU memory. Its deployment's settings become
    gpt2.evaluate's `--device cpu`, and its job hides every GPU from the process."""
    import yaml

    from gpt2.run_dir import RunDir
    from tasks.evaluate import EvalSettings

    deployments = yaml.safe_load((Path(__file__).resolve().parent.parent / "prefect.yaml").read_text())["deployments"]
    scheduled = next(d for d in deployments if d["name"] == "scheduled")
    assert scheduled["entrypoint"].endswith(":gpt2_evaluate")
    args = EvalSettings(**scheduled["parameters"]["settings"]).args(RunDir(tmp_path))
    assert args[args.index("--device") + 1] == "cpu"
    assert scheduled["job_variables"]["env"]["CUDA_VISIBLE_DEVICES"] == ""


def test_the_cancel_watcher_rides_out_an_outage_with_two_log_lines_and_stops_once_on_cancelling():
    """API unreachable for a while (any exception from the read), then Running, then Cancelling: `stop` is
    called exactly once, and the outage costs one line when it starts and one when it ends, not one per poll."""
    import threading

    from tasks.cancel_watch import CancelWatcher, cancel_requested

    answers = iter([ConnectionError("refused")] * 20 + ["RUNNING"] * 3 + ["CANCELLING"] + ["CANCELLED"] * 100)

    def read_state() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    stopped, stops, lines = threading.Event(), [], []
    with CancelWatcher("run-1", lambda: (stops.append(1), stopped.set()), read_state, lines.append, poll_s=0.005):
        assert stopped.wait(10)
    assert stops == [1] and cancel_requested("run-1") and not cancel_requested("run-2")
    assert len(lines) == 3, lines
    assert lines[0].startswith("cannot reach the Prefect API to check for cancellation (ConnectionError: refused)")
    assert lines[1].startswith("the Prefect API answers again") and lines[2] == "flow run is cancelling: stopping its work"


def test_every_deployment_loads_its_flow_from_the_one_imported_module():
    """prefect.yaml names each flow by module (`flows.pipeline:train_flow`), not by file: `prefect deploy --all`
    then imports flows/pipeline.py once for all its deployments, where a file path re-executes the file for
    each one (every flow's parameter schema built again: 25 times the import, seconds of CPU each deploy)."""
    import yaml
    from prefect.flows import load_flow_from_entrypoint

    import flows.pipeline

    deployments = yaml.safe_load((Path(__file__).resolve().parent.parent / "prefect.yaml").read_text())["deployments"]
    for deployment in deployments:
        flow_name = deployment["entrypoint"].split(":")[1]
        assert load_flow_from_entrypoint(deployment["entrypoint"]) is getattr(flows.pipeline, flow_name), deployment


def test_run_shs_name_check_reads_the_flow_names_without_importing_prefect():
    """`python -m flows.deployments NAME` runs before every run.sh: it names each deployment FLOW/DEPLOYMENT from
    flows.names, a table without Prefect (importing Prefect and making the nine flows took ~2.7 CPU-seconds each
    time), and that table names each flow as Prefect does."""
    code = ("import sys, flows.deployments as d; names = d.deployment_names(); "
            "print(len(names), sorted(m for m in sys.modules if m.split('.')[0] == 'prefect')[:3])")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent,
                         capture_output=True, text=True, check=True, timeout=120).stdout
    assert out.strip().endswith(" []"), f"the name check imported Prefect: {out}"

    import flows.pipeline
    from flows.names import FLOW_NAMES

    assert {attribute: getattr(flows.pipeline, attribute).name for attribute in FLOW_NAMES} == FLOW_NAMES


def test_a_stage_flow_is_made_when_first_looked_up_not_at_import():
    """A flow run imports flows.pipeline for one flow: the eight stage flows (Prefect builds each one's schema of
    ~55 parameters when it is made, ~60 ms of CPU apiece) are made when looked up, once each, none at import."""
    code = ("import flows.pipeline as p; made = lambda: [n for n in p.STAGE_FLOWS if n in vars(p)]; before = made(); "
            "f = p.train_flow; print(before, f is p.train_flow, f.name, made())")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent,
                         capture_output=True, text=True, check=True, timeout=120).stdout
    assert out.strip() == "[] True gpt2-train ['train_flow']", out


def test_the_flow_process_starts_without_torch():
    """Every flow run is a new process that imports flows.pipeline (and `prefect deploy`, run.sh's name check
    import it too): torch is imported by the stages that use it, when they run, not by the flows' import
    (2 CPU-seconds a process; a cached stage, a refused run and the evaluation scan's bookkeeping need none)."""
    code = "import sys, flows.pipeline; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])"
    imported = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent,
                              capture_output=True, text=True, check=True, timeout=120).stdout
    assert imported.strip() == "[]", f"flows.pipeline imported torch: {imported}"


def test_the_flow_processs_checkpoint_and_metrics_bookkeeping_needs_no_torch(tmp_path):
    """What a flow run does around the stages that compute (a checkpoint's record after training, the progress
    and metrics it reads, the evaluation scan's checkpoints and TensorBoard numbers) imports no torch: each flow
    run that trained would otherwise pay its import (~2.5 CPU-seconds) for bookkeeping."""
    from gpt2.checkpoint import write_initial_checkpoint
    from tests.fixtures.train.tiny import TINY_MODEL

    checkpoint = write_initial_checkpoint(tmp_path / "run", TINY_MODEL, seed=1)
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1, "loss": 2.5}\n')
    code = f"""import sys
from pathlib import Path
from gpt2.checkpoint_files import list_checkpoints
from gpt2.metrics import EventLog, read_metrics
from tasks.init import CheckpointRecord
record = CheckpointRecord.of({str(checkpoint)!r}, {TINY_MODEL!r})
log = EventLog({str(tmp_path / 'tb')!r}); log.add_scalar("val/loss", 2.5, 1); log.add_text("sample", "a", 1); log.close()
print(record.step, len(list_checkpoints({str(tmp_path / 'run')!r})), read_metrics({str(tmp_path / 'run' / 'metrics.jsonl')!r}),
      sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])"""
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent,
                         capture_output=True, text=True, check=True, timeout=120).stdout
    assert out.strip() == "0 1 [{'step': 1, 'loss': 2.5}] []", out


def test_event_log_writes_the_summaries_torchs_summary_writer_would(tmp_path):
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from torch.utils.tensorboard.summary import scalar, text

    from gpt2.metrics import EventLog

    log = EventLog(tmp_path)
    log.add_scalar("val/loss", 3.25, 7)
    log.add_text("sample", "Hello, wörld", 8)
    log.close()
    records = RawEventFileLoader(str(next(tmp_path.glob("events.out.tfevents.*")))).Load()
    events = [e for e in map(Event.FromString, records) if e.HasField("summary")]
    assert [(e.step, e.summary) for e in events] == [(7, scalar("val/loss", 3.25)), (8, text("sample", "Hello, wörld"))]


def test_artifact_keys_hold_only_what_prefect_takes_and_tell_every_name_apart(tmp_path):
    """Prefect's keys take lowercase letters, digits and dashes. A name already of that form reads as it is; any
    other gets a digest, so names that differ only where the key cannot ("Run_1", "run-1") keep keys of their own.
    A run's key names its run, not only its id (which two run names with the same settings share), and its folder:
    the same run name and id under two roots on one server keep keys of their own too."""
    from tasks.common import artifact_key, run_artifact_key

    names = ("gpt2-124m", "Run_1", "run-1", "run.1", "RUN 1", "run_1")
    keys = [artifact_key("train-summary", name, "29651ab2dac1") for name in names]
    assert all(re.fullmatch(r"[a-z0-9-]+", key) for key in keys), keys
    assert len(set(keys)) == len(names), keys
    assert keys[0] == "train-summary-gpt2-124m-29651ab2dac1"

    runs = [tmp_path / root / "runs" / name / "29651ab2dac1" for root, name in (("a", "x"), ("a", "y"), ("b", "x"))]
    run_keys = [run_artifact_key("train-progress", run) for run in runs]
    assert len(set(run_keys)) == 3, run_keys
    named = [re.fullmatch(r"train-progress-([a-z]+)-29651ab2dac1-[0-9a-f]{8}", key)[1] for key in run_keys]
    assert named == ["x", "y", "x"]
    assert run_artifact_key("train-progress", runs[0]) == run_keys[0]  # the same folder, the same key
