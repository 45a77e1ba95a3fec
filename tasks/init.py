"""The init stage: the weights training starts from, identified by their content.

Either llm.c's init in PyTorch RNG order (gpt2.init) from a seed, written as a step-0 checkpoint, or
existing weights (`init_from`: one of our checkpoints, a run directory, recorded as its newest checkpoint
that verifies, an llm.c model file or a Hugging Face GPT-2 directory) for continued pretraining or
fine-tuning. Both give a `WeightsRecord`, whose files are the content identity that train's cache key and
run id are made of.

`CheckpointRecord` (a verified checkpoint directory, by content and step) is the output of train and the
input of evaluate and sample; `MODEL_CODE` (the checkpoint format, and through its imports the model and
its init) is part of each of their code versions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect import get_run_logger, task

from tasks.cache import FileRef, StageCache, StageRecord

# modules whose source determines the stage's output (their edits invalidate its cache)
MODEL_CODE = ("gpt2.checkpoint", "gpt2.weights")  # entry modules; their imports count too (tasks.cache)


@dataclass(frozen=True)
class CheckpointRecord(StageRecord):
    path: str  # checkpoint directory (gpt2.checkpoint layout)
    step: int
    model: str  # model spec it was built from

    @property
    def run_dir(self) -> Path:
        from gpt2.run_dir import RunDir

        return RunDir.of_checkpoint(self.path).root

    def content_digest(self) -> str:
        # the step is part of the identity: evaluations are filed and plotted under it
        return f"{super().content_digest()}@{self.step}"

    @classmethod
    def of(cls, path: str | Path, model: str) -> "CheckpointRecord":
        """The record of a loadable checkpoint that verifies (every file's size and sha256 against its COMPLETE
        marker); gpt2.checkpoint.CheckpointError naming the file, or the conversion an older format needs, otherwise.

        The marker is one of the record's files: a checkpoint whose marker went missing is incomplete, so a
        cached record of it is stale."""
        from gpt2.checkpoint_files import COMPLETE_MARKER, require_current_format, verify_checkpoint

        path = Path(path).resolve()
        marker = require_current_format(path, verify_checkpoint(path))
        files = tuple(FileRef.with_sha256(path / name, entry["sha256"]) for name, entry in marker["files"].items())
        return cls(files=files + (FileRef.of(path / COMPLETE_MARKER),), path=str(path), step=marker["step"],
                   model=model)


@dataclass(frozen=True)
class WeightsRecord(StageRecord):
    """The weights a training run starts from: `path` is what gpt2.train's `init_from` takes."""

    path: str
    model: str  # model spec of the run
    source: str  # `init` (llm.c's init from the seed), `checkpoint`, `llmc` or `hf`

    @property
    def folder(self) -> Path | None:
        """What the train stage holds the read lock of while it trains from these weights (tasks.common.reading):
        the folder the init stage writes its step-0 checkpoint in under its lock (a second init of it, from a
        run started at the same moment, waits instead of replacing the checkpoint a trainer is reading); None for
        weights no stage writes."""
        from gpt2.run_dir import RunDir

        return RunDir.of_checkpoint(self.path).root if self.source == "init" else None


def _weights_identity(init_from: str) -> dict[str, str]:
    """What `init_from` stands for now, by content, for the init stage's cache key: the sha256 of each file of the
    weights it resolves to (gpt2.weights.resolve_source: a run directory is its newest checkpoint that verifies,
    so a run that gained a checkpoint is another key)."""
    from gpt2.weights import resolve_source

    source = resolve_source(Path(init_from).resolve())
    return {f"{source.kind}:{f.name}": digest for f, digest in source.file_digests().items()}


def _existing_weights(init_from: str, model: str) -> WeightsRecord:
    """The record of a weight source whose shape is `model`'s; ValueError naming both otherwise. A run directory
    is recorded as the checkpoint it stands for (gpt2.weights.resolve_source), which training then starts from."""
    from gpt2.config import parse_model_spec
    from gpt2.weights import load_model, resolve_source

    source = resolve_source(Path(init_from).resolve())  # a checkpoint's files are verified (sha256) here, once
    files = tuple(FileRef.with_sha256(f, digest) for f, digest in source.file_digests().items())
    held, _ = load_model(source)  # reads every weight: a source that cannot be loaded fails here, not in train
    if held.config != parse_model_spec(model):
        raise ValueError(f"init_from {init_from} holds model {held.config}, but model={model!r} is "
                         f"{parse_model_spec(model)}; set model to the source's shape")
    return WeightsRecord(files=files, path=str(source.path), model=model, source=source.kind)


@task(name="init", cache_policy=StageCache(stage="init", code=MODEL_CODE, resolve=(("init_from", _weights_identity),)),
      persist_result=True)
def init_model(model: str, seed: int, out_dir: str, init_from: str | None = None) -> WeightsRecord:
    """The weights training starts from: `init_from` as it is, or llm.c's init of `model` from `seed` written
    as a step-0 checkpoint under `out_dir`."""
    from gpt2.checkpoint import write_initial_checkpoint
    from gpt2.run_dir import RunDir

    logger = get_run_logger()
    if init_from:
        record = _existing_weights(init_from, model)
        logger.info("training starts from %s (%s, %d file(s) hashed)", record.path, record.source, len(record.files))
        return record
    # the lock waits for another init of the same folder, and removes what a killed one left half-written
    with RunDir(out_dir).lock(wait=True, on_wait=logger.warning):
        path = write_initial_checkpoint(out_dir, model, seed)
    logger.info("initial weights of %s (seed %d) in %s", model, seed, path)
    checkpoint = CheckpointRecord.of(path, model)
    return WeightsRecord(files=checkpoint.files, path=checkpoint.path, model=model, source="init")
