"""The evaluate stage: val loss and HellaSwag of a checkpoint (`python -m gpt2.evaluate`), and the scan of the
runs that the scheduled `gpt2-evaluate` flow makes, checkpoint by checkpoint (a bad one is skipped and reported).

Each result goes into the run's TensorBoard log at the checkpoint's step and into the run's evaluations/
ledger (paths from gpt2.run_dir), which the scan reads to skip checkpoints already evaluated. Results are
cached by checkpoint content; a run whose checkpoint equals another run's gets the cached result filed in
its own ledger and TensorBoard log.

A result is filed with the identity of the data it came from (`data_identity`: the val shards' and HellaSwag
file's sha256). The train stage records the same identity for the run; the scan scores a run's checkpoints only
on that data, and reports them skipped where it changed or is gone (`data_as_recorded`).
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


class DataChanged(ValueError):
    """The val shards or HellaSwag file a run recorded are not what their files hold now (rebuilt, edited, gone),
    or the run recorded none: a number computed now would not be the run's."""


def data_identity(shards: ShardsRecord | None, hellaswag: EvalFileRecord | None) -> dict[str, Any]:
    """What an evaluation is scored on, by content, and where it is: the sha256 of each val shard (from the shard
    folder's manifest) and of the HellaSwag eval file. The train stage records it in the run directory
    (`RunDir.data_identity`: what the run trains and is validated on); each ledger entry records the one its
    numbers came from."""
    val = None if shards is None else {"manifest": shards.manifest, "sha256": shards.split_sha256("val")}
    return {"val_shards": val,
            "hellaswag": None if hellaswag is None else {"path": hellaswag.path, "sha256": hellaswag.sha256}}


def _content(identity: dict[str, Any] | None) -> tuple | None:
    """The part of a `data_identity` that is content (the sha256s), without where the files are."""
    if identity is None:
        return None
    shards, hellaswag = identity.get("val_shards"), identity.get("hellaswag")
    return (shards and shards["sha256"], hellaswag and hellaswag["sha256"])


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


def read_evaluation(run_dir: RunDir, step: int, data: dict[str, Any] | None) -> dict[str, Any] | None:
    """The recorded evaluation of this checkpoint if its files still hold the evaluated content and it was scored
    on `data` (a `data_identity`, by content), else None: an entry of other data, or of none recorded, is no
    evaluation of the run.

    The files are checked as cached records are (size and mtime; hashed only when touched), so a scan
    does not re-read gigabytes of checkpoints that were evaluated before.
    A ledger entry that cannot be read (damaged, edited) is named in the log and counts as no evaluation: the
    checkpoint is evaluated again and the entry rewritten whole.
    """
    path = run_dir.evaluation(step)
    if data is None or not path.exists():
        return None
    try:
        entry = read_json(path)
        files = tuple(FileRef(**f) for f in entry.get("files", ()))
    except (ValueError, TypeError, AttributeError) as e:
        get_run_logger().warning("%s: not a ledger entry this pipeline wrote (%s: %s); evaluating the checkpoint "
                                 "again", path, type(e).__name__, e)
        return None
    if _content(entry.get("data")) != _content(data):
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
            _require_unchanged(shards, hellaswag)  # what is read from here on is what the records (and ledger) name
            run_streaming(python_module("gpt2.evaluate", args), log_lines())
        result = read_json(out)
    finally:
        out.unlink(missing_ok=True)
    entry = file_evaluation(checkpoint, result.get("val_loss"), result.get("hellaswag"),
                            data_identity(shards, hellaswag))
    return EvalRecord(files=(FileRef.of(ledger),), checkpoint=checkpoint.path, step=checkpoint.step,
                      val_loss=entry["val_loss"], hellaswag=entry["hellaswag"])


def _require_unchanged(*records: StageRecord | None) -> None:
    """DataChanged naming the file, if a record's files no longer hold the content it names (a rebuild between the
    record and the read lock)."""
    if problem := next((p for r in records if r is not None and (p := r.problem())), None):
        raise DataChanged(f"{problem}: the data changed since it was recorded; a result now would not be of the "
                          "recorded data. Rerun the stage that makes it, then evaluate again")


def file_evaluation(checkpoint: CheckpointRecord, val_loss: float | None, hellaswag: dict[str, float] | None,
                    data: dict[str, Any]) -> dict[str, Any]:
    """Put an evaluation of `checkpoint`, scored on `data` (a `data_identity`), into its run's TensorBoard log and
    ledger (the ledger last, atomically: a crash before it leaves the checkpoint unevaluated); returns the ledger
    entry."""
    run_dir = RunDir(checkpoint.run_dir)
    result = {"val_loss": val_loss, "hellaswag": hellaswag}
    _write_tensorboard(run_dir, checkpoint.step, result)
    entry = {"checkpoint": checkpoint.path, "files": [asdict(f) for f in checkpoint.files], "step": checkpoint.step,
             **result, "data": data}
    write_json(run_dir.evaluation(checkpoint.step), entry)
    return entry


# ---------------------------------------------------------------------------------------------------------
# the scan of the runs (scheduled evaluation)


def recorded_data(run_dir: RunDir) -> dict[str, Any] | None:
    """The `data_identity` the train stage recorded for the run (what it trains and is validated on), or None."""
    return read_json(run_dir.data_identity) if run_dir.data_identity.exists() else None


def data_as_recorded(run_dir: RunDir, recorded: dict[str, Any] | None) -> tuple[ShardsRecord | None,
                                                                                EvalFileRecord | None]:
    """The val shards and HellaSwag file the run recorded (`recorded_data`), as records of their files now;
    DataChanged saying what differs where they changed, are gone, or nothing was recorded. (Each shard's bytes
    are checked against the manifest when gpt2.evaluate reads it.)"""
    if recorded is None:
        raise DataChanged(
            f"{run_dir.data_identity} is missing: the run recorded no identity of the val shards and HellaSwag file "
            "it was trained on (trained outside the pipeline, or before its train stage recorded it), so a number "
            "computed now could come from other data; evaluate it with `python -m gpt2.evaluate --checkpoint ... "
            "--val-data ...` on the data it used, or train it again through the pipeline")
    shards = _shards_now(recorded["val_shards"])
    hellaswag = _eval_file_now(recorded["hellaswag"])
    if difference := _difference(recorded, data_identity(shards, hellaswag)):
        raise DataChanged(f"{difference}; a number computed now would come from other data than the run's")
    return shards, hellaswag


def _shards_now(recorded: dict[str, Any] | None) -> ShardsRecord | None:
    if recorded is None:
        return None
    manifest = Path(recorded["manifest"])
    try:
        return ShardsRecord.from_manifest(manifest.parent)
    except FileNotFoundError as e:
        raise DataChanged(f"the val shards the run was trained on are gone: {e.filename or manifest} is missing "
                          "(the dataset was deleted, moved or is being rebuilt)") from None


def _eval_file_now(recorded: dict[str, Any] | None) -> EvalFileRecord | None:
    if recorded is None:
        return None
    if not Path(recorded["path"]).is_file():
        raise DataChanged(f"the HellaSwag file the run was trained with is gone: {recorded['path']} is missing")
    return EvalFileRecord.of(recorded["path"])


def _difference(recorded: dict[str, Any], now: dict[str, Any]) -> str | None:
    """What differs between the recorded data and the data now (two `data_identity`s), naming files and sha256s."""
    if recorded["val_shards"] and recorded["val_shards"]["sha256"] != now["val_shards"]["sha256"]:
        was, found = recorded["val_shards"]["sha256"], now["val_shards"]["sha256"]
        changed = sorted(name for name in {*was, *found} if was.get(name) != found.get(name))
        listing = ", ".join(f"{name} sha256 {found.get(name, 'none')[:16]} where the run recorded "
                            f"{was.get(name, 'none')[:16]}" for name in changed)
        return (f"the val shards changed since the run was trained on them: {now['val_shards']['manifest']} lists "
                f"{listing} (the dataset was rebuilt from other documents or settings)")
    if recorded["hellaswag"] and recorded["hellaswag"]["sha256"] != now["hellaswag"]["sha256"]:
        return (f"the HellaSwag file changed since the run was trained with it: {now['hellaswag']['path']} has "
                f"sha256 {now['hellaswag']['sha256'][:16]} where the run recorded "
                f"{recorded['hellaswag']['sha256'][:16]}")
    return None


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
    from gpt2.checkpoint_files import list_checkpoints

    if not run_dir.config.exists():
        get_run_logger().info("%s: no config.json yet (training has not started); skipped", run_dir.root)
        return []
    model = read_json(run_dir.config)["model"]
    recorded = recorded_data(run_dir)  # what the run trained on: results scored on it stand whatever happened since
    try:
        shards, hellaswag = data_as_recorded(run_dir, recorded)
        unusable = None
    except Exception as e:  # no checkpoint of the run is scored now; each is reported with this reason
        shards = hellaswag = None
        unusable = f"{type(e).__name__}: {e}"
    rows = []
    for step, path in list_checkpoints(run_dir.root):
        try:
            if done := read_evaluation(run_dir, step, recorded):  # without hashing the checkpoint again
                rows.append(_row(run_dir, step, done, evaluated_now=False))
            elif unusable:
                rows.append(_skipped_row(run_dir, step, unusable))
            else:
                rows.append(_evaluate_step(run_dir, step, path, model, shards, hellaswag, settings))
        except Exception as e:  # one bad checkpoint never stops the others
            gone = not path.exists()  # pruned by its training run while the scan read it
            rows.append(_skipped_row(run_dir, step, "removed since the scan listed it (pruned by its training run)"
                                     if gone else f"{type(e).__name__}: {e}"))
    return rows


def _evaluate_step(run_dir: RunDir, step: int, path: Path, model: str, shards: ShardsRecord | None,
                   hellaswag: EvalFileRecord | None, settings: EvalSettings) -> dict[str, Any]:
    """The table row of one checkpoint, evaluated now on the run's recorded data."""
    inside(path, run_dir.checkpoints)
    checkpoint = CheckpointRecord.of(path, model)
    data = data_identity(shards, hellaswag)
    record = evaluate_checkpoint(checkpoint, shards, hellaswag, settings)
    done = read_evaluation(run_dir, step, data)
    if done is None:  # a cached result of another run's checkpoint with the same content, scored on the same data
        done = file_evaluation(checkpoint, record.val_loss, record.hellaswag, data)
    return _row(run_dir, step, done, evaluated_now=True)


def _row(run_dir: RunDir, step: int, done: dict[str, Any], evaluated_now: bool) -> dict[str, Any]:
    hs = done["hellaswag"] or {}
    return {"run": run_dir.root.name, "step": step, "val_loss": done["val_loss"], "acc": hs.get("acc"),
            "acc_norm": hs.get("acc_norm"), "evaluated_now": evaluated_now, "skipped": None}


def _skipped_row(run_dir: RunDir, step: int | None, why: str) -> dict[str, Any]:
    get_run_logger().warning("%s not evaluated: %s", run_dir.root if step is None else run_dir.checkpoint(step), why)
    return {"run": run_dir.root.name, "step": step, "val_loss": None, "acc": None, "acc_norm": None,
            "evaluated_now": False, "skipped": why}
