"""FineWeb documents, streamed from the Hugging Face hub or read from a local folder.

`iter_documents` is the one entry point: given a hub dataset (`HuggingFaceFW/fineweb`,
`HuggingFaceFW/fineweb-edu`, or `hf://datasets/OWNER/NAME` for any dataset with a `text` column) it streams
the `train` split, so the dataset is never held in memory; given a local directory (or file) of parquet /
jsonl files with a `text` column it reads those, in sorted file order. Both go through the same validation
and `limit` code. `parse_source` says which a string names; `source_identity` is what the documents are
by content (local file bytes, or hub id + config + resolved revision).

`download` copies a (possibly limited) stream into a local parquet cache, resumably, so that later
stages and reruns work offline.

CLI: `python -m data.fineweb --help`.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from common.cli import run_cli
from common.files import atomic_path, iter_jsonl_records, read_json, sha256_file, write_json

FINEWEB_DATASETS = ("HuggingFaceFW/fineweb", "HuggingFaceFW/fineweb-edu")
FINEWEB_CONFIGS = ("sample-10BT", "sample-100BT")
LOCAL_SUFFIXES = (".parquet", ".jsonl")
TEXT_COLUMN = "text"


logger = logging.getLogger(__name__)


class DocumentError(ValueError):
    """A source row has no usable text; the message names the file (or dataset) and the row."""


class EmptySource(DocumentError):
    """A source that yields no documents: nothing to tokenize or train on; the message names the source."""


def require_documents(num_documents: int, source: str | os.PathLike, config: str | None = None) -> int:
    """`num_documents`, or EmptySource naming `source` when it is 0 (refused where it is found, not in training)."""
    if num_documents == 0:
        where = f"{source} (config {config})" if config else str(source)
        raise EmptySource(f"{where} holds no documents: nothing to tokenize (0 documents, 0 tokens); "
                          "point the source at a corpus with documents in it")
    return num_documents


# ---------------------------------------------------------------------------------------------------------
# reading


def _parquet_rows(path: Path) -> Iterator[tuple[str, object]]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    if TEXT_COLUMN not in pf.schema_arrow.names:
        raise DocumentError(f"{path}: no '{TEXT_COLUMN}' column (columns: {pf.schema_arrow.names})")
    row = 0
    for batch in pf.iter_batches(columns=[TEXT_COLUMN], batch_size=4096):
        for text in batch.column(0).to_pylist():
            yield f"{path} row {row}", text
            row += 1


def _jsonl_rows(path: Path) -> Iterator[tuple[str, object]]:
    for where, record in iter_jsonl_records(path, DocumentError):
        if not isinstance(record, dict) or TEXT_COLUMN not in record:
            raise DocumentError(f"{where}: expected a JSON object with a '{TEXT_COLUMN}' field")
        yield where, record[TEXT_COLUMN]


def local_files(path: str | os.PathLike) -> list[Path]:
    """The parquet/jsonl files a local source stands for, in the order they are read."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.suffix in LOCAL_SUFFIXES)
    if not files or any(p.suffix not in LOCAL_SUFFIXES for p in files):
        raise DocumentError(f"{path}: expected a {' or '.join(LOCAL_SUFFIXES)} file or a folder holding some")
    return files


def _local_rows(path: Path) -> Iterator[tuple[str, object]]:
    for file in local_files(path):
        yield from _parquet_rows(file) if file.suffix == ".parquet" else _jsonl_rows(file)


def _hub_rows(name: str, config: str | None, revision: str | None) -> Iterator[tuple[str, object]]:
    import datasets  # heavy; only the hub path needs it

    stream = datasets.load_dataset(name, name=config, split="train", streaming=True, revision=revision)
    for row, record in enumerate(stream):
        yield f"{name}/{config} row {row}", record.get(TEXT_COLUMN)


# ---------------------------------------------------------------------------------------------------------
# what a source string names, and the identity of what it names

HUB_PREFIX = "hf://datasets/"  # a hub dataset written explicitly: hf://datasets/OWNER/NAME
HUB_SHORTHAND_OWNERS = ("HuggingFaceFW",)  # bare OWNER/NAME is a hub id only for these owners (FineWeb's)
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


class SourceNotFound(FileNotFoundError):
    """A source names no existing local file/folder or no hub dataset; retrying cannot help."""


@dataclass(frozen=True)
class Source:
    kind: str  # "local" or "hub"
    location: str  # absolute path, or hub repo id


def parse_source(source: str | os.PathLike) -> Source:
    """Classify a source string, without any network call:

    1. `hf://datasets/OWNER/NAME`: that hub dataset;
    2. an existing file or folder: local (its absolute path);
    3. `HuggingFaceFW/NAME` (OWNER/NAME with an owner of HUB_SHORTHAND_OWNERS): that hub dataset;
    4. anything else is a local path that does not exist: SourceNotFound naming it.

    So a mistyped local path (`work/mydocs`) is never sent to the hub, where an unreachable network would
    make it look like a transient failure; other hub datasets are written `hf://datasets/OWNER/NAME`.
    """
    text = str(source)
    if text.startswith(HUB_PREFIX):
        repo_id = text[len(HUB_PREFIX):]
        if not _HUB_ID.fullmatch(repo_id):
            raise DocumentError(f"{text}: {repo_id!r} is not a hub dataset id; write {HUB_PREFIX}OWNER/NAME")
        return Source("hub", repo_id)
    path = Path(text).expanduser()
    if path.exists():
        return Source("local", str(path.resolve()))
    if _HUB_ID.fullmatch(text) and text.split("/")[0] in HUB_SHORTHAND_OWNERS:
        return Source("hub", text)
    raise SourceNotFound(
        f"{text}: no such file or folder (looked for {path.absolute()}). A local source is an existing "
        f"{' or '.join(LOCAL_SUFFIXES)} file or a folder holding some; fix the path. A hub dataset is written "
        f"{HUB_PREFIX}OWNER/NAME ({'/, '.join(HUB_SHORTHAND_OWNERS)}/NAME also works bare)."
    )


def resolve_hub_revision(repo_id: str, revision: str | None = None) -> str:
    """The commit sha a hub dataset's `revision` (default: its main branch) points to now."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    try:
        return HfApi().dataset_info(repo_id, revision=revision).sha
    except RepositoryNotFoundError as e:
        raise SourceNotFound(
            f"{repo_id}: no such dataset on the Hugging Face hub (or it is private or gated: log in with "
            f"`hf auth login`)"
        ) from e
    except RevisionNotFoundError as e:
        raise SourceNotFound(f"{repo_id}: the hub dataset has no revision {revision!r}") from e


def source_identity(
    source: str | os.PathLike, config: str | None = None, limit: int | None = None, revision: str | None = None
) -> dict:
    """JSON-able identity of the documents `iter_documents(source, config, limit)` yields.

    A local source is identified by the bytes of its files (sha256 of each, in reading order), never by
    its path; a hub dataset by id, config and the commit its revision resolves to (`revision` pins it).
    """
    src = parse_source(source)
    if src.kind == "local":
        files = [{"size": f.stat().st_size, "sha256": sha256_file(f)} for f in local_files(src.location)]
        return {"local": files, "limit": limit}
    return {"hub": src.location, "config": config, "revision": resolve_hub_revision(src.location, revision),
            "limit": limit}


def iter_documents(
    source: str | os.PathLike, config: str | None = None, limit: int | None = None, revision: str | None = None
) -> Iterator[str]:
    """Yield the `text` of each document of `source`, at most `limit` of them.

    source: see `parse_source`: a local parquet/jsonl file or folder, or a hub dataset (streamed, `train`
    split, `config` such as "sample-10BT", at `revision`, e.g. the one `source_identity` resolved).
    Raises DocumentError naming the file and row of a document whose text is missing or not a string.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    src = parse_source(source)
    rows = _local_rows(Path(src.location)) if src.kind == "local" else _hub_rows(src.location, config, revision)
    for where, text in itertools.islice(rows, limit):
        if not isinstance(text, str):
            raise DocumentError(f"{where}: '{TEXT_COLUMN}' is {type(text).__name__}, expected a string")
        yield text


def count_documents(path: str | os.PathLike) -> int:
    """Documents in a local file/folder: parquet row counts from the metadata, non-blank jsonl lines."""
    total = 0
    for file in local_files(path):
        if file.suffix == ".parquet":
            total += _num_rows(file)
        else:
            with open(file, "rb") as f:
                total += sum(1 for line in f if line.strip())
    return total


def batched(items: Iterable, n: int) -> Iterator[list]:
    """Lists of `n` consecutive items (the last one shorter); itertools.batched from Python 3.12."""
    it = iter(items)
    while batch := list(itertools.islice(it, n)):
        yield batch


# ---------------------------------------------------------------------------------------------------------
# local parquet cache

DOWNLOAD_MANIFEST = "manifest.json"
DOWNLOAD_PROGRESS = "download.json"  # what an unfinished download is for; replaced by the manifest at the end


def _part_path(out_dir: Path, idx: int) -> Path:
    return out_dir / f"part_{idx:05d}.parquet"


def _write_part(path: Path, texts: list[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with atomic_path(path) as tmp:
        pq.write_table(pa.table({TEXT_COLUMN: pa.array(texts, type=pa.large_string())}), tmp)


def _num_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def mismatch(recorded: dict, requested: dict) -> str | None:
    """What differs between a recorded identity (a manifest's) and the requested one, or None."""
    differing = [k for k in requested if recorded.get(k) != requested[k]]
    return "; ".join(f"{k}: recorded {recorded.get(k)!r}, requested {requested[k]!r}" for k in differing) or None


def refuse_or_clear(path: Path, difference: str, replace: bool, clear: Callable[[], None]) -> None:
    """`path` records an output for another identity: `clear()` it if `replace`, else refuse naming the difference."""
    if not replace:
        raise FileExistsError(
            f"{path} was written for another input or settings ({difference}); pass --replace (replace=True) "
            f"to rebuild it in place, or use another --out folder"
        )
    clear()


def _download_identity(source: str, config: str | None, limit: int | None, docs_per_file: int,
                       recorded: dict | None) -> dict:
    """The identity of a download; a hub download already started keeps its recorded revision (a snapshot),
    so a rerun needs no network and never mixes two revisions."""
    src = parse_source(source)
    same_request = recorded and [recorded.get(k) for k in ("hub", "config", "limit", "docs_per_file")] == [
        src.location, config, limit, docs_per_file]
    if src.kind == "hub" and same_request:
        return {k: recorded[k] for k in ("hub", "config", "revision", "limit", "docs_per_file")}
    return {**source_identity(source, config, limit), "docs_per_file": docs_per_file}


def _intact_parts(out_dir: Path, parts: list[dict]) -> int:
    """How many leading parts of a manifest are on disk with their recorded size and sha256."""
    for i, part in enumerate(parts):
        path = out_dir / part["file"]
        if not path.is_file() or path.stat().st_size != part["size"] or sha256_file(path) != part["sha256"]:
            logger.warning("%s is missing or differs from its recorded size/sha256; downloading from it on", path)
            return i
    return len(parts)


def download(
    source: str,
    config: str | None,
    out_dir: str | os.PathLike,
    limit: int | None = None,
    docs_per_file: int = 100_000,
    replace: bool = False,
    progress: Callable[[int, int | None], None] | None = None,
) -> Path:
    """Stream `source` into `out_dir/part_NNNNN.parquet` files (a `text` column) and return `out_dir`.

    The folder records its identity (`source_identity` plus docs_per_file; a hub revision is resolved when
    the download starts and kept until it is finished). Idempotent, verified and resumable: a finished
    download (manifest.json, every part with size and sha256, written last) is returned once its parts
    verify; a damaged part, or an interruption (download.json), resumes after the last intact full part.
    A folder recorded for another identity is refused, or cleared and redone with `replace`.
    `progress(documents_done, total or None)` is called after each part. `iter_documents(out_dir)` then
    yields the same documents offline.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest_path, progress_path = out_dir / DOWNLOAD_MANIFEST, out_dir / DOWNLOAD_PROGRESS
    recorded_path = next((p for p in (manifest_path, progress_path) if p.exists()), None)
    recorded = read_json(recorded_path) if recorded_path else None
    identity = _download_identity(source, config, limit, docs_per_file, recorded)
    if recorded and (difference := mismatch(recorded, identity)):
        def clear() -> None:
            for path in [manifest_path, progress_path, *out_dir.glob("part_*.parquet")]:
                path.unlink(missing_ok=True)
        refuse_or_clear(recorded_path, difference, replace, clear)
        recorded = None
    parts = recorded.get("files", []) if recorded else []
    done = _intact_parts(out_dir, parts)
    if recorded_path == manifest_path and recorded and done == len(parts):
        return out_dir
    write_json(progress_path, {**identity, "files": parts[:done]})
    manifest_path.unlink(missing_ok=True)

    # a short part is the stream's last one: it is redone, since the stream may have grown
    while done and parts[done - 1]["num_documents"] != docs_per_file:
        done -= 1
    parts = parts[:done]
    skip = done * docs_per_file
    total = None if limit is None else max(limit, 0)
    revision = identity.get("revision")
    documents = itertools.islice(iter_documents(source, config, limit, revision=revision), skip, None)
    written = skip
    with tqdm(total=total, initial=skip, unit="doc", desc=f"download {source}", disable=None) as bar:
        for idx, texts in enumerate(batched(documents, docs_per_file), start=done):
            part = _part_path(out_dir, idx)
            _write_part(part, texts)
            parts.append({"file": part.name, "num_documents": len(texts), "size": part.stat().st_size,
                          "sha256": sha256_file(part)})
            write_json(progress_path, {**identity, "files": parts})
            bar.update(len(texts))
            written += len(texts)
            if progress:
                progress(written, total)
    for stale in sorted(out_dir.glob("part_*.parquet"))[len(parts):]:  # a longer earlier stream's tail
        stale.unlink()
    require_documents(written, source, identity.get("config"))  # a local source has no config
    write_json(manifest_path, {**identity, "num_documents": sum(p["num_documents"] for p in parts), "files": parts})
    progress_path.unlink()
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m data.fineweb",
        description="Download FineWeb (or any hub dataset with a 'text' column) into a local parquet cache.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--source", default=FINEWEB_DATASETS[0],
                        help=f"hub id ({', '.join(FINEWEB_DATASETS)}, or {HUB_PREFIX}OWNER/NAME) or local folder/file")
    parser.add_argument("--config", default=FINEWEB_CONFIGS[0],
                        help=f"dataset config, e.g. {', '.join(FINEWEB_CONFIGS)}")
    parser.add_argument("--out", required=True, type=Path, help="output folder for part_NNNNN.parquet files")
    parser.add_argument("--limit", type=int, default=None, help="stop after this many documents (default: all)")
    parser.add_argument("--docs-per-file", type=int, default=100_000, help="documents per parquet file")
    parser.add_argument("--replace", action="store_true", help="clear a folder recorded for another download")
    args = parser.parse_args(argv)
    out = download(args.source, args.config, args.out, limit=args.limit, docs_per_file=args.docs_per_file,
                   replace=args.replace)
    print(f"documents cached in {out}")


if __name__ == "__main__":
    run_cli(main)
