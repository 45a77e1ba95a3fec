"""The init stage: the step-0 checkpoint, weights initialised in llm.c's PyTorch RNG order (gpt2.init).

`CheckpointRecord` (a checkpoint directory by content and step) is the input of train, evaluate and sample,
and `MODEL_CODE` (the checkpoint format, and through its imports the model and its init) is part of each
of their code versions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect import get_run_logger, task

from tasks.cache import FileRef, StageCache, StageRecord

# modules whose source determines the stage's output (their edits invalidate its cache)
MODEL_CODE = ("gpt2.checkpoint",)  # entry modules; what they import counts too (tasks.cache.code_version)


@dataclass(frozen=True)
class CheckpointRecord(StageRecord):
    path: str  # checkpoint directory (gpt2.checkpoint layout)
    step: int
    model: str  # model spec it was built from

    @property
    def run_dir(self) -> Path:
        return Path(self.path).parent.parent  # <run_dir>/checkpoints/step_NNNNNNNN

    def content_digest(self) -> str:
        # the step is part of the identity: evaluations are filed and plotted under it
        return f"{super().content_digest()}@{self.step}"

    @classmethod
    def of(cls, path: str | Path, model: str) -> "CheckpointRecord":
        from common.files import read_json
        from gpt2.checkpoint import COMPLETE_MARKER, MODEL_FILE, STATE_FILE

        path = Path(path).resolve()
        step = read_json(path / COMPLETE_MARKER)["step"]
        files = tuple(FileRef.of(path / name) for name in (STATE_FILE, MODEL_FILE))
        return cls(files=files, path=str(path), step=step, model=model)


@task(name="init", cache_policy=StageCache(stage="init", code=MODEL_CODE), persist_result=True)
def init_model(model: str, seed: int, out_dir: str) -> CheckpointRecord:
    """Step-0 checkpoint: weights initialised in llm.c's PyTorch RNG order (gpt2.init) from `seed`."""
    from gpt2.checkpoint import write_initial_checkpoint

    path = write_initial_checkpoint(out_dir, model, seed)
    get_run_logger().info("initial weights of %s (seed %d) in %s", model, seed, path)
    return CheckpointRecord.of(path, model)
