"""The train stage: `torchrun -m gpt2.train` from the init stage's weights, in a run directory named by content.

`launcher` says where torchrun runs: `local`, on the worker's host (tasks.launch), or `slurm`, one batch job of
N nodes with one torchrun per node (tasks.slurm). Either way the task waits, shows the same log lines and
progress, and records the same outcome.

The stage builds and validates gpt2.train's TrainConfig in-process (a bad setting fails before any process
starts, and is not retried), hands it over as the run's JSON config, follows progress in the run's
metrics file and reads the outcome from its summary file (paths from gpt2.run_dir).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from common.files import JsonLinesTail, read_json, write_json
from common.paths import under
from tasks.cache import FileRef, StageCache, StageRecord, stage_key
from tasks.common import log_lines, reading, run_artifact_key
from tasks.evaluate import data_identity
from tasks.hellaswag import EvalFileRecord
from tasks.init import MODEL_CODE, CheckpointRecord, WeightsRecord
from tasks.cancel_watch import watch_for_cancellation
from tasks.launch import Rendezvous, run_streaming, stop_all, torchrun_command, visible_gpus
from tasks.progress import ProgressReporter
from tasks.report import plot_loss_curve, run_summary_markdown, training_figures
from tasks.retry import best_effort, refused_a_locked_folder, retry_if_transient
from tasks.slurm import SlurmJobRecord, SlurmSettings, job_name_for, job_script, run_job
from tasks.tokenize import ShardsRecord

if TYPE_CHECKING:
    from gpt2.run_dir import RunDir
    from gpt2.train_config import TrainConfig

# modules whose source determines the stage's output (their edits invalidate its cache and name a new run)
TRAIN_CODE = MODEL_CODE + ("gpt2.train",)

TRAIN_RETRIES = 2  # a crashed training process is retried, resuming from its latest checkpoint (tasks.retry)
TRAIN_RETRY_DELAY_S = 30
RUN_ID_LENGTH = 12  # hex digits of the run id: the run directory's name, part of the Slurm job's name
PROGRESS_POLL_S = 1.0  # how often the metrics file is looked at for progress
Launcher = Literal["local", "slurm"]


@dataclass(frozen=True)
class TrainRecord(StageRecord):
    run_dir: str
    checkpoint: CheckpointRecord  # the final one
    steps: int
    tokens: int
    train_loss: float | None
    val_loss: float | None
    tokens_per_s: float | None
    mfu: float | None
    loss_curve: str
    rejected_checkpoints: tuple[str, ...] = ()  # checkpoints that failed verification and were not resumed from
    slurm_job: SlurmJobRecord | None = None  # the job that trained it (launcher=slurm)


class _TrainingProgress:
    """The train stage's progress artifact (tasks.progress.ProgressReporter, every whole percent of max_steps),
    following the steps gpt2.train appends to the run's metrics file: at most once a second it reads the
    lines added since its last look (common.files.JsonLinesTail). A line it cannot read is named once in the
    task's log and skipped: progress is reported, never relied on."""

    def __init__(self, metrics: Path, max_steps: int, key: str):
        self.max_steps, self.next_check = max_steps, 0.0
        self.lines = JsonLinesTail(metrics, get_run_logger().warning)
        self.reporter = ProgressReporter(key, "training progress")

    def poll(self, now: bool = False) -> None:
        from gpt2.metrics import is_metrics_record

        if not now and time.monotonic() < self.next_check:
            return
        self.next_check = time.monotonic() + PROGRESS_POLL_S
        steps = [r["step"] + 1 for r in self.lines.new_records() if is_metrics_record(r) and r.get("kind") == "train"]
        if steps:
            self.reporter(max(steps) / self.max_steps)


def world_shape(launcher: Launcher, nproc: int | None, rendezvous: Rendezvous, slurm: SlurmSettings) -> tuple[int, int]:
    """(processes per node, torchrun launchers) of a run: its world size is their product."""
    if launcher == "slurm":
        return slurm.processes_per_node(nproc), slurm.launchers
    return nproc or max(1, visible_gpus()), rendezvous.nnodes


# the train task's inputs that say where and how its processes run; they matter through the world shape alone
_LAUNCH_INPUTS = ("launcher", "nproc", "rendezvous", "slurm")


def _run_identity(shards: ShardsRecord, hellaswag: EvalFileRecord | None, init: WeightsRecord, seed: int,
                  settings: dict[str, Any], world: tuple[int, int]) -> dict[str, Any]:
    """Everything that determines a training run's output: its inputs by content, its settings and its world
    shape (processes per node, nodes). Both the run's id and the train stage's cache key hash it."""
    return dict(shards=shards, hellaswag=hellaswag, init=init, seed=seed, settings=settings, world=world)


@dataclass
class _TrainCache(StageCache):
    """The stage's cache key: the inputs of the run's identity (`_run_identity`), the launch settings replaced by
    the world shape they resolve to (a 2-node run is never served a 1-node run's result, and a changed rendezvous
    port or Slurm partition does not retrain), and runs_dir."""

    def key_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        inputs = super().key_inputs(inputs)
        world = world_shape(*(inputs[name] for name in _LAUNCH_INPUTS))
        rest = {k: v for k, v in inputs.items() if k not in _LAUNCH_INPUTS}
        return {**rest, "world": world}


@task(name="train", cache_policy=_TrainCache(stage="train", code=TRAIN_CODE), persist_result=True,
      retries=TRAIN_RETRIES, retry_delay_seconds=TRAIN_RETRY_DELAY_S, retry_condition_fn=retry_if_transient)
def train(
    shards: ShardsRecord, hellaswag: EvalFileRecord | None, init: WeightsRecord, seed: int,
    settings: dict[str, Any], runs_dir: str, nproc: int | None = None, rendezvous: Rendezvous = Rendezvous(),
    launcher: Launcher = "local", slurm: SlurmSettings = SlurmSettings(),
) -> TrainRecord:
    """`torchrun -m gpt2.train` from the init stage's weights, on this host or as a Slurm job; retries resume from
    the newest checkpoint that verifies.

    The run directory is runs_dir/<id>, where the id hashes everything that determines the run (inputs by
    content, settings, process count, code), so a changed setting starts a new run instead of resuming an
    unrelated one, and a retry of the same run finds its own checkpoints.
    nproc: processes per node; default one per visible GPU, else 1 (CPU); under Slurm, slurm.gpus_per_node.
    """
    from gpt2.run_dir import RunDir

    nproc, nnodes = world_shape(launcher, nproc, rendezvous, slurm)
    run_id = stage_key("train", TRAIN_CODE, _run_identity(shards, hellaswag, init, seed, settings,
                                                         (nproc, nnodes)))[:RUN_ID_LENGTH]
    run_dir = RunDir(under(runs_dir, run_id))  # never a link planted at the run id's name that leaves runs_dir
    wired = {"model": init.model, "seed": seed, "train_data": shards.manifest, "val_data": shards.manifest,
             "hellaswag": hellaswag.path if hellaswag else None, "out_dir": str(run_dir.root), "init_from": init.path}
    # the shards, the HellaSwag file and the initial weights stay as they are until training ends: a tokenize,
    # hellaswag or init rerun waits
    with reading(shards, hellaswag, init):
        return _launch(run_dir, run_id, settings, wired, data_identity(shards, hellaswag), nproc, nnodes, rendezvous,
                       launcher, slurm)


def _launch(run_dir: RunDir, run_id: str, settings: dict[str, Any], wired: dict[str, Any], data: dict[str, Any],
            nproc: int, nnodes: int, rendezvous: Rendezvous, launcher: Launcher, slurm: SlurmSettings) -> TrainRecord:
    """Train the run until it is trained, by this stage's trainer or another's.

    The run directory has one writer: the trainer, which holds its lock for the whole session (gpt2.train, on
    whatever host Slurm runs it, so the lock lives exactly as long as the writer does). The stage waits for that
    lock before it writes the run's config, and says so once; a trainer started by another run in the moment
    between this stage's wait and its own trainer's start (two starts of one run at once) refuses ours with
    FolderLocked, and the stage goes back to waiting, then resumes from what that trainer left.
    """
    from gpt2.train_config import validate_train_settings

    # gpt2.train's own checks (unknown fields with suggestions, types, batch divisibility, ...) before any
    # process starts: a ConfigError is deterministic and is not retried
    config = validate_train_settings(settings, nproc * nnodes, wired, check_inputs=True)
    say_waiting = _once(get_run_logger().warning)
    while True:
        with run_dir.lock(wait=True, on_wait=say_waiting):  # never rewrite the config of a run being trained
            write_json(run_dir.launch_config, config.to_dict())
            # the val shards and HellaSwag file by content: the scheduled scan scores the run's checkpoints on them only
            write_json(run_dir.data_identity, data)
        try:
            return _train_session(run_dir, run_id, config, nproc, nnodes, rendezvous, launcher, slurm)
        except Exception as e:
            if not refused_a_locked_folder(e):
                raise


def _once(say: Callable[[str], None]) -> Callable[[str], None]:
    """`say`, for the first message only."""
    told = []

    def first(message: str) -> None:
        if not told:
            told.append(message)
            say(message)

    return first


def _train_session(run_dir: RunDir, run_id: str, config: TrainConfig, nproc: int, nnodes: int,
                   rendezvous: Rendezvous, launcher: Launcher, slurm: SlurmSettings) -> TrainRecord:
    """One training session of the run: gpt2.train on this host or as a Slurm job, its progress followed."""
    get_run_logger().info("training in %s with %d process(es) per node, %d node(s), launcher %s", run_dir.root,
                          nproc, nnodes, launcher)
    log = log_lines()
    progress = _TrainingProgress(run_dir.metrics, config.max_steps, run_artifact_key("train-progress", run_dir.root))

    def on_line(line: str) -> None:
        log(line)
        progress.poll()

    train_args = ["--config", str(run_dir.launch_config)]
    job = None
    # a crash (OOM, node failure) fails with CommandFailed, retried from the latest checkpoint; an error a rerun
    # would meet again (divergence, a bad shard, a full disk) fails at once: tasks.retry classifies it
    with watch_for_cancellation(stop=stop_all):  # a cancel the worker no longer sees still stops training
        if launcher == "slurm":
            job = _run_slurm_job(run_dir, run_id, train_args, nproc, rendezvous.max_restarts, slurm, on_line)
        else:
            run_streaming(torchrun_command("gpt2.train", train_args, nproc, rendezvous, run_id=run_id), on_line)
    progress.poll(now=True)
    return _train_record(run_dir, config, job)


def _run_slurm_job(run_dir: RunDir, run_id: str, train_args: list[str], nproc: int, max_restarts: int,
                   slurm: SlurmSettings, on_line: Callable[[str], None]) -> SlurmJobRecord:
    """Write the run's job script and run it as one Slurm job (tasks.slurm.run_job), which keeps it as
    slurm/job-<id>.sh once Slurm has taken it."""
    script = job_script(slurm, train_args, nproc, run_id, max_restarts, str(run_dir.slurm_output("%j")),
                        run_dir.slurm_heartbeat, job_name_for(run_dir.root.parent.name, run_id), Path.cwd())
    run_dir.slurm.mkdir(exist_ok=True)
    draft = run_dir.slurm / f"job.{os.getpid()}.sh.tmp"
    draft.write_text(script)
    return run_job(draft, run_dir.slurm_script, run_dir.slurm_heartbeat, run_dir.slurm_output, slurm, on_line)


def _train_record(run_dir: RunDir, config: TrainConfig, job: SlurmJobRecord | None = None) -> TrainRecord:
    """The record of a finished run, from the summary gpt2.train wrote and its metrics; the final checkpoint is
    verified (sizes and sha256) before it is recorded."""
    from gpt2.metrics import read_metrics

    summary = read_json(run_dir.summary)
    metrics = read_metrics(run_dir.metrics, get_run_logger().warning)
    figures = training_figures(metrics)
    curve = plot_loss_curve(metrics, run_dir.loss_curve, f"{run_dir.root.parent.name}/{run_dir.root.name}")
    final = CheckpointRecord.of(summary["checkpoint"], config.model)
    tokens = final.step * config.total_batch_size
    hellaswag = [m for m in metrics if m.get("kind") == "hellaswag"]
    rejected = tuple(f"{r['path']}: {r['problem']}" for r in summary.get("rejected_checkpoints", ()))
    markdown = run_summary_markdown(f"Training run {run_dir.root.name}", str(run_dir.root), final.step, tokens, figures,
                                    hellaswag[-1]["acc_norm"] if hellaswag else None, str(curve))
    if rejected:
        markdown += ("\nCheckpoints that failed verification, set aside and not resumed from (this session resumed "
                     f"from {summary.get('resumed_from') or 'the beginning'}):\n\n"
                     + "".join(f"- {r}\n" for r in rejected))
    if job:
        markdown += (f"\nSlurm job {job.job_id} ({job.state}, requeued {job.restarts} time(s)) on nodes {job.nodes}; "
                     f"script {job.script}, output {job.output}\n")
    best_effort("the training summary artifact", create_markdown_artifact, markdown,
                key=run_artifact_key("train-summary", run_dir.root),
                description="final loss, tokens/s and MFU against the reference points")
    return TrainRecord(
        # the data record is one of its files: a run whose record went missing is trained (resumed) again, writing it
        files=final.files + (FileRef.of(run_dir.summary), FileRef.of(run_dir.data_identity)), run_dir=str(run_dir.root),
        checkpoint=final,
        steps=final.step, tokens=tokens, train_loss=figures["train_loss"], val_loss=figures["val_loss"],
        tokens_per_s=figures["tokens_per_s"], mfu=figures["mfu"], loss_curve=str(curve), rejected_checkpoints=rejected,
        slurm_job=job,
    )
