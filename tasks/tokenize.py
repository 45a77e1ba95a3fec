"""The tokenize stage: documents -> llm.c token shards + manifest.json (data.shards)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact

from tasks.cache import FileRef, StageCache, StageRecord
from tasks.common import artifact_key
from tasks.download import DocumentsRecord

# modules whose source determines the stage's output (their edits invalidate its cache)
TOKENIZE_CODE = ("data.shards",)  # entry modules; what they import counts too (tasks.cache.code_version)


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
        from common.files import read_json
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


def _discard_damaged_shards(out_dir: Path) -> None:
    """Remove the manifest of a shard folder whose shards no longer match it, so build_shards rebuilds it.

    (build_shards trusts a finished manifest; this task only runs when the cache found the output damaged
    or missing, so here every shard is checked against its recorded sha256.)
    """
    from common.files import read_json, sha256_file
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
        key=artifact_key("shards", name),
        description=f"{record.num_tokens:,} tokens in {len(record.shards)} shards under {record.out_dir}",
    )
    return record
