"""FineWeb documents, streamed from the Hugging Face hub or read from a local folder.

`iter_documents` is the one entry point: given a hub id (`HuggingFaceFW/fineweb`,
`HuggingFaceFW/fineweb-edu`, or any dataset with a `text` column) it streams the `train` split, so the
dataset is never held in memory; given a local directory (or file) of parquet / jsonl files with a `text`
column it reads those, in sorted file order. Both go through the same validation and `limit` code.

`download` copies a (possibly limited) stream into a local parquet cache, resumably, so that later
stages and reruns work offline.

CLI: `python -m data.fineweb --help`.
"""

from __future__ import annotations

import argparse
import itertools
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from tqdm import tqdm

from common.files import atomic_path, iter_jsonl_records, read_json, write_json

FINEWEB_DATASETS = ("HuggingFaceFW/fineweb", "HuggingFaceFW/fineweb-edu")
FINEWEB_CONFIGS = ("sample-10BT", "sample-100BT")
LOCAL_SUFFIXES = (".parquet", ".jsonl")
TEXT_COLUMN = "text"


class DocumentError(ValueError):
    """A source row has no usable text; the message names the file (or dataset) and the row."""


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


def _hub_rows(name: str, config: str | None) -> Iterator[tuple[str, object]]:
    import datasets  # heavy; only the hub path needs it

    stream = datasets.load_dataset(name, name=config, split="train", streaming=True)
    for row, record in enumerate(stream):
        yield f"{name}/{config} row {row}", record.get(TEXT_COLUMN)


def iter_documents(source: str | os.PathLike, config: str | None = None, limit: int | None = None) -> Iterator[str]:
    """Yield the `text` of each document of `source`, at most `limit` of them.

    source: a local parquet/jsonl file or folder, else a Hugging Face hub dataset id (streamed, `train`
    split, `config` such as "sample-10BT"). Raises DocumentError naming the file and row of a document
    whose text is missing or not a string.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    if Path(source).exists():
        rows = _local_rows(Path(source))
    elif "/" in str(source):
        rows = _hub_rows(str(source), config)
    else:
        raise DocumentError(f"{source!r} is neither an existing local path nor a hub id like 'owner/name'")
    for where, text in itertools.islice(rows, limit):
        if not isinstance(text, str):
            raise DocumentError(f"{where}: '{TEXT_COLUMN}' is {type(text).__name__}, expected a string")
        yield text


def batched(items: Iterable, n: int) -> Iterator[list]:
    """Lists of `n` consecutive items (the last one shorter); itertools.batched from Python 3.12."""
    it = iter(items)
    while batch := list(itertools.islice(it, n)):
        yield batch


def describe_source(source: str | os.PathLike, config: str | None = None, limit: int | None = None) -> dict:
    """JSON-able identity of a document stream, recorded in manifests and compared on resume."""
    # a local path is recorded absolute, so the same folder named from another working directory matches
    source = str(Path(source).resolve()) if Path(source).exists() else str(source)
    return {"source": source, "config": config, "limit": limit}


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


def download(
    source: str,
    config: str | None,
    out_dir: str | os.PathLike,
    limit: int | None = None,
    docs_per_file: int = 100_000,
) -> Path:
    """Stream `source` into `out_dir/part_NNNNN.parquet` files (a `text` column) and return `out_dir`.

    Idempotent and resumable: a finished download (out_dir/manifest.json for the same source, config and
    limit) is returned as is; after an interruption (out_dir/download.json for the same), full part files
    already written are kept and the stream resumes after them. Another download into the same folder is
    refused. `iter_documents(out_dir)` then yields the same documents offline.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    identity = {**describe_source(source, config, limit), "docs_per_file": docs_per_file}
    manifest_path, progress_path = out_dir / DOWNLOAD_MANIFEST, out_dir / DOWNLOAD_PROGRESS
    for path in (manifest_path, progress_path):
        if not path.exists():
            continue
        recorded_file = read_json(path)
        recorded = {k: recorded_file.get(k) for k in identity}
        if recorded != identity:
            raise FileExistsError(f"{path} is for another download ({recorded}); use another folder or delete it")
        if path == manifest_path:
            return out_dir
    write_json(progress_path, identity)

    # every full part before the first short or missing one is finished work (parts are written atomically)
    done = 0
    while _part_path(out_dir, done).exists() and _num_rows(_part_path(out_dir, done)) == docs_per_file:
        done += 1
    skip = done * docs_per_file
    remaining = None if limit is None else max(limit - skip, 0)
    documents = itertools.islice(iter_documents(source, config, limit), skip, None)

    parts = [{"file": _part_path(out_dir, i).name, "num_documents": docs_per_file} for i in range(done)]
    with tqdm(total=remaining, unit="doc", desc=f"download {source}") as bar:
        for idx, texts in enumerate(batched(documents, docs_per_file), start=done):
            part = _part_path(out_dir, idx)
            _write_part(part, texts)
            parts.append({"file": part.name, "num_documents": len(texts)})
            bar.update(len(texts))
    write_json(manifest_path, {**identity, "num_documents": sum(p["num_documents"] for p in parts), "files": parts})
    progress_path.unlink()
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m data.fineweb",
        description="Download FineWeb (or any hub dataset with a 'text' column) into a local parquet cache.",
    )
    parser.add_argument("--source", default=FINEWEB_DATASETS[0], help=f"hub id, e.g. {', '.join(FINEWEB_DATASETS)}")
    parser.add_argument("--config", default=FINEWEB_CONFIGS[0], help=f"dataset config, e.g. {', '.join(FINEWEB_CONFIGS)}")
    parser.add_argument("--out", required=True, type=Path, help="output folder for part_NNNNN.parquet files")
    parser.add_argument("--limit", type=int, default=None, help="stop after this many documents (default: all)")
    parser.add_argument("--docs-per-file", type=int, default=100_000, help="documents per parquet file")
    args = parser.parse_args(argv)
    out = download(args.source, args.config, args.out, limit=args.limit, docs_per_file=args.docs_per_file)
    print(f"documents cached in {out}")


if __name__ == "__main__":
    main()
