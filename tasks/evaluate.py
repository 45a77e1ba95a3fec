"""The evaluate stage: val loss and HellaSwag of a checkpoint (`python -m gpt2.evaluate`).

Each result goes into the run's TensorBoard log at the checkpoint's step and into the run's evaluations/
ledger, which the scheduled `gpt2-evaluate` flow reads to skip checkpoints already evaluated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import task

from tasks.cache import FileRef, StageCache, StageRecord
from tasks.common import log_lines, python_module
from tasks.hellaswag import EvalFileRecord
from tasks.init import MODEL_CODE, CheckpointRecord
from tasks.launch import run_streaming
from tasks.tokenize import ShardsRecord

# modules whose source determines the stage's output (their edits invalidate its cache)
EVAL_CODE = MODEL_CODE + ("gpt2.evaluate", "gpt2.distributed", "data.loader", "data.hellaswag")

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
        run_config = json.loads(run_config_path.read_text()) if run_config_path.exists() else {}
        args = ["--device", self.device]
        for name in ("batch_size", "seq_len", "val_steps"):
            value = getattr(self, name) or run_config.get(name)
            if value is not None:  # neither given nor known from the run: gpt2.evaluate's default
                args += [f"--{name.replace('_', '-')}", str(value)]
        return args


def evaluation_path(checkpoint: CheckpointRecord) -> Path:
    """run_dir/evaluations/<checkpoint name>.json: the ledger entry that marks a checkpoint as evaluated."""
    return checkpoint.run_dir / EVALUATIONS / f"{Path(checkpoint.path).name}.json"


def read_evaluation(checkpoint: CheckpointRecord) -> dict[str, Any] | None:
    """The recorded evaluation of exactly this checkpoint content, or None if it has not been evaluated."""
    path = evaluation_path(checkpoint)
    if not path.exists():
        return None
    entry = json.loads(path.read_text())
    return entry if entry.get("checkpoint_digest") == checkpoint.content_digest() else None


def _write_tensorboard(run_dir: Path, step: int, result: dict[str, Any]) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(run_dir / "tensorboard"))
    try:
        if result.get("val_loss") is not None:
            writer.add_scalar("eval/val_loss", result["val_loss"], step)
        for key in ("acc", "acc_norm"):
            if result.get("hellaswag"):
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
    ledger = evaluation_path(checkpoint)
    ledger.parent.mkdir(parents=True, exist_ok=True)
    out = ledger.with_name(ledger.name + ".result.tmp")
    args = ["--checkpoint", checkpoint.path, "--out", str(out), *settings.args(checkpoint.run_dir)]
    if shards is not None:
        args += ["--val-data", shards.val_glob]
    if hellaswag is not None:
        args += ["--hellaswag", hellaswag.path]
    run_streaming(python_module("gpt2.evaluate", args), log_lines())
    result = json.loads(out.read_text())
    out.unlink()

    _write_tensorboard(checkpoint.run_dir, checkpoint.step, result)
    entry = {"checkpoint": checkpoint.path, "checkpoint_digest": checkpoint.content_digest(), "step": checkpoint.step,
             "val_loss": result.get("val_loss"), "hellaswag": result.get("hellaswag")}
    tmp = ledger.with_name(ledger.name + ".tmp")
    tmp.write_text(json.dumps(entry, indent=2) + "\n")
    tmp.replace(ledger)  # last: a crash before this line leaves the checkpoint unevaluated, never half-recorded
    return EvalRecord(files=(FileRef.of(ledger),), checkpoint=checkpoint.path, step=checkpoint.step,
                      val_loss=entry["val_loss"], hellaswag=entry["hellaswag"])
