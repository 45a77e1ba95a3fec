"""The download stage: FineWeb (or a local corpus) -> a local folder of documents."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect import get_run_logger, task

from tasks.cache import FileRef, StageCache, StageRecord
from tasks.retry import NETWORK_RETRIES

# modules whose source determines the stage's output (their edits invalidate its cache)
DOWNLOAD_CODE = ("data.fineweb",)  # entry modules; what they import counts too (tasks.cache.code_version)


@dataclass(frozen=True)
class DocumentsRecord(StageRecord):
    path: str  # local folder (or file) of parquet/jsonl documents with a `text` column
    source: str


@task(name="download", cache_policy=StageCache(stage="download", code=DOWNLOAD_CODE), persist_result=True,
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
