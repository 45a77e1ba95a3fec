"""The evaluate stage: val loss and HellaSwag of a checkpoint (`python -m gpt2.evaluate`), and the scan of the
runs that the scheduled `gpt2-evaluate` flow makes, checkpoint by checkpoint (a bad one is skipped and reported).

Each result goes into the run's TensorBoard log at the checkpoint's step and into the run's evaluations/
ledger (paths from gpt2.run_dir), which the scan reads to skip checkpoints already evaluated. Results are
cached by checkpoint content; a run whose checkpoint equals another run's gets the cached result filed in
its own ledger and TensorBoard log.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task

from common.files import read_json, write_json
from common.paths import inside
from gpt2.run_dir import RunDir
from tasks.cache import FileRef, StageCache, StageRecord
from tasks.common import artifact_key, log_lines, python_module, reading
from tasks.hellaswag import EvalFileRecord
from tasks.init import MODEL_CODE, CheckpointRecord
from tasks.launch import run_streaming
from tasks.progress import ProgressReporter
from tasks.tokenize import ShardsRecord

# modules whose source determines the stage's output (their edits invalidate its cache)
EVAL_CODE = MODEL_CODE + ("gpt2.evaluate",)  # entry modules; their imports count too


@dataclass(frozen=True)
class EvalRecord(StageRecord):
    checkpoint: str
    step: int
    val_loss: float | None
    hellaswag: dict[str, float] | None  # {"acc", "acc_norm", "n", ...}


@dataclass(frozen=True)
class EvalSettings:
    """How checkpoints are evaluated; None: the value the run was trained with (its config.json)."""

    batch_size: int | None = None
    seq_len: int | None = None
    val_steps: int | None = None
    device: str = "auto"

    def __post_init__(self) -> None:  # checked with every other setting, before any stage runs
        for name in ("batch_size", "seq_len", "val_steps"):
            if (value := getattr(self, name)) is not None and value < 1:
                raise ValueError(f"eval.{name} must be >= 1 (or null: the run's own), got {value}")

    def args(self, run_dir: RunDir) -> list[str]:
        """gpt2.evaluate's flags for a checkpoint of the run in `run_dir`."""
        run_config = read_json(run_dir.config) if run_dir.config.exists() else {}
        args = ["--device", self.device]
        for name in ("batch_size", "seq_len", "val_steps"):
            value = getattr(self, name) or run_config.get(name)
            if value is not None:  # neither given nor known from the run: gpt2.evaluate's default
                args += [f"--{name.replace('_', '-')}", str(value)]
        return args


def read_evaluation(run_dir: RunDir, step: int) -> dict[str, Any] | None:
    """The recorded evaluation of this checkpoint if its files still hold the evaluated content, else None.

    The files are checked as cached records are (size and mtime; hashed only when touched), so a scan
    does not re-read gigabytes of checkpoints that were evaluated before.
    A ledger entry that cannot be read (damaged, edited) is named in the log and counts as no evaluation: the
    checkpoint is evaluated again and the entry rewritten whole.
    """
    path = run_dir.evaluation(step)
    if not path.exists():
        return None
    try:
        entry = read_json(path)
        files = tuple(FileRef(**f) for f in entry.get("files", ()))
    except (ValueError, TypeError, AttributeError) as e:
        get_run_logger().warning("%s: not a ledger entry this pipeline wrote (%s: %s); evaluating the checkpoint "
                                 "again", path, type(e).__name__, e)
        return None
    return entry if files and StageRecord(files=files).problem() is None else None


def _write_tensorboard(run_dir: RunDir, step: int, result: dict[str, Any]) -> None:
    from gpt2.metrics import EventLog

    writer = EventLog(run_dir.tensorboard)  # a full disk: DiskFull naming the event file
    try:
        if result.get("val_loss") is not None:
            writer.add_scalar("eval/val_loss", result["val_loss"], step)
        if result.get("hellaswag"):
            for key in ("acc", "acc_norm"):
                writer.add_scalar(f"eval/hellaswag_{key}", result["hellaswag"][key], step)
    finally:
        writer.close()


@task(name="evaluate", cache_policy=StageCache(stage="evaluate", code=EVAL_CODE), persist_result=True,
      task_run_name="evaluate-step-{checkpoint.step}")
def evaluate_checkpoint(
    checkpoint: CheckpointRecord, shards: ShardsRecord | None, hellaswag: EvalFileRecord | None,
    settings: EvalSettings = EvalSettings(),
) -> EvalRecord:
    """Val loss and HellaSwag of one checkpoint (`python -m gpt2.evaluate`), into the run's TensorBoard log at
    the checkpoint's step and its evaluations/ ledger."""
    if shards is None and hellaswag is None:
        raise ValueError("evaluate: nothing to evaluate; give val shards and/or a HellaSwag eval file")
    ledger = RunDir(checkpoint.run_dir).evaluation(checkpoint.step)  # marks the checkpoint evaluated
    # this evaluation's own result file: a pipeline's final evaluation and a scheduled scan can evaluate the
    # same checkpoint at once, and with one shared name the first to finish deleted the other's result
    out = ledger.with_name(f"{ledger.name}.{uuid.uuid4().hex}.result.tmp")
    args = ["--checkpoint", checkpoint.path, "--out", str(out), *settings.args(RunDir(checkpoint.run_dir))]
    if shards is not None:
        args += ["--val-data", shards.manifest]
    if hellaswag is not None:
        args += ["--hellaswag", hellaswag.path]
    try:
        with reading(shards, hellaswag):  # a rerun writing them waits
            run_streaming(python_module("gpt2.evaluate", args), log_lines())
        result = read_json(out)
    finally:
        out.unlink(missing_ok=True)
    entry = file_evaluation(checkpoint, result.get("val_loss"), result.get("hellaswag"))
    return EvalRecord(files=(FileRef.of(ledger),), checkpoint=checkpoint.path, step=checkpoint.step,
                      val_loss=entry["val_loss"], hellaswag=entry["hellaswag"])


def file_evaluation(checkpoint: CheckpointRecord, val_loss: float | None,
                    hellaswag: dict[str, float] | None) -> dict[str, Any]:
    """Put an evaluation of `checkpoint` into its run's TensorBoard log and ledger (the ledger last, atomically:
    a crash before it leaves the checkpoint unevaluated); returns the ledger entry."""
    run_dir = RunDir(checkpoint.run_dir)
    result = {"val_loss": val_loss, "hellaswag": hellaswag}
    _write_tensorboard(run_dir, checkpoint.step, result)
    entry = {"checkpoint": checkpoint.path, "files": [asdict(f) for f in checkpoint.files], "step": checkpoint.step,
             **result}
    write_json(run_dir.evaluation(checkpoint.step), entry)
    return entry


# ---------------------------------------------------------------------------------------------------------
# the scan of the runs (scheduled evaluation)


def _run_inputs(run_dir: RunDir) -> tuple[str, ShardsRecord | None, EvalFileRecord | None]:
    """(model, val shards, HellaSwag file) of a training run, from the config.json gpt2.train wrote."""
    config = read_json(run_dir.config)
    shards = ShardsRecord.from_manifest(Path(config["val_data"]).parent) if config.get("val_data") else None
    hellaswag = EvalFileRecord.of(config["hellaswag"]) if config.get("hellaswag") else None
    return config["model"], shards, hellaswag


def scan_runs(runs_dir: str | Path, settings: EvalSettings = EvalSettings()) -> list[dict[str, Any]]:
    """Evaluate every checkpoint under `runs_dir` that its run's ledger does not hold yet; one table row per
    checkpoint, and per run whose inputs cannot be read.

    Each run and each checkpoint stands alone: whatever goes wrong with one (a damaged marker or config, a
    missing manifest, a checkpoint pruned by its training run since the listing, a path that leads out of
    `runs_dir`) is logged and reported in its row's `skipped`, and the scan goes on with the others.
    """
    rows = []
    run_dirs = RunDir.all_under(runs_dir)
    progress = ProgressReporter(artifact_key("scan-progress"), f"runs under {runs_dir} scanned")
    for done, run_dir in enumerate(run_dirs):
        progress(done / len(run_dirs))
        try:
            inside(run_dir.root, runs_dir)  # the scan writes evaluations/ and tensorboard/ there
            run_dir.check_confined()
            rows += _evaluate_run(run_dir, settings)
        except Exception as e:  # one bad run never stops the scan
            rows.append(_skipped_row(run_dir, None, f"{type(e).__name__}: {e}"))
    progress.finish()
    return rows


def _evaluate_run(run_dir: RunDir, settings: EvalSettings) -> list[dict[str, Any]]:
    from gpt2.checkpoint import list_checkpoints

    if not run_dir.config.exists():
        get_run_logger().info("%s: no config.json yet (training has not started); skipped", run_dir.root)
        return []
    model, shards, hellaswag = _run_inputs(run_dir)
    rows = []
    for step, path in list_checkpoints(run_dir.root):
        try:
            rows.append(_evaluate_step(run_dir, step, path, model, shards, hellaswag, settings))
        except Exception as e:  # one bad checkpoint never stops the others
            gone = not path.exists()  # pruned by its training run while the scan read it
            rows.append(_skipped_row(run_dir, step, "removed since the scan listed it (pruned by its training run)"
                                     if gone else f"{type(e).__name__}: {e}"))
    return rows


def _evaluate_step(run_dir: RunDir, step: int, path: Path, model: str, shards: ShardsRecord | None,
                   hellaswag: EvalFileRecord | None, settings: EvalSettings) -> dict[str, Any]:
    """The table row of one checkpoint, evaluated now unless the ledger holds its evaluation."""
    done = read_evaluation(run_dir, step)  # without hashing the checkpoint again
    evaluated_now = done is None
    if evaluated_now:
        inside(path, run_dir.checkpoints)
        checkpoint = CheckpointRecord.of(path, model)
        record = evaluate_checkpoint(checkpoint, shards, hellaswag, settings)
        done = read_evaluation(run_dir, step)
        if done is None:  # a cached result of another run's checkpoint with the same content
            done = file_evaluation(checkpoint, record.val_loss, record.hellaswag)
    hs = done["hellaswag"] or {}
    return {"run": run_dir.root.name, "step": step, "val_loss": done["val_loss"], "acc": hs.get("acc"),
            "acc_norm": hs.get("acc_norm"), "evaluated_now": evaluated_now, "skipped": None}


def _skipped_row(run_dir: RunDir, step: int | None, why: str) -> dict[str, Any]:
    get_run_logger().warning("%s not evaluated: %s", run_dir.root if step is None else run_dir.checkpoint(step), why)
    return {"run": run_dir.root.name, "step": step, "val_loss": None, "acc": None, "acc_norm": None,
            "evaluated_now": False, "skipped": why}
