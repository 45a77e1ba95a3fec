"""The evaluate stage: val loss and HellaSwag of a checkpoint (`python -m gpt2.evaluate`).

Each result goes into the run's TensorBoard log at the checkpoint's step and into the run's evaluations/
ledger, which the scheduled `gpt2-evaluate` flow reads to skip checkpoints already evaluated.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prefect import task

from common.files import read_json, write_json
from tasks.cache import FileRef, StageCache, StageRecord
from tasks.common import log_lines, python_module
from tasks.hellaswag import EvalFileRecord
from tasks.init import MODEL_CODE, CheckpointRecord
from tasks.launch import run_streaming
from tasks.tokenize import ShardsRecord

# modules whose source determines the stage's output (their edits invalidate its cache)
EVAL_CODE = MODEL_CODE + ("gpt2.evaluate",)  # entry modules; their imports count too

EVALUATIONS = "evaluations"  # per-run folder of evaluation results: one JSON per evaluated checkpoint


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

    def args(self, run_dir: Path) -> list[str]:
        """gpt2.evaluate's flags for a checkpoint of the run in `run_dir`."""
        run_config_path = run_dir / "config.json"
        run_config = read_json(run_config_path) if run_config_path.exists() else {}
        args = ["--device", self.device]
        for name in ("batch_size", "seq_len", "val_steps"):
            value = getattr(self, name) or run_config.get(name)
            if value is not None:  # neither given nor known from the run: gpt2.evaluate's default
                args += [f"--{name.replace('_', '-')}", str(value)]
        return args


def evaluation_path(checkpoint_dir: str | Path) -> Path:
    """run_dir/evaluations/<checkpoint name>.json: the ledger entry that marks a checkpoint as evaluated."""
    checkpoint_dir = Path(checkpoint_dir)  # <run_dir>/checkpoints/step_NNNNNNNN
    return checkpoint_dir.parent.parent / EVALUATIONS / f"{checkpoint_dir.name}.json"


def read_evaluation(checkpoint_dir: str | Path) -> dict[str, Any] | None:
    """The recorded evaluation of this checkpoint if its files still hold the evaluated content, else None.

    The files are checked as cached records are (size and mtime; hashed only when touched), so a scan
    does not re-read gigabytes of checkpoints that were evaluated before.
    """
    path = evaluation_path(checkpoint_dir)
    if not path.exists():
        return None
    entry = read_json(path)
    files = tuple(FileRef(**f) for f in entry.get("files", ()))
    return entry if files and StageRecord(files=files).problem() is None else None


def _write_tensorboard(run_dir: Path, step: int, result: dict[str, Any]) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(run_dir / "tensorboard"))
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
    ledger = evaluation_path(checkpoint.path)
    ledger.parent.mkdir(parents=True, exist_ok=True)
    out = ledger.with_name(ledger.name + ".result.tmp")
    args = ["--checkpoint", checkpoint.path, "--out", str(out), *settings.args(checkpoint.run_dir)]
    if shards is not None:
        args += ["--val-data", shards.val_glob]
    if hellaswag is not None:
        args += ["--hellaswag", hellaswag.path]
    run_streaming(python_module("gpt2.evaluate", args), log_lines())
    result = read_json(out)
    out.unlink()

    _write_tensorboard(checkpoint.run_dir, checkpoint.step, result)
    entry = {"checkpoint": checkpoint.path, "files": [asdict(f) for f in checkpoint.files], "step": checkpoint.step,
             "val_loss": result.get("val_loss"), "hellaswag": result.get("hellaswag")}
    write_json(ledger, entry)  # last, atomically: a crash before it leaves the checkpoint unevaluated
    return EvalRecord(files=(FileRef.of(ledger),), checkpoint=checkpoint.path, step=checkpoint.step,
                      val_loss=entry["val_loss"], hellaswag=entry["hellaswag"])
