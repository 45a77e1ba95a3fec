"""The hellaswag stage: HellaSwag val jsonl (URL or local file) -> llm.c eval file (data.hellaswag)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact

from tasks.cache import FileRef, StageCache, StageRecord
from tasks.common import artifact_key, writing
from tasks.retry import NETWORK_RETRIES, best_effort

# modules whose source determines the stage's output (their edits invalidate its cache)
HELLASWAG_CODE = ("data.hellaswag",)  # entry modules; what they import counts too (tasks.cache.code_version)


@dataclass(frozen=True)
class EvalFileRecord(StageRecord):
    path: str  # llm.c HellaSwag eval file
    num_examples: int
    source: str | None = None  # where the examples came from (URL or local path), from the folder's manifest
    source_sha256: str | None = None  # the identity of the source: the sha256 of its bytes

    @property
    def folder(self) -> Path:
        """What a stage reading the file holds the read lock of (tasks.common.reading)."""
        return Path(self.path).parent

    @property
    def sha256(self) -> str:
        """The eval file's content identity (the first of `files`, see `of`)."""
        return self.files[0].sha256

    @classmethod
    def of(cls, path: str | Path, extra_files: tuple[Path, ...] = ()) -> "EvalFileRecord":
        """The record of an eval file (plus files whose edits must invalidate it); the count is read from its
        header, the source identity from the manifest.json data.hellaswag.prepare wrote beside it (if any)."""
        import numpy as np

        from common.files import read_json
        from data.hellaswag import HEADER_INTS, MAGIC, MANIFEST

        path = Path(path).resolve()
        header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
        if len(header) != HEADER_INTS or header[0] != MAGIC:
            raise ValueError(f"{path} is not a HellaSwag eval file (magic {MAGIC}); rerun the hellaswag stage")
        manifest_path = path.parent / MANIFEST
        manifest = read_json(manifest_path) if manifest_path.exists() else {}
        files = tuple(FileRef.of(f) for f in (path, *extra_files))
        return cls(files=files, path=str(path), num_examples=int(header[2]), source=manifest.get("source"),
                   source_sha256=manifest.get("source_sha256"))


def _source_identity(source: str) -> str:
    """What `source` stands for now, for the hellaswag stage's cache key: a local file by the sha256 of its bytes
    (an edit, or a link pointed at another file, is another key); a URL as given."""
    from common.files import sha256_file

    return sha256_file(source) if Path(source).is_file() else source


@task(name="hellaswag", cache_policy=StageCache(stage="hellaswag", code=HELLASWAG_CODE,
                                                resolve=(("source", _source_identity),)),
      persist_result=True, **NETWORK_RETRIES)
def prepare_hellaswag(source: str, out_dir: str) -> EvalFileRecord:
    """HellaSwag val jsonl (URL or local file) -> llm.c eval file (data.hellaswag).

    data.hellaswag.prepare keeps an eval file only if it was made from a source with the same bytes and
    it verifies (sha256); the record lists the eval file, the jsonl copy, the manifest and a local source,
    so editing any of them invalidates this stage's cache. A missing local file fails at once.
    """
    from data import hellaswag

    extra = [Path(out_dir) / hellaswag.JSONL_NAME, Path(out_dir) / hellaswag.MANIFEST]
    if Path(source).is_file():  # a local source: its edits must invalidate the cache too
        extra.append(Path(source))
    with writing(out_dir):
        record = EvalFileRecord.of(hellaswag.prepare(out_dir, source), tuple(extra))
    best_effort(
        "the HellaSwag eval file artifact", create_markdown_artifact,
        f"HellaSwag: {record.num_examples:,} examples from `{source}` (sha256 `{record.source_sha256}`) in "
        f"`{record.path}`",
        key=artifact_key("hellaswag-eval-file", folder=out_dir),
    )
    return record
