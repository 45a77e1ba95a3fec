"""One Prefect task per pipeline stage. The work lives in data/ and gpt2/; a task here only

1. calls that code (in process, or `torchrun -m gpt2.train` / `python -m gpt2.*` as a child process),
2. returns a small `StageRecord` (paths, content hashes, metrics) that the next stage takes as input,
3. publishes an artifact people look at.

Every task caches with `StageCache` (key = parameters + inputs by content + code version; a record whose
files changed is recomputed) and has a retry policy: network stages back off exponentially with jitter,
training retries resume from the latest checkpoint, deterministic errors are never retried.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, create_table_artifact
from prefect.artifacts import update_progress_artifact

from tasks.cache import FileRef, StageCache, StageRecord, stage_key
from tasks.launch import CommandFailed, Rendezvous, run_streaming, torchrun_command, visible_gpus
from tasks.report import plot_loss_curve, read_metrics, run_summary_markdown, training_figures
from tasks.retry import NETWORK_RETRIES, TransientError, retry_if_transient

if TYPE_CHECKING:
    from gpt2.train_config import TrainConfig

# modules whose source determines each stage's output (their edits invalidate the stage's cache)
DATA_CODE = ("data.fineweb", "data.files")
TOKENIZE_CODE = ("data.shards", "data.tokenizer", "data.fineweb", "data.files")
HELLASWAG_CODE = ("data.hellaswag", "data.tokenizer")
MODEL_CODE = ("gpt2.config", "gpt2.model", "gpt2.init", "gpt2.llmc", "gpt2.checkpoint", "kernels.attention",
              "kernels.cross_entropy", "kernels.layernorm")
TRAIN_CODE = MODEL_CODE + ("gpt2.train", "gpt2.train_config", "gpt2.optim", "gpt2.guard", "gpt2.distributed",
                           "gpt2.evaluate", "data.loader", "data.shards")
EVAL_CODE = MODEL_CODE + ("gpt2.evaluate", "gpt2.distributed", "data.loader", "data.hellaswag")
SAMPLE_CODE = MODEL_CODE + ("gpt2.sample", "data.tokenizer")

TRAIN_RETRIES = 2  # a crashed training process is retried, resuming from its latest checkpoint
TRAIN_RETRY_DELAY_S = 30
EVALUATIONS = "evaluations"  # per-run folder of evaluation results: one JSON per evaluated checkpoint
_STEP_LINE = re.compile(r"^step\s+(\d+)/(\d+) \|")  # gpt2.train's per-step console line


def _artifact_key(*parts: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower()).strip("-")


def _log_lines() -> Callable[[str], None]:
    logger = get_run_logger()
    return lambda line: logger.info(line) if line.strip() else None


def _python_module(module: str, args: list[str]) -> list[str]:
    return [sys.executable, "-m", module, *args]


# ---------------------------------------------------------------------------------------------------------
# records


@dataclass(frozen=True)
class DocumentsRecord(StageRecord):
    path: str  # local folder (or file) of parquet/jsonl documents with a `text` column
    source: str


@dataclass(frozen=True)
class ShardsRecord(StageRecord):
    out_dir: str
    train_glob: str
    val_glob: str
    num_tokens: int
    shards: tuple[tuple[str, str, int], ...]  # (file, split, ntok)

    @classmethod
    def from_manifest(cls, out_dir: str | Path) -> "ShardsRecord":
        """The record of a finished shard folder; shard hashes come from its manifest, not re-hashing."""
        from data.files import read_json
        from data.shards import MANIFEST

        out_dir = Path(out_dir).resolve()
        manifest = read_json(out_dir / MANIFEST)
        files = [FileRef.of(out_dir / MANIFEST)]
        files += [FileRef.with_sha256(out_dir / s["file"], s["sha256"]) for s in manifest["shards"]]
        name = manifest["name"]
        return cls(
            files=tuple(files),
            out_dir=str(out_dir),
            train_glob=str(out_dir / f"{name}_train_*.bin"),
            val_glob=str(out_dir / f"{name}_val_*.bin"),
            num_tokens=manifest["num_tokens"],
            shards=tuple((s["file"], s["split"], s["ntok"]) for s in manifest["shards"]),
        )


@dataclass(frozen=True)
class EvalFileRecord(StageRecord):
    path: str  # llm.c HellaSwag eval file
    num_examples: int

    @classmethod
    def of(cls, path: str | Path, extra_files: tuple[Path, ...] = ()) -> "EvalFileRecord":
        """The record of an eval file (plus files whose edits must invalidate it); the count is read from its header."""
        import numpy as np

        from data.hellaswag import HEADER_INTS, MAGIC

        path = Path(path).resolve()
        header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
        if len(header) != HEADER_INTS or header[0] != MAGIC:
            raise ValueError(f"{path} is not a HellaSwag eval file (magic {MAGIC}); rerun the hellaswag stage")
        files = tuple(FileRef.of(f) for f in (path, *extra_files))
        return cls(files=files, path=str(path), num_examples=int(header[2]))


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
        from gpt2.checkpoint import COMPLETE_MARKER, MODEL_FILE, STATE_FILE

        path = Path(path).resolve()
        step = json.loads((path / COMPLETE_MARKER).read_text())["step"]
        files = tuple(FileRef.of(path / name) for name in (STATE_FILE, MODEL_FILE))
        return cls(files=files, path=str(path), step=step, model=model)


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


@dataclass(frozen=True)
class EvalRecord(StageRecord):
    checkpoint: str
    step: int
    val_loss: float | None
    hellaswag: dict[str, float] | None  # {"acc", "acc_norm", "n", ...}


@dataclass(frozen=True)
class SampleRecord(StageRecord):
    samples: tuple[str, ...]


# ---------------------------------------------------------------------------------------------------------
# data stages


@task(name="download", cache_policy=StageCache(stage="download", code=DATA_CODE), persist_result=True,
      **NETWORK_RETRIES)
def download_documents(source: str, config: str | None, out_dir: str, limit: int | None) -> DocumentsRecord:
    """FineWeb (any hub dataset with a `text` column) -> a local parquet cache; a local folder is used as is.

    A local source is fingerprinted file by file, so editing the corpus invalidates this stage's cache.
    """
    from data import fineweb

    if Path(source).exists():
        path = Path(source).resolve()
        files = fineweb.local_files(path)
    else:
        path = fineweb.download(source, config, out_dir, limit)
        files = sorted(path.iterdir())
    logger = get_run_logger()
    logger.info("documents of %s are in %s (%d files)", source, path, len(files))
    return DocumentsRecord(files=tuple(FileRef.of(f) for f in files), path=str(path), source=source)


def _discard_damaged_shards(out_dir: Path) -> None:
    """Remove the manifest of a shard folder whose shards no longer match it, so build_shards rebuilds it.

    (build_shards trusts a finished manifest; this task only runs when the cache found the output damaged
    or missing, so here every shard is checked against its recorded sha256.)
    """
    from data.files import read_json, sha256_file
    from data.shards import MANIFEST

    manifest_path = out_dir / MANIFEST
    if not manifest_path.exists():
        return
    for shard in read_json(manifest_path)["shards"]:
        path = out_dir / shard["file"]
        if not path.is_file() or sha256_file(path) != shard["sha256"]:
            get_run_logger().warning("%s is missing or changed; rebuilding the shards of %s", path, out_dir)
            manifest_path.unlink()
            return


@task(name="tokenize", cache_policy=StageCache(stage="tokenize", code=TOKENIZE_CODE, ignore=("num_workers",)),
      persist_result=True)
def tokenize(
    documents: DocumentsRecord, out_dir: str, name: str, shard_size: int, limit: int | None,
    num_workers: int | None = None,
) -> ShardsRecord:
    """Documents -> llm.c token shards + manifest.json (data.shards); a table artifact of tokens per shard."""
    from data.fineweb import describe_source, iter_documents
    from data.shards import build_shards

    out = Path(out_dir)
    _discard_damaged_shards(out)
    build_shards(iter_documents(documents.path, limit=limit), out, name, shard_size=shard_size,
                 num_workers=num_workers, source=describe_source(documents.path, None, limit))
    record = ShardsRecord.from_manifest(out)
    create_table_artifact(
        [{"file": f, "split": split, "tokens": ntok} for f, split, ntok in record.shards],
        key=_artifact_key("shards", name),
        description=f"{record.num_tokens:,} tokens in {len(record.shards)} shards under {record.out_dir}",
    )
    return record


@task(name="hellaswag", cache_policy=StageCache(stage="hellaswag", code=HELLASWAG_CODE), persist_result=True,
      **NETWORK_RETRIES)
def prepare_hellaswag(source: str, out_dir: str) -> EvalFileRecord:
    """HellaSwag val jsonl (URL or local file) -> llm.c eval file (data.hellaswag)."""
    from data import hellaswag

    # only reached when the cache had no valid record: an eval file already there is not trusted
    (Path(out_dir) / hellaswag.EVAL_NAME).unlink(missing_ok=True)
    path = hellaswag.prepare(out_dir, source)
    extra = [Path(out_dir) / hellaswag.JSONL_NAME]
    if Path(source).is_file():  # a local source: its edits must invalidate the cache too
        extra.append(Path(source))
    record = EvalFileRecord.of(path, tuple(extra))
    create_markdown_artifact(f"HellaSwag: {record.num_examples:,} examples from `{source}` in `{record.path}`",
                             key=_artifact_key("hellaswag", "eval-file"))
    return record


# ---------------------------------------------------------------------------------------------------------
# model stages


@task(name="init", cache_policy=StageCache(stage="init", code=MODEL_CODE), persist_result=True)
def init_model(model: str, seed: int, out_dir: str) -> CheckpointRecord:
    """Step-0 checkpoint: weights initialised in llm.c's PyTorch RNG order (gpt2.init) from `seed`."""
    from gpt2.checkpoint import write_initial_checkpoint

    path = write_initial_checkpoint(out_dir, model, seed)
    get_run_logger().info("initial weights of %s (seed %d) in %s", model, seed, path)
    return CheckpointRecord.of(path, model)


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
    tmp = config_path.with_name(config_path.name + ".tmp")
    tmp.write_text(json.dumps(_train_config(run_dir, shards, hellaswag, init, seed, settings), indent=2) + "\n")
    # gpt2.train's own checks (unknown fields with suggestions, types, batch divisibility, ...) before any
    # process starts: a ConfigError is deterministic and is not retried
    config = load_config(["--config", str(tmp)])
    validate(config, world_size=nproc * rendezvous.nnodes)
    tmp.replace(config_path)
    _copy_checkpoint(Path(init.path), run_dir)  # gpt2.train starts from step 0 when it has no later checkpoint

    logger = get_run_logger()
    logger.info("training in %s with %d process(es) per node", run_dir, nproc)
    log, progress = _log_lines(), _ProgressReporter(_artifact_key("train-progress", run_id))

    def on_line(line: str) -> None:
        log(line)
        progress(line)

    cmd = torchrun_command("gpt2.train", ["--config", str(config_path)], nproc, rendezvous)
    try:
        run_streaming(cmd, on_line)
    except CommandFailed as e:  # a crash (OOM, node failure, NaN guard): retried, resuming from a checkpoint
        raise TransientError(str(e)) from e
    return _train_record(run_dir, config)


def _train_record(run_dir: Path, config: TrainConfig) -> TrainRecord:
    from gpt2.checkpoint import latest_checkpoint

    metrics = read_metrics(run_dir / "metrics.jsonl")
    figures = training_figures(metrics)
    curve = plot_loss_curve(metrics, run_dir / "loss_curve.png")
    final = CheckpointRecord.of(latest_checkpoint(run_dir), config.model)
    tokens = final.step * config.total_batch_size
    hellaswag = [m for m in metrics if m.get("kind") == "hellaswag"]
    create_markdown_artifact(
        run_summary_markdown(f"Training run {run_dir.name}", str(run_dir), final.step, tokens, figures,
                             hellaswag[-1]["acc_norm"] if hellaswag else None, str(curve)),
        key=_artifact_key("train-summary", run_dir.name),
        description="final loss, tokens/s and MFU against the reference points",
    )
    return TrainRecord(
        files=final.files + (FileRef.of(run_dir / "summary.json"),), run_dir=str(run_dir), checkpoint=final,
        steps=final.step, tokens=tokens, train_loss=figures["train_loss"], val_loss=figures["val_loss"],
        tokens_per_s=figures["tokens_per_s"], mfu=figures["mfu"], loss_curve=str(curve),
    )


# ---------------------------------------------------------------------------------------------------------
# evaluation and sampling


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
    run_streaming(_python_module("gpt2.evaluate", args), _log_lines())
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


@task(name="sample", cache_policy=StageCache(stage="sample", code=SAMPLE_CODE), persist_result=True)
def sample(checkpoint: CheckpointRecord, prompt: str, num_samples: int, max_new_tokens: int, seed: int,
           device: str = "auto") -> SampleRecord:
    """Text continuations of `prompt` from a checkpoint (`python -m gpt2.sample`), as a markdown artifact."""
    lines: list[str] = []
    log = _log_lines()

    def on_line(line: str) -> None:
        log(line)
        lines.append(line)

    args = ["--checkpoint", checkpoint.path, "--prompt", prompt, "--num-samples", str(num_samples),
            "--max-new-tokens", str(max_new_tokens), "--seed", str(seed), "--device", device]
    run_streaming(_python_module("gpt2.sample", args), on_line)
    samples = tuple(s.strip("\n") for s in re.split(r"^--- sample \d+$", "\n".join(lines), flags=re.M)[1:])
    path = checkpoint.run_dir / f"samples_step_{checkpoint.step:08d}.md"
    text = "\n\n".join(f"**sample {i}**\n\n> {s}" for i, s in enumerate(samples))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)
    create_markdown_artifact(f"# Samples at step {checkpoint.step}\n\n{text}\n", key=_artifact_key("samples"))
    return SampleRecord(files=(FileRef.of(path),), samples=samples)
