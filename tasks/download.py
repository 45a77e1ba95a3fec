"""The download stage: FineWeb (or a local corpus) -> a local folder of documents, identified by content."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task

from common.paths import listed_file
from tasks.cache import FileRef, StageCache, StageRecord
from tasks.common import artifact_key, writing
from tasks.progress import ProgressReporter
from tasks.retry import NETWORK_RETRIES

# modules whose source determines the stage's output (their edits invalidate its cache)
DOWNLOAD_CODE = ("data.fineweb",)  # entry modules; what they import counts too (tasks.cache.code_version)


@dataclass(frozen=True)
class DocumentsRecord(StageRecord):
    path: str  # local folder (or file) of parquet/jsonl documents with a `text` column
    source: str
    identity: str  # canonical JSON: a local corpus's file bytes, or hub id, config, commit and each file's sha256
    num_documents: int

    @property
    def folder(self) -> Path | None:
        """What the tokenize stage holds the read lock of while it reads the documents (tasks.common.reading):
        the folder this stage downloads into under its writer lock; None for a local corpus, which no stage
        writes."""
        return Path(self.path) if "hub" in json.loads(self.identity) else None

    def problem(self) -> str | None:
        """The files' content (StageRecord), and for a local corpus also its file list: a file added to the
        folder changes the documents without changing any recorded file."""
        if problem := super().problem():
            return problem
        from data.fineweb import local_files

        listed = sorted(str(f.resolve()) for f in local_files(self.path)) if Path(self.path).exists() else []
        recorded = sorted(f.path for f in self.files)
        if "hub" not in json.loads(self.identity) and listed != recorded:
            return f"{self.path} now holds {len(listed)} document files, {len(recorded)} were recorded"
        return None


def _source_identity(source: str) -> Any:
    """What `source` stands for now, for the download stage's cache key: a local corpus by the bytes of the files
    it holds now (a file edited, added or removed is another key); a hub dataset by its id, as given (its
    revision is the stage's `revision` input, and a cached download keeps the commit it resolved to)."""
    from data import fineweb

    src = fineweb.parse_source(source)
    return fineweb.source_identity(src.location) if src.kind == "local" else source


@task(name="download", cache_policy=StageCache(stage="download", code=DOWNLOAD_CODE,
                                               resolve=(("source", _source_identity),)),
      persist_result=True, **NETWORK_RETRIES)
def download_documents(source: str, config: str | None, out_dir: str, limit: int | None,
                       revision: str | None = None) -> DocumentsRecord:
    """FineWeb (any hub dataset with a `text` column) -> a local parquet cache; a local corpus is used as is.

    The record carries the documents' identity: a local corpus by the bytes of its files
    (`data.fineweb.source_identity`; a changed, added or removed file invalidates this stage's cache), a hub
    dataset by id, config, the commit `revision` resolved to when the download started, and the sha256 of
    each file (`data.fineweb.download_hub`, which resumes and verifies them). A missing local path fails at
    once (`SourceNotFound`, not retried); a network failure is retried, resuming the files on disk.
    """
    from data import fineweb

    logger = get_run_logger()
    src = fineweb.parse_source(source)
    if src.kind == "local":
        path = Path(src.location)
        identity = fineweb.source_identity(path)
        # the identity hashed each file already: its refs reuse those hashes instead of reading the corpus again
        files = zip(fineweb.local_files(path), identity["local"])
        refs = [FileRef.with_sha256(f, entry["sha256"]) for f, entry in files]
        num_documents = fineweb.require_documents(fineweb.count_documents(path), source)
    else:
        report = ProgressReporter(artifact_key("download-progress", Path(out_dir).parent.name, folder=out_dir),
                                  f"documents of {source} into {out_dir}")

        def progress(done: int, total: int | None, unit: str) -> None:
            if total:
                report(done / total)
            logger.info("%s: %s of %s %s downloaded", source, f"{done:,}", f"{total:,}" if total else "?", unit)

        with writing(out_dir):
            path = fineweb.download_hub(src.location, config, out_dir, limit, revision=revision, replace=True,
                                        progress=progress)
        report.finish()  # also with a limit, where fewer than all of the listed bytes were needed
        manifest_path = path / fineweb.DOWNLOAD_MANIFEST
        manifest = json.loads(manifest_path.read_text())
        # verified against the hub's hashes: an LFS file's is its sha256, the one a ref records
        refs = [FileRef.with_sha256(listed_file(path, f["file"], manifest_path), f["sha256"]) if f["sha256"]
                else FileRef.of(listed_file(path, f["file"], manifest_path)) for f in manifest["files"]]
        refs.append(FileRef.of(manifest_path))
        identity = {**{k: manifest[k] for k in ("hub", "config", "revision", "limit")},
                    "sha256": [f["sha256"] or f["blob_sha1"] for f in manifest["files"]]}
        num_documents = manifest["num_documents"]
    logger.info("%d documents of %s are in %s (%d files); identity %s", num_documents, source, path, len(refs),
                identity)
    return DocumentsRecord(files=tuple(refs), path=str(path), source=source,
                           identity=json.dumps(identity, sort_keys=True), num_documents=num_documents)
