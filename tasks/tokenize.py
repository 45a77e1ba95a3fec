"""The tokenize stage: documents -> llm.c token shards + manifest.json (data.shards)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from prefect import task
from prefect.artifacts import create_table_artifact

from tasks.cache import FileRef, StageCache, StageRecord
from tasks.common import artifact_key, reading, writing
from tasks.download import DocumentsRecord
from tasks.progress import ProgressReporter
from tasks.retry import best_effort

# modules whose source determines the stage's output (their edits invalidate its cache)
TOKENIZE_CODE = ("data.shards",)  # entry modules; what they import counts too (tasks.cache.code_version)


@dataclass(frozen=True)
class ShardsRecord(StageRecord):
    out_dir: str
    manifest: str  # what training and evaluation read their shards from: the exact files it lists, per split
    num_tokens: int
    shards: tuple[tuple[str, str, int], ...]  # (file, split, ntok)
    source: str  # the manifest's identity of the documents (canonical JSON)

    @property
    def folder(self) -> Path:
        """What a stage reading the shards holds the read lock of (tasks.common.reading)."""
        return Path(self.out_dir)

    def split_sha256(self, split: str) -> dict[str, str]:
        """{shard file name: sha256} of the shards of `split` ("val", "train"), as the manifest lists them."""
        digests = {Path(f.path).name: f.sha256 for f in self.files}
        return {name: digests[name] for name, of_split, _ in self.shards if of_split == split}

    @classmethod
    def from_manifest(cls, out_dir: str | Path) -> "ShardsRecord":
        """The record of a finished shard folder; shard hashes come from its manifest, not re-hashing."""
        from common.files import read_json
        from data.shards import MANIFEST, listed_shard

        out_dir = Path(out_dir).resolve()
        manifest = read_json(out_dir / MANIFEST)
        files = [FileRef.of(out_dir / MANIFEST)]
        files += [FileRef.with_sha256(listed_shard(out_dir, s), s["sha256"]) for s in manifest["shards"]]
        return cls(
            files=tuple(files),
            out_dir=str(out_dir),
            manifest=str(out_dir / MANIFEST),
            num_tokens=manifest["num_tokens"],
            shards=tuple((s["file"], s["split"], s["ntok"]) for s in manifest["shards"]),
            source=json.dumps(manifest["source"], sort_keys=True),
        )


@task(name="tokenize", cache_policy=StageCache(stage="tokenize", code=TOKENIZE_CODE, ignore=("num_workers",)),
      persist_result=True)
def tokenize(
    documents: DocumentsRecord, out_dir: str, name: str, shard_size: int, limit: int | None,
    num_workers: int | None = None,
) -> ShardsRecord:
    """Documents -> llm.c token shards + manifest.json (data.shards); a table artifact of tokens per shard.

    The folder belongs to the pipeline: a build for other documents or settings (an edited corpus, another
    shard_size) is replaced, and a finished build is verified shard by shard, only bad shards rebuilt.
    """
    from data.fineweb import iter_documents
    from data.shards import build_shards

    total = documents.num_documents if limit is None else min(limit, documents.num_documents)
    report = ProgressReporter(artifact_key("tokenize-progress", name, folder=out_dir),
                              f"documents tokenized into {out_dir}")
    source = {**json.loads(documents.identity), "limit": limit}
    with reading(documents), writing(out_dir):  # a download rerun waits until the documents are read
        build_shards(iter_documents(documents.path, limit=limit), Path(out_dir), name, shard_size=shard_size,
                     num_workers=num_workers, source=source, replace=True,
                     progress=lambda done: report(done / total if total else 1.0), source_name=documents.source)
        record = ShardsRecord.from_manifest(out_dir)
    report.finish()  # also when the folder was complete and verified, so no document was tokenized
    best_effort(
        "the shards table artifact", create_table_artifact,
        [{"file": f, "split": split, "tokens": ntok} for f, split, ntok in record.shards],
        key=artifact_key("shards", name, folder=out_dir),
        description=f"{record.num_tokens:,} tokens in {len(record.shards)} shards under {record.out_dir}; "
        f"documents: {record.source}",
    )
    return record
