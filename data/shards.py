"""llm.c token shards: format, reader, and a parallel, resumable shard builder.

Shard format (byte-compatible with llm.c's dev/data/fineweb.py): a header of 256 little-endian int32
(`[0]=20240520` magic, `[1]=1` version, `[2]=ntok`, rest zero), then ntok uint16 tokens. The token stream
is every document as EOT + `encode_ordinary(text)`, concatenated and cut into shards of exactly
`shard_size` tokens (a document that does not fit continues in the next shard), the last one shorter.
Shard 0 is the validation split, the rest are training shards: `{name}_{split}_{idx:06d}.bin`.

`build_shards` writes the shards plus `manifest.json` (per shard: file, split, ntok, sha256). Each shard is
written atomically, and after each one `progress.json` records where in the document stream the next shard
starts, so an interrupted run resumes there and rewrites only unfinished shards.

CLI: `python -m data.shards --help`.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import multiprocessing
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from data.fineweb import batched, describe_source, iter_documents
from common.files import atomic_path, read_json, remove_stale_tmp_files, sha256_file, write_json
from data.tokenizer import EOT, encode_documents, get_gpt2_encoding

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
DEFAULT_SHARD_SIZE = 10**8
MANIFEST = "manifest.json"
PROGRESS = "progress.json"  # finished shards of an interrupted run; gone once manifest.json is written
TOKENIZER_INFO = {"library": "tiktoken", "encoding": "gpt2", "method": "encode_ordinary", "document_prefix": EOT}
DOCS_PER_TASK = 128  # documents sent to a worker at a time: large enough to amortize the IPC


class ShardError(ValueError):
    """A shard file is missing, truncated or not an llm.c token shard; the message names the file."""


# ---------------------------------------------------------------------------------------------------------
# one shard


def shard_split(idx: int) -> str:
    return "val" if idx == 0 else "train"


def shard_filename(name: str, idx: int) -> str:
    return f"{name}_{shard_split(idx)}_{idx:06d}.bin"


def _header_bytes(ntok: int) -> bytes:
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = (MAGIC, VERSION, ntok)
    return header.tobytes()


def write_shard(path: str | os.PathLike, tokens: np.ndarray) -> str:
    """Write `tokens` (values < 2**16) as an llm.c shard, atomically. Returns the file's sha256."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= 2**16):
        raise ValueError(f"{path}: tokens must lie in [0, 65535] to be stored as uint16")
    data = _header_bytes(tokens.size) + tokens.astype("<u2", copy=False).tobytes()
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def shard_num_tokens(path: str | os.PathLike) -> int:
    """Validate a shard's header and file size; return its token count."""
    path = Path(path)
    if not path.is_file():
        raise ShardError(f"{path}: shard not found")
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise ShardError(f"{path}: {size} bytes is shorter than the {HEADER_BYTES}-byte header; rebuild the shard")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if header[0] != MAGIC or header[1] != VERSION:
        raise ShardError(
            f"{path}: header starts {header[0]}, {header[1]}; an llm.c token shard starts {MAGIC}, {VERSION}"
        )
    ntok = int(header[2])
    if size != HEADER_BYTES + 2 * ntok:
        raise ShardError(
            f"{path}: header says {ntok} tokens, so {HEADER_BYTES + 2 * ntok} bytes, but the file has {size} "
            f"bytes (truncated or corrupt); rebuild the shard"
        )
    return ntok


def read_shard(path: str | os.PathLike) -> np.ndarray:
    """The tokens of a validated shard as a read-only uint16 memory map (nothing is read up front)."""
    ntok = shard_num_tokens(path)
    if ntok == 0:
        return np.empty(0, dtype=np.uint16)
    return np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(ntok,))


# ---------------------------------------------------------------------------------------------------------
# tokenization, in-process or in a pool of workers; the order of documents is preserved either way


def default_num_workers() -> int:
    return len(os.sched_getaffinity(0))


def tokenize_documents(documents: Iterable[str], num_workers: int | None = None) -> Iterator[np.ndarray]:
    """Yield each document's uint16 tokens (EOT first), in document order, using `num_workers` processes."""
    num_workers = num_workers or default_num_workers()
    tasks = batched(documents, DOCS_PER_TASK)
    if num_workers == 1:
        yield from _split_results(map(encode_documents, tasks))
        return
    # spawn, not fork: the caller may be a multi-threaded process (a Prefect worker), which fork can deadlock
    with multiprocessing.get_context("spawn").Pool(num_workers, initializer=get_gpt2_encoding) as pool:
        yield from _split_results(pool.imap(encode_documents, tasks))


def _split_results(results: Iterable[tuple[np.ndarray, np.ndarray]]) -> Iterator[np.ndarray]:
    for tokens, lengths in results:
        yield from np.split(tokens, np.cumsum(lengths)[:-1])


# ---------------------------------------------------------------------------------------------------------
# the shard builder


class _ShardWriter:
    """Cuts the token stream into shards; after each shard, records in progress.json where the next starts."""

    def __init__(self, out_dir: Path, settings: dict, finished: list[dict]):
        self.out_dir, self.settings = out_dir, settings
        self.name, self.shard_size = settings["name"], settings["shard_size"]
        self.records = list(finished)
        self.buf = np.empty(self.shard_size, dtype=np.uint16)
        self.fill = 0

    def add(self, tokens: np.ndarray, doc_idx: int, offset: int) -> None:
        """Append document `doc_idx`'s tokens from token `offset` on."""
        while len(tokens):
            n = min(len(tokens), self.shard_size - self.fill)
            self.buf[self.fill : self.fill + n] = tokens[:n]
            self.fill += n
            tokens, offset = tokens[n:], offset + n
            if self.fill == self.shard_size:
                self.flush(*((doc_idx, offset) if len(tokens) else (doc_idx + 1, 0)))

    def flush(self, next_document: int, next_offset: int) -> None:
        idx = len(self.records)
        file = shard_filename(self.name, idx)
        sha256 = write_shard(self.out_dir / file, self.buf[: self.fill])
        self.records.append(
            {"file": file, "split": shard_split(idx), "ntok": self.fill, "sha256": sha256,
             "next_document": next_document, "next_offset": next_offset}
        )  # fmt: skip
        self.fill = 0
        write_json(self.out_dir / PROGRESS, {**self.settings, "shards": self.records})


def _settings(name: str, shard_size: int, source: dict | None) -> dict:
    return {"name": name, "shard_size": shard_size, "source": source, "tokenizer": TOKENIZER_INFO}


def _check_settings(path: Path, recorded: dict, settings: dict) -> None:
    differing = {k: (recorded.get(k), v) for k, v in settings.items() if recorded.get(k) != v}
    if differing:
        detail = "; ".join(f"{k}: recorded {old!r}, requested {new!r}" for k, (old, new) in differing.items())
        raise FileExistsError(f"{path} was written for other settings ({detail}); use another --out folder or delete it")


def _finished_shards(out_dir: Path, settings: dict) -> list[dict]:
    """The leading full shards of an interrupted run that are intact on disk (checked by sha256)."""
    progress_path = out_dir / PROGRESS
    if not progress_path.exists():
        return []
    progress = read_json(progress_path)
    _check_settings(progress_path, progress, settings)
    finished = []
    for record in progress["shards"]:
        path = out_dir / record["file"]
        # a short shard is the stream's last one; it is cheap to rewrite and may grow if the stream did
        if record["ntok"] != settings["shard_size"] or not path.is_file() or sha256_file(path) != record["sha256"]:
            break
        finished.append(record)
    return finished


def build_shards(
    documents: Iterable[str],
    out_dir: str | os.PathLike,
    name: str,
    shard_size: int = DEFAULT_SHARD_SIZE,
    num_workers: int | None = None,
    source: dict | None = None,
) -> dict:
    """Tokenize `documents` into llm.c shards in `out_dir`; return the manifest (also out_dir/manifest.json).

    source: JSON-able description of where the documents come from (see `data.fineweb.describe_source`),
    stored in the manifest and checked on reruns. If out_dir already holds a finished manifest for the
    same settings it is returned without touching `documents`; after an interruption, finished shards are
    kept and `documents` is re-read only to skip past them. The output does not depend on `num_workers`.
    """
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = _settings(name, shard_size, source)
    manifest_path = out_dir / MANIFEST
    if manifest_path.exists():
        manifest = read_json(manifest_path)
        _check_settings(manifest_path, manifest, settings)
        for record in manifest["shards"]:
            if shard_num_tokens(out_dir / record["file"]) != record["ntok"]:
                raise ShardError(f"{out_dir / record['file']}: token count differs from {manifest_path}")
        return manifest

    remove_stale_tmp_files(out_dir)
    finished = _finished_shards(out_dir, settings)
    writer = _ShardWriter(out_dir, settings, finished)
    start_doc, start_offset = (finished[-1]["next_document"], finished[-1]["next_offset"]) if finished else (0, 0)
    remaining = itertools.islice(documents, start_doc, None)  # finished documents are read, not tokenized

    num_documents = start_doc
    with tqdm(unit="tok", unit_scale=True, desc=f"tokenize {name}", initial=len(finished) * shard_size) as bar:
        for doc_idx, tokens in enumerate(tokenize_documents(remaining, num_workers), start=start_doc):
            offset = start_offset if doc_idx == start_doc else 0
            writer.add(tokens[offset:], doc_idx, offset)
            bar.update(len(tokens) - offset)
            num_documents = doc_idx + 1
        if writer.fill:
            writer.flush(num_documents, 0)

    manifest = {
        **settings,
        "num_documents": num_documents,
        "num_tokens": sum(r["ntok"] for r in writer.records),
        "shards": writer.records,
    }
    write_json(manifest_path, manifest)
    (out_dir / PROGRESS).unlink(missing_ok=True)
    return manifest


def build_shards_from_source(
    source: str | os.PathLike,
    out_dir: str | os.PathLike,
    name: str,
    config: str | None = None,
    limit: int | None = None,
    shard_size: int = DEFAULT_SHARD_SIZE,
    num_workers: int | None = None,
) -> dict:
    """`build_shards` over `data.fineweb.iter_documents(source, config, limit)` (hub id or local folder)."""
    return build_shards(
        iter_documents(source, config, limit),
        out_dir,
        name,
        shard_size=shard_size,
        num_workers=num_workers,
        source=describe_source(source, config, limit),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m data.shards",
        description="Tokenize documents (GPT-2, EOT-prefixed) into llm.c .bin token shards plus manifest.json.",
    )
    parser.add_argument("--source", required=True, help="hub id (e.g. HuggingFaceFW/fineweb) or local parquet/jsonl folder")
    parser.add_argument("--config", default=None, help="hub dataset config, e.g. sample-10BT")
    parser.add_argument("--out", required=True, type=Path, help="output folder for the shards and manifest.json")
    parser.add_argument("--name", default="fineweb", help="shard name prefix: {name}_{split}_{idx:06d}.bin")
    parser.add_argument("--shard-size", type=int, default=DEFAULT_SHARD_SIZE, help="tokens per shard")
    parser.add_argument("--limit", type=int, default=None, help="use only the first LIMIT documents")
    parser.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: all cores)")
    args = parser.parse_args(argv)
    manifest = build_shards_from_source(
        args.source, args.out, args.name, config=args.config, limit=args.limit,
        shard_size=args.shard_size, num_workers=args.workers,
    )  # fmt: skip
    print(f"{len(manifest['shards'])} shards, {manifest['num_tokens']:,} tokens in {args.out}")


if __name__ == "__main__":
    main()
