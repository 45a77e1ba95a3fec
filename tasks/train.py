"""The train stage: `torchrun -m gpt2.train` from the init checkpoint, in a run directory named by content."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact

from common.files import atomic_path
from tasks.cache import FileRef, StageCache, StageRecord, stage_key
from tasks.common import artifact_key, log_lines
from tasks.hellaswag import EvalFileRecord
from tasks.init import MODEL_CODE, CheckpointRecord
from tasks.launch import CommandFailed, Rendezvous, run_streaming, torchrun_command, visible_gpus
from tasks.report import plot_loss_curve, read_metrics, run_summary_markdown, training_figures
from tasks.retry import TransientError, retry_if_transient
from tasks.tokenize import ShardsRecord

if TYPE_CHECKING:
    from gpt2.train_config import TrainConfig

# modules whose source determines the stage's output (their edits invalidate its cache and name a new run)
TRAIN_CODE = MODEL_CODE + ("gpt2.train",)

TRAIN_RETRIES = 2  # a crashed training process is retried, resuming from its latest checkpoint
TRAIN_RETRY_DELAY_S = 30
_STEP_LINE = re.compile(r"^step\s+(\d+)/(\d+) \|")  # gpt2.train's per-step console line


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


def _copy_checkpoint(src: Path, run_dir: Path) -> None:
    """Put checkpoint `src` into run_dir/checkpoints under the same name, atomically (copy, then rename)."""
    dest = run_dir / "checkpoints" / src.name
    if dest.exists():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".tmp_{dest.name}_copy")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    tmp.rename(dest)


def _train_config(run_dir: Path, shards: ShardsRecord, hellaswag: EvalFileRecord | None, init: CheckpointRecord,
                  seed: int, settings: dict[str, Any]) -> dict[str, Any]:
    """gpt2.train's config: the stage's inputs wired in, `settings` (TrainConfig fields) on top."""
    wired = {"model": init.model, "seed": seed, "train_data": shards.train_glob, "val_data": shards.val_glob,
             "hellaswag": hellaswag.path if hellaswag else None, "out_dir": str(run_dir)}
    clash = sorted(set(wired) & set(settings))
    if clash:
        raise ValueError(f"train settings must not set {', '.join(clash)}: the pipeline wires them from its stages")
    return {**wired, **settings}


class _ProgressReporter:
    """Turns gpt2.train's `step N/M |` lines into a Prefect progress artifact (updated every whole percent)."""

    def __init__(self, key: str):
        self.artifact_id = create_progress_artifact(0.0, key=key, description="training progress")
        self.shown = 0

    def __call__(self, line: str) -> None:
        if m := _STEP_LINE.match(line):
            percent = int(100 * int(m.group(1)) / int(m.group(2)))
            if percent > self.shown:
                update_progress_artifact(self.artifact_id, float(percent))
                self.shown = percent


@task(name="train", cache_policy=StageCache(stage="train", code=TRAIN_CODE, ignore=("rendezvous",)),
      persist_result=True, retries=TRAIN_RETRIES, retry_delay_seconds=TRAIN_RETRY_DELAY_S,
      retry_condition_fn=retry_if_transient)
def train(
    shards: ShardsRecord, hellaswag: EvalFileRecord | None, init: CheckpointRecord, seed: int,
    settings: dict[str, Any], runs_dir: str, nproc: int | None = None, rendezvous: Rendezvous = Rendezvous(),
) -> TrainRecord:
    """`torchrun -m gpt2.train` from the init checkpoint; retries resume from the latest checkpoint.

    The run directory is runs_dir/<id>, where the id hashes everything that determines the run (inputs by
    content, settings, process count, code), so a changed setting starts a new run instead of resuming an
    unrelated one, and a retry of the same run finds its own checkpoints.
    nproc: processes per node; default one per visible GPU, else 1 (CPU).
    """
    from gpt2.train_config import load_config, validate

    nproc = nproc or max(1, visible_gpus())
    run_id = stage_key("train", TRAIN_CODE, dict(shards=shards, hellaswag=hellaswag, init=init, seed=seed,
                                                   settings=settings, nproc=nproc))[:12]
    run_dir = Path(runs_dir).resolve() / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "pipeline_train_config.json"
    with atomic_path(config_path) as tmp:  # renamed to config_path only once gpt2.train accepts it
        tmp.write_text(json.dumps(_train_config(run_dir, shards, hellaswag, init, seed, settings), indent=2) + "\n")
        # gpt2.train's own checks (unknown fields with suggestions, types, batch divisibility, ...) before any
        # process starts: a ConfigError is deterministic and is not retried
        config = load_config(["--config", str(tmp)])
        validate(config, world_size=nproc * rendezvous.nnodes)
    _copy_checkpoint(Path(init.path), run_dir)  # gpt2.train starts from step 0 when it has no later checkpoint

    logger = get_run_logger()
    logger.info("training in %s with %d process(es) per node", run_dir, nproc)
    log, progress = log_lines(), _ProgressReporter(artifact_key("train-progress", run_id))

    def on_line(line: str) -> None:
        log(line)
        progress(line)

    cmd = torchrun_command("gpt2.train", ["--config", str(config_path)], nproc, rendezvous, run_id=run_id)
    try:
        run_streaming(cmd, on_line)
    except CommandFailed as e:  # a crash (OOM, node failure, NaN guard): retried, resuming from a checkpoint
        raise TransientError(str(e)) from e
    return _train_record(run_dir, config)


def _train_record(run_dir: Path, config: TrainConfig) -> TrainRecord:
    from gpt2.checkpoint import latest_checkpoint

    metrics = read_metrics(run_dir / "metrics.jsonl")
    figures = training_figures(metrics)
    curve = plot_loss_curve(metrics, run_dir / "loss_curve.png", f"{run_dir.parent.name}/{run_dir.name}")
    final = CheckpointRecord.of(latest_checkpoint(run_dir), config.model)
    tokens = final.step * config.total_batch_size
    hellaswag = [m for m in metrics if m.get("kind") == "hellaswag"]
    create_markdown_artifact(
        run_summary_markdown(f"Training run {run_dir.name}", str(run_dir), final.step, tokens, figures,
                             hellaswag[-1]["acc_norm"] if hellaswag else None, str(curve)),
        key=artifact_key("train-summary", run_dir.name),
        description="final loss, tokens/s and MFU against the reference points",
    )
    return TrainRecord(
        files=final.files + (FileRef.of(run_dir / "summary.json"),), run_dir=str(run_dir), checkpoint=final,
        steps=final.step, tokens=tokens, train_loss=figures["train_loss"], val_loss=figures["val_loss"],
        tokens_per_s=figures["tokens_per_s"], mfu=figures["mfu"], loss_curve=str(curve),
    )
