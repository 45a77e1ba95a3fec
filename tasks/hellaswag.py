"""The hellaswag stage: HellaSwag val jsonl (URL or local file) -> llm.c eval file (data.hellaswag)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact

from tasks.cache import FileRef, StageCache, StageRecord
from tasks.common import artifact_key
from tasks.retry import NETWORK_RETRIES

# modules whose source determines the stage's output (their edits invalidate its cache)
HELLASWAG_CODE = ("data.hellaswag",)  # entry modules; what they import counts too (tasks.cache.code_version)


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
                             key=artifact_key("hellaswag", "eval-file"))
    return record
