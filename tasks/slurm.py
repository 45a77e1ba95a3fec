"""The train stage's Slurm launcher: one batch job of N nodes, one torchrun launcher per node, waited for by the task.

    worker (login node) ── sbatch job.sh ──> first node: job.sh ── srun (one task per node) ──> torchrun (c10d
         │  touches slurm/heartbeat,            │ watchdog: heartbeat stale              rendezvous on the first
         │  tails job-<id>.out, polls           │ -> scancel itself                      node, the run's id as
         └─ scontrol show job <id>              └─ requeue: the script reruns, gpt2.train resumes   rendezvous id)

Slurm's own commands (sbatch --parsable, scontrol show job, sacct, scancel) are the whole interface: they are
stable across Slurm versions and present on every login node. submitit would run a pickled Python function
on each node and hand results back as pickle files, and the pipeline unpickles nothing; pyslurm is compiled
against one Slurm version. What the task needs is a shell script, a job id and the job's state.

Nothing is lost when the task goes away:
- a cancelled flow run, a task timeout, an exception in the wait: the job is cancelled (`SlurmJob.cancel`, also
  registered with `tasks.launch.stopped_with_flow_run`, so `stop_all` reaches it from any thread);
- a worker or flow-run process killed outright (SIGKILL: no code of ours runs): the task no longer touches the
  heartbeat file, and the job's watchdog cancels the job once the file is older than `heartbeat_timeout_s`
  (checked from the moment the job starts, so a job that was still pending goes too);
- a failed, preempted or timed-out job fails the task with TransientError: the task's retry submits a new job,
  and gpt2.train resumes from the run's newest checkpoint that verifies; a requeued job (same id) reruns its
  script, which resumes the same way, while the task keeps waiting;
- a job Slurm refuses (partition, account, more nodes than exist) or one that can never start fails the task
  at once with Slurm's reason (SlurmRefused, not retried).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from common.bounds import text_problem
from tasks.launch import (ChildOutput, Rendezvous, Stopped, flow_run_ending, stopped_with_flow_run,
                          torchrun_command)
from tasks.retry import TransientError, child_failure_is_transient

# JobState values after which the job never runs again (a requeued job goes back to PENDING instead)
FINISHED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                      "BOOT_FAIL", "DEADLINE", "REVOKED"})
# JobState values that are Slurm's own evidence of a crash (the job's processes did not fail by themselves)
CRASHED = frozenset({"NODE_FAIL", "PREEMPTED", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL"})
# reasons a pending job waits for something that will not come without an administrator (squeue(1), REASONS)
NEVER_STARTS = frozenset({"BadConstraints", "PartitionNodeLimit", "PartitionTimeLimit", "PartitionConfig",
                          "InvalidAccount", "InvalidQOS", "AccountNotAllowed", "QOSNotAllowed",
                          "PartitionDown", "PartitionInactive", "NodeDown", "DependencyNeverSatisfied"})
# sbatch errors that say the controller is unreachable for now, not that the job is wrong
_UNREACHABLE = ("Unable to contact slurm controller", "Socket timed out", "Slurm temporarily unable")
RDZV_HOST = "$RDZV_HOST"  # the job's first node, resolved by the job script
JOB_NAME_MAX_BYTES = 255  # Slurm's accounting database keeps a job's name as a MySQL tinytext


@dataclass(frozen=True)
class SlurmSettings:
    """The Slurm job of `launcher: slurm` (docs/pipeline.md, "Beyond one machine")."""

    partition: str | None = None  # default: the cluster's default partition
    account: str | None = None
    time_limit: str | None = None  # sbatch --time, e.g. "24:00:00"; a job that hits it is resubmitted (resumes)
    nodes: int = 1
    gpus_per_node: int = 0  # 0: CPU; also torchrun's processes per node (else the `nproc` setting, else 1)
    tasks_per_node: int = 1  # torchrun launchers per node: 1; more only to try several "nodes" on one host
    rdzv_port: int = 29400  # the c10d rendezvous port on the first node
    sbatch_options: tuple[str, ...] = ()  # more sbatch options, e.g. ["--qos=high", "--exclusive"]
    setup: str = field(default="", metadata={"multiline": True})  # shell lines run on the first node before
    # training, e.g. "module load cuda/12.4"; written into the job script as they are
    python: str | None = None  # the interpreter on the nodes; default: the worker's own (shared filesystem)
    heartbeat_timeout_s: float = 300.0  # the job cancels itself when the task has been gone this long
    poll_s: float = 2.0  # how often the task looks at the job's state and output

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.tasks_per_node < 1 or self.gpus_per_node < 0:
            raise ValueError(f"slurm: nodes and tasks_per_node must be >= 1 and gpus_per_node >= 0, got {self}")
        if not 1 <= self.rdzv_port <= 65535 or not self.poll_s > 0:
            raise ValueError(f"slurm: rdzv_port must be a TCP port (1 to 65535) and poll_s > 0, got {self}")
        if self.heartbeat_timeout_s <= 2 * self.poll_s:
            raise ValueError(f"slurm.heartbeat_timeout_s={self.heartbeat_timeout_s} must exceed twice poll_s="
                             f"{self.poll_s}: the task touches the heartbeat once per poll")

    @property
    def launchers(self) -> int:
        """torchrun launchers in the job: torchrun's --nnodes."""
        return self.nodes * self.tasks_per_node

    def processes_per_node(self, nproc: int | None) -> int:
        return self.gpus_per_node or nproc or 1


class SlurmRefused(RuntimeError):
    """Slurm will not run the job as asked (bad partition or account, a job that cannot start); holds Slurm's
    reason. Deterministic: not retried."""


@dataclass
class JobInfo:
    """What `scontrol show job` (or sacct, once the controller has forgotten the job) says about a job."""

    job_id: str
    state: str
    reason: str = "None"
    nodes: str = ""
    exit_code: str = ""
    restarts: int = 0


@dataclass(frozen=True)
class SlurmJobRecord:
    """The Slurm job that trained a run, for the train record and its artifact."""

    job_id: str
    nodes: str
    state: str
    restarts: int  # times Slurm requeued it
    script: str
    output: str  # the job's output (every node's torchrun and ranks)


def job_name_for(run_name: str, run_id: str) -> str:
    """The Slurm job's name: the run's name and id, so that squeue and sacct say whose job it is."""
    return f"gpt2-{run_name}-{run_id}"


def job_script(settings: SlurmSettings, train_args: list[str], nproc: int, run_id: str, max_restarts: int,
               output: str, heartbeat: Path, job_name: str, workdir: Path) -> str:
    """The sbatch script: resources as #SBATCH lines, the setup, the heartbeat watchdog, one srun task per node
    running torchrun with c10d rendezvous on the first node (rendezvous id: the run's id).

    Every value is written quoted (`shlex.quote`) but integers and the setup, which is shell lines by design.
    An #SBATCH line is a comment to the shell, which no quote carries past a newline: an option holding a
    control character is refused (ValueError naming it), since its next line would run as a command.
    """
    options = [f"--job-name={job_name}", f"--nodes={settings.nodes}", f"--ntasks-per-node={settings.tasks_per_node}",
               f"--chdir={workdir}", f"--output={output}", "--open-mode=append", "--requeue"]
    options += [f"--{name}={value}" for name, value in (("partition", settings.partition), ("account", settings.account),
                                                       ("time", settings.time_limit)) if value]
    if settings.gpus_per_node:
        options.append(f"--gpus-per-node={settings.gpus_per_node}")
    options += settings.sbatch_options
    if problems := [p for option in options if (p := text_problem("a Slurm option", option))]:
        raise ValueError("; ".join(problems))
    rendezvous = Rendezvous(nnodes=settings.launchers, rdzv_endpoint=f"{RDZV_HOST}:{settings.rdzv_port}",
                            rdzv_id=run_id, max_restarts=max_restarts)
    command = torchrun_command("gpt2.train", train_args, nproc, rendezvous, python=settings.python or sys.executable)
    # every argument quoted, the rendezvous endpoint in double quotes so that the shell fills in the host
    endpoint = f"--rdzv-endpoint={rendezvous.rdzv_endpoint}"
    launch = shlex.join(command).replace(shlex.quote(endpoint), f'"{endpoint}"')
    timeout = int(settings.heartbeat_timeout_s)
    return "\n".join([
        "#!/bin/bash",
        *(f"#SBATCH {shlex.quote(option)}" for option in options),
        "# written by the pipeline's train stage (tasks/slurm.py); resubmitted on retry, rerun on requeue",
        settings.setup,
        f"heartbeat={shlex.quote(str(heartbeat))}",
        "heartbeat_age() { echo $(( $(date +%s) - $(stat -c %Y \"$heartbeat\" 2>/dev/null || echo 0) )); }",
        "watchdog() {  # the task that waits for this job touches $heartbeat; gone that long: stop the job",
        "    while true; do",
        f"        if [ \"$(heartbeat_age)\" -gt {timeout} ]; then",
        f"            echo \"[slurm] $heartbeat not touched for over {timeout} s: the task waiting for job"
        " $SLURM_JOB_ID is gone; cancelling the job\"",
        "            scancel \"$SLURM_JOB_ID\"; exit 0",
        "        fi",
        f"        sleep {max(1, int(settings.poll_s))}",
        "    done",
        "}",
        "watchdog &",
        "watchdog_pid=$!",
        "RDZV_HOST=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)",
        f"echo \"[slurm] job $SLURM_JOB_ID (restart ${{SLURM_RESTART_COUNT:-0}}) on $SLURM_JOB_NODELIST: "
        f"{settings.launchers} torchrun launcher(s) x {nproc} process(es), rendezvous $RDZV_HOST:{settings.rdzv_port}\"",
        f"srun --kill-on-bad-exit=1 {launch}",
        "status=$?",
        "kill \"$watchdog_pid\"",
        "exit $status",
        "",
    ])


class SlurmJob:
    """A submitted job: its state, its cancel. `env` reaches Slurm's commands (SLURM_CONF, ...)."""

    def __init__(self, job_id: str, env: Mapping[str, str] | None = None):
        self.job_id, self.env = job_id, dict(env) if env is not None else None

    @classmethod
    def submit(cls, script: Path, env: Mapping[str, str] | None = None) -> SlurmJob:
        """sbatch the script; a refusal raises SlurmRefused with sbatch's message (TransientError when the
        controller cannot be reached)."""
        result = _slurm(["sbatch", "--parsable", str(script)], env)
        if result.returncode != 0:
            message = f"sbatch {script} failed: {(result.stderr or result.stdout).strip()}"
            raise (TransientError if any(m in message for m in _UNREACHABLE) else SlurmRefused)(message)
        return cls(result.stdout.strip().split(";")[0], env)

    def info(self) -> JobInfo:
        result = _slurm(["scontrol", "show", "job", "--oneliner", self.job_id], self.env)
        if result.returncode == 0:
            fields = dict(item.split("=", 1) for item in result.stdout.split() if "=" in item)
            return JobInfo(self.job_id, fields["JobState"], fields.get("Reason", "None"), fields.get("NodeList", ""),
                           fields.get("ExitCode", ""), int(fields.get("Restarts", 0)))
        # the controller forgets finished jobs after MinJobAge; the accounting database remembers them
        result = _slurm(["sacct", "--jobs", self.job_id, "--allocations", "--noheader", "--parsable2",
                         "--format=State,NodeList,ExitCode"], self.env)
        if result.returncode == 0 and result.stdout.strip():
            state, nodes, exit_code = result.stdout.splitlines()[0].split("|")
            return JobInfo(self.job_id, state.split()[0], nodes=nodes, exit_code=exit_code)
        raise TransientError(f"Slurm job {self.job_id} is unknown to scontrol and sacct: {result.stderr.strip()}")

    def cancel(self) -> None:
        """scancel: SIGTERM to every task (torchrun passes it to its ranks), SIGKILL after the cluster's KillWait."""
        _slurm(["scancel", self.job_id], self.env)


def _slurm(cmd: list[str], env: Mapping[str, str] | None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise FileNotFoundError(f"{cmd[0]} not found: launcher=slurm runs Slurm's commands where the worker runs; start "
                                "the worker on a login node of the cluster (or put Slurm's commands on its PATH)") from None


class _OutputTail:
    """Hands each complete line appended to the job's output file to `on_line`, and keeps what the lines say
    about the job's end (tasks.launch.ChildOutput)."""

    def __init__(self, path: Path, on_line: Callable[[str], None]):
        self.path, self.on_line, self.offset = path, on_line, 0
        self.output = ChildOutput()

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            self.output.add(line)
            self.on_line(line)


def run_job(draft: Path, script: Callable[[str], Path], heartbeat: Path, output: Callable[[str], Path],
            settings: SlurmSettings, on_line: Callable[[str], None], env: Mapping[str, str] | None = None
            ) -> SlurmJobRecord:
    """Submit the job script `draft` and wait for its job, touching `heartbeat`, passing its output lines to
    `on_line`.

    Once Slurm has taken the job (sbatch keeps its own copy), the draft becomes `script(job_id)`: each job's
    record names a script of its own, and a submission Slurm refuses leaves no file behind, nor overwrites
    the script of an earlier job. Returns the record of a COMPLETED job. Raises SlurmRefused (not retried) when
    Slurm refuses it or it can never start, TransientError when it ends otherwise (failed, preempted, node
    failure, time limit: the retry resubmits), Stopped when the flow run is ending. Whatever ends the wait
    early cancels the job first.
    """
    heartbeat.parent.mkdir(parents=True, exist_ok=True)
    heartbeat.touch()
    try:
        job = SlurmJob.submit(draft, env)
    except BaseException:
        draft.unlink(missing_ok=True)
        raise
    kept = draft.replace(script(job.job_id))
    on_line(f"[slurm] submitted job {job.job_id} ({kept})")
    try:
        with stopped_with_flow_run(job.cancel, f"Slurm job {job.job_id}"):  # Stopped if the flow run ended meanwhile
            info, tail = _wait(job, heartbeat, _OutputTail(output(job.job_id), on_line), settings)
    except BaseException:
        job.cancel()
        raise
    record = SlurmJobRecord(job.job_id, info.nodes, info.state, info.restarts, str(kept), str(output(job.job_id)))
    if info.state == "COMPLETED":
        return record
    if flow_run_ending():
        raise Stopped(f"Slurm job {job.job_id} was cancelled because its flow run is ending")
    message = (f"Slurm job {job.job_id} ended {info.state} (exit code {info.exit_code}, reason {info.reason}, "
               f"nodes {info.nodes}); output {record.output}, last lines:\n" + "\n".join(tail))
    if info.state == "CANCELLED":  # by someone outside the pipeline (or by its watchdog): not retried
        raise RuntimeError(message)
    # a crash or a lost node is retried (the new job resumes); an error the job's output names that a rerun
    # would meet again (divergence, a bad shard, a full disk) is not
    transient = info.state in CRASHED or child_failure_is_transient("\n".join(tail))
    raise (TransientError if transient else RuntimeError)(message)


def _wait(job: SlurmJob, heartbeat: Path, output: _OutputTail, settings: SlurmSettings) -> tuple[JobInfo, list[str]]:
    unknown_since = None  # a controller restarting does not know its jobs for a moment: wait that out
    while True:
        heartbeat.touch()
        output.poll()
        try:
            info = job.info()
        except TransientError:
            unknown_since = unknown_since or time.monotonic()
            if time.monotonic() - unknown_since > settings.heartbeat_timeout_s:
                raise
            time.sleep(settings.poll_s)
            continue
        unknown_since = None
        if info.state in FINISHED:
            output.poll()
            return info, output.output.said()
        if info.state == "PENDING" and info.reason in NEVER_STARTS:
            raise SlurmRefused(f"Slurm job {job.job_id} cannot start: {info.reason} (scontrol show job {job.job_id})")
        time.sleep(settings.poll_s)
