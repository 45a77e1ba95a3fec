"""The export stage: a checkpoint as a Hugging Face directory (`gpt2.export_hf`), weights and tokenizer.

`GPT2LMHeadModel.from_pretrained(path)` and `AutoTokenizer.from_pretrained(path)` load the directory with
no network; a markdown artifact shows where it is and how to load it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ContextManager

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from gpt2.run_dir import RunDir
from tasks.cache import FileRef, StageCache, StageRecord
from tasks.common import run_artifact_key, writing
from tasks.init import MODEL_CODE, CheckpointRecord
from tasks.retry import best_effort

# modules whose source determines the stage's output (their edits invalidate its cache)
EXPORT_CODE = MODEL_CODE + ("gpt2.export_hf",)  # entry modules; their imports (gpt2.hf, data.tokenizer) count too


@dataclass(frozen=True)
class HFExportRecord(StageRecord):
    path: str  # the Hugging Face directory
    step: int  # of the checkpoint it holds


def export_markdown(record: HFExportRecord) -> str:
    """Where the export is, what it holds and the two lines that load it."""
    rows = [f"| `{Path(f.path).name}` | {f.size:,} |" for f in record.files]
    return "\n".join([
        f"# Hugging Face export of step {record.step}",
        "",
        f"Directory: `{record.path}`",
        "",
        "```python",
        "from transformers import AutoTokenizer, GPT2LMHeadModel",
        f'model = GPT2LMHeadModel.from_pretrained("{record.path}")',
        f'tokenizer = AutoTokenizer.from_pretrained("{record.path}")',
        "```",
        "",
        "| file | bytes |",
        "| --- | ---: |",
        *rows,
    ]) + "\n"  # fmt: skip


@task(name="export", cache_policy=StageCache(stage="export", code=EXPORT_CODE), persist_result=True,
      task_run_name="export-step-{checkpoint.step}")
def export_hf(checkpoint: CheckpointRecord, out_dir: str | None = None) -> HFExportRecord:
    """`checkpoint` as a Hugging Face directory: `out_dir`, by default `hf_step_NNNNNNNN` in its run directory.

    The stage owns that directory: a rerun (its cached record stale, or forced) replaces it whole. The directory
    is replaced whole, so it cannot hold its own lock: the stage holds the lock of the folder it is published
    in (by default the run directory, whose trainer and other exports it waits for), from before it decides
    to write until its record is made.
    """
    from gpt2.export_hf import export_checkpoint

    run_dir = RunDir(checkpoint.run_dir)
    out = Path(out_dir) if out_dir else run_dir.hf_export(checkpoint.step)
    with _publishing(out, run_dir):
        export_checkpoint(checkpoint.path, out, overwrite=True)
        record = HFExportRecord(files=tuple(FileRef.of(p) for p in sorted(out.iterdir())), path=str(out.resolve()),
                                step=checkpoint.step)
    get_run_logger().info("exported step %d as a Hugging Face directory: %s", checkpoint.step, record.path)
    best_effort("the export artifact", create_markdown_artifact, export_markdown(record),
                key=run_artifact_key("hf-export", checkpoint.run_dir),
                description="the checkpoint as a Hugging Face directory")
    return record


def _publishing(out: Path, run_dir: RunDir) -> ContextManager[Path]:
    """The writer lock of the folder `out` is published in: the run directory's as its owner takes it (RunDir.lock:
    its layout checked, and only checkpoints/ swept of leftovers, since the train stage writes the loss curve
    beside the export without the lock), another folder's as any stage's."""
    if out.parent.resolve() == run_dir.root.resolve():
        return run_dir.lock(wait=True, on_wait=get_run_logger().warning)
    return writing(out.parent)
