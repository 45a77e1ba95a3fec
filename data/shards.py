"""llm.c token shards: format, reader, and a parallel, resumable shard builder.

Shard format (byte-compatible with llm.c's dev/data/fineweb.py): a header of 256 little-endian int32
(`[0]=20240520` magic, `[1]=1` version, `[2]=ntok`, rest zero), then ntok uint16 tokens. The token stream
is every document as EOT + `encode_ordinary(text)`, concatenated and cut into shards of exactly
`shard_size` tokens (a document that does not fit continues in the next shard), the last one shorter.
Shard 0 is the validation split, the rest are training shards: `{name}_{split}_{idx:06d}.bin`.

`build_shards` writes the shards plus `manifest.json` (per shard: file, split, ntok, size, sha256), last.
Each shard is written atomically, and after each one `progress.json` records where in the document stream
the next shard starts, so an interrupted run resumes there and rewrites only unfinished shards. A rerun
verifies every shard against the manifest and rebuilds only the bad ones.

CLI: `python -m data.shards --help`.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import logging
import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from data.fineweb import batched, iter_documents, mismatch, refuse_or_clear, require_documents, source_identity
from common.cli import run_cli
from common.files import atomic_path, read_json, remove_stale_tmp_files, sha256_file, write_json
from common.limits import gigabytes, physical_memory, usable_cores
from common.paths import listed_file
from data.tokenizer import EOT, encode_documents, get_gpt2_encoding

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
DEFAULT_SHARD_SIZE = 10**8
MAX_SHARD_SIZE = 2**31 - 1  # the header counts a shard's tokens in an int32
MANIFEST = "manifest.json"
PROGRESS = "progress.json"  # finished shards of an interrupted run; gone once manifest.json is written
TOKENIZER_INFO = {"library": "tiktoken", "encoding": "gpt2", "method": "encode_ordinary", "document_prefix": EOT}
DOCS_PER_TASK = 128  # documents sent to a worker at a time: large enough to amortize the IPC
PROGRESS_EVERY = 1000  # documents between two calls of build_shards' progress callback


logger = logging.getLogger(__name__)


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


def shard_bytes(path: str | os.PathLike, tokens: np.ndarray) -> bytes:
    """The llm.c shard file holding `tokens` (values < 2**16); `path` only names it in errors."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= 2**16):
        raise ValueError(f"{path}: tokens must lie in [0, 65535] to be stored as uint16")
    return _header_bytes(tokens.size) + tokens.astype("<u2", copy=False).tobytes()


def write_shard(path: str | os.PathLike, tokens: np.ndarray) -> str:
    """Write `tokens` (values < 2**16) as an llm.c shard, atomically. Returns the file's sha256."""
    data = shard_bytes(path, tokens)
    with atomic_path(path, size=len(data)) as tmp:
        tmp.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def listed_shard(out_dir: str | os.PathLike, record: dict, listed_in: str = MANIFEST) -> Path:
    """The shard file a manifest (or progress) record names, which must be a file of `out_dir`
    (common.paths.listed_file): a crafted entry never makes a reader or the rebuild touch anything else."""
    return listed_file(out_dir, record.get("file"), Path(out_dir) / listed_in)


def manifest_shards(manifest_path: str | os.PathLike, split: str) -> list[Path]:
    """The shards of `split` ("train" or "val") that a shard folder's manifest lists, in its order: the exact
    file list a training run or an evaluation reads (never a pattern that could match other files)."""
    manifest_path = Path(manifest_path)
    records = read_json(manifest_path).get("shards", [])
    files = [listed_shard(manifest_path.parent, r, manifest_path.name) for r in records if r.get("split") == split]
    if not files:
        raise ShardError(f"{manifest_path} lists no {split} shards; rebuild the folder (the tokenize stage)")
    return files


def shard_problem(path: str | os.PathLike, record: dict) -> str | None:
    """None if `path` holds the shard a manifest `record` lists (size, then sha256), else what is wrong."""
    path = Path(path)
    if not path.is_file():
        return f"{path}: missing"
    size, expected = path.stat().st_size, HEADER_BYTES + 2 * record["ntok"]
    if size != expected:
        return f"{path}: {size} bytes, the manifest's {record['ntok']} tokens make {expected}"
    if (actual := sha256_file(path)) != record["sha256"]:
        return f"{path}: sha256 {actual}, but {MANIFEST} records {record['sha256']} (the bytes changed)"
    return None


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


def check_num_workers(num_workers: int | None, setting: str = "workers") -> None:
    """ValueError naming `setting` unless `num_workers` is None (all cores) or 1 to this machine's cores: more
    processes than cores only compete for them."""
    if num_workers is not None and not 1 <= num_workers <= usable_cores():
        raise ValueError(f"{setting}={num_workers}: this machine has {usable_cores()} usable CPU cores; "
                         f"use 1 to {usable_cores()}, or leave it unset for all of them")


def check_shard_size(shard_size: int) -> None:
    """ValueError naming the setting unless a shard of `shard_size` tokens can be written (its header's token count
    is an int32) and its buffer (2 bytes a token) fits in this machine's memory."""
    if not 1 <= shard_size <= MAX_SHARD_SIZE:
        raise ValueError(f"shard_size={shard_size}: must lie in [1, {MAX_SHARD_SIZE}], the most tokens an llm.c "
                         f"shard header can count (llm.c's own shards hold {DEFAULT_SHARD_SIZE})")
    if (needed := 2 * shard_size) > physical_memory():
        raise ValueError(f"shard_size={shard_size}: a shard's buffer needs {gigabytes(needed)}, more than this "
                         f"machine's {gigabytes(physical_memory())} of memory; use a smaller shard_size")


def tokenize_documents(documents: Iterable[str], num_workers: int | None = None) -> Iterator[np.ndarray]:
    """Yield each document's uint16 tokens (EOT first), in document order, using `num_workers` processes."""
    num_workers = num_workers or usable_cores()
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

    def __init__(self, out_dir: Path, settings: dict, finished: list[dict], buf: np.ndarray):
        self.out_dir, self.settings = out_dir, settings
        self.name, self.shard_size = settings["name"], settings["shard_size"]
        self.records = list(finished)
        self.buf = buf  # one shard's tokens (`_shard_buffer`)
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
            {"file": file, "split": shard_split(idx), "ntok": self.fill, "size": HEADER_BYTES + 2 * self.fill,
             "sha256": sha256, "next_document": next_document, "next_offset": next_offset}
        )  # fmt: skip
        self.fill = 0
        write_json(self.out_dir / PROGRESS, {**self.settings, "shards": self.records})


def _shard_buffer(shard_size: int) -> np.ndarray:
    """The buffer of one shard's tokens. It is allocated before anything of an earlier build is deleted, so a
    shard size that does not fit in memory fails with the folder as it was."""
    try:
        return np.empty(shard_size, dtype=np.uint16)
    except MemoryError:
        raise ValueError(f"shard_size={shard_size:,} tokens needs {2 * shard_size:,} bytes of memory for one shard; "
                         "lower shard_size") from None


def _settings(name: str, shard_size: int, source: dict | None) -> dict:
    return {"name": name, "shard_size": shard_size, "source": source, "tokenizer": TOKENIZER_INFO}


def _finished_shards(out_dir: Path, progress: dict, shard_size: int) -> list[dict]:
    """The leading full shards of an interrupted run that are intact on disk (checked by sha256)."""
    finished = []
    for record in progress["shards"]:
        # a short shard is the stream's last one; it is cheap to rewrite and may grow if the stream did
        if record["ntok"] != shard_size or shard_problem(listed_shard(out_dir, record, PROGRESS), record):
            break
        finished.append(record)
    return finished


def _clear(out_dir: Path, recorded: dict) -> None:
    """Delete a shard folder's manifest/progress and the shards it lists."""
    for record in recorded.get("shards", []):
        listed_shard(out_dir, record).unlink(missing_ok=True)
    for name in (PROGRESS, MANIFEST):
        (out_dir / name).unlink(missing_ok=True)


def _shard_span(records: list[dict], idx: int) -> tuple[int, int, int]:
    """(first document, token offset in it, end document) of shard `idx`: its tokens are those of
    documents [first, end), from the offset on."""
    start_doc, start_offset = (records[idx - 1]["next_document"], records[idx - 1]["next_offset"]) if idx else (0, 0)
    end_doc = records[idx]["next_document"] + (1 if records[idx]["next_offset"] else 0)
    return start_doc, start_offset, end_doc


def _repair(
    documents: Iterable[str], out_dir: Path, records: list[dict], bad: list[int], num_workers: int | None
) -> None:
    """Rewrite the shards `bad` (ascending indices) from `documents` in one pass over the stream; each must
    come out with its recorded sha256, else nothing is written for it."""
    docs, position = iter(documents), 0
    for idx in bad:
        start_doc, start_offset, end_doc = _shard_span(records, idx)
        for _ in itertools.islice(docs, start_doc - position):  # read, not tokenized
            pass
        span = list(itertools.islice(docs, end_doc - start_doc))
        position = end_doc
        record = records[idx]
        path = listed_shard(out_dir, record)
        tokens = np.concatenate([np.empty(0, np.uint16), *tokenize_documents(span, num_workers)])
        data = shard_bytes(path, tokens[start_offset : start_offset + record["ntok"]])
        if (actual := hashlib.sha256(data).hexdigest()) != record["sha256"]:
            raise ShardError(
                f"{path}: rebuilt from the source, its sha256 is {actual}, but the manifest records "
                f"{record['sha256']}: the source no longer yields the documents it was built from; rebuild the "
                f"folder (--replace)"
            )
        with atomic_path(path, size=len(data)) as tmp:
            tmp.write_bytes(data)


def build_shards(
    documents: Iterable[str],
    out_dir: str | os.PathLike,
    name: str,
    shard_size: int = DEFAULT_SHARD_SIZE,
    num_workers: int | None = None,
    source: dict | None = None,
    replace: bool = False,
    progress: Callable[[int], None] | None = None,
    source_name: str | None = None,
) -> dict:
    """Tokenize `documents` into llm.c shards in `out_dir`; return the manifest (also out_dir/manifest.json).

    source: the JSON-able identity of the documents (`data.fineweb.source_identity`), stored in the
    manifest. Reruns compare identities, not paths:
    - a finished manifest for the same name, shard_size, source identity and tokenizer: every shard is
      verified (size, then sha256); intact ones are kept, bad ones (missing, truncated, changed) are
      rebuilt alone from `documents` (read up to the last bad shard, only its documents tokenized). If
      all verify, `documents` is not touched.
    - after an interruption (progress.json), intact finished shards are kept and the build continues.
    - a folder recorded for another identity or settings is refused (FileExistsError naming what
      differs), or, with `replace`, cleared and rebuilt.
    `progress(documents_done)` is called as tokenization goes. The output does not depend on `num_workers`.
    No documents at all is refused (`EmptySource`, naming `source_name`, e.g. the path or dataset id).
    """
    check_shard_size(shard_size)  # before the folder is touched
    check_num_workers(num_workers)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = _settings(name, shard_size, source)
    buf = _shard_buffer(shard_size)  # before an older build is cleared: a failure here leaves it in place
    remove_stale_tmp_files(out_dir)
    for path in (out_dir / MANIFEST, out_dir / PROGRESS):
        if path.exists() and (difference := mismatch(recorded := read_json(path), settings)):
            refuse_or_clear(path, difference, replace, lambda: _clear(out_dir, recorded))
    if (out_dir / MANIFEST).exists():
        manifest = read_json(out_dir / MANIFEST)
        problems = {i: shard_problem(listed_shard(out_dir, record), record) for i, record in enumerate(manifest["shards"])}
        bad = [i for i, problem in problems.items() if problem]
        for i in bad:
            logger.warning("%s; rebuilding this shard", problems[i])
        if bad:
            _repair(documents, out_dir, manifest["shards"], bad, num_workers)
        return manifest

    progress_path = out_dir / PROGRESS
    finished = _finished_shards(out_dir, read_json(progress_path), shard_size) if progress_path.exists() else []
    writer = _ShardWriter(out_dir, settings, finished, buf)
    start_doc, start_offset = (finished[-1]["next_document"], finished[-1]["next_offset"]) if finished else (0, 0)
    remaining = itertools.islice(documents, start_doc, None)  # finished documents are read, not tokenized

    num_documents = start_doc
    with tqdm(unit="tok", unit_scale=True, desc=f"tokenize {name}", initial=len(finished) * shard_size,
              disable=None) as bar:  # None: off where stderr is not a terminal (a worker's log)
        for doc_idx, tokens in enumerate(tokenize_documents(remaining, num_workers), start=start_doc):
            offset = start_offset if doc_idx == start_doc else 0
            writer.add(tokens[offset:], doc_idx, offset)
            bar.update(len(tokens) - offset)
            num_documents = doc_idx + 1
            if progress and num_documents % PROGRESS_EVERY == 0:
                progress(num_documents)
        if writer.fill:
            writer.flush(num_documents, 0)
    require_documents(num_documents, source_name or f"the source of {out_dir}")

    manifest = {
        **settings,
        "num_documents": num_documents,
        "num_tokens": sum(r["ntok"] for r in writer.records),
        "shards": writer.records,
    }
    write_json(out_dir / MANIFEST, manifest)
    (out_dir / PROGRESS).unlink(missing_ok=True)
    if progress:
        progress(num_documents)
    return manifest


def build_shards_from_source(
    source: str | os.PathLike,
    out_dir: str | os.PathLike,
    name: str,
    config: str | None = None,
    limit: int | None = None,
    shard_size: int = DEFAULT_SHARD_SIZE,
    num_workers: int | None = None,
    replace: bool = False,
    progress: Callable[[int], None] | None = None,
) -> dict:
    """`build_shards` over `data.fineweb.iter_documents(source, config, limit)` (hub dataset or local files),
    identified by `source_identity` (a hub dataset is read at the revision resolved now)."""
    identity = source_identity(source, config, limit)
    return build_shards(
        iter_documents(source, config, limit, revision=identity.get("revision")),
        out_dir,
        name,
        shard_size=shard_size,
        num_workers=num_workers,
        source=identity,
        replace=replace,
        progress=progress,
        source_name=str(source),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m data.shards",
        description="Tokenize documents (GPT-2, EOT-prefixed) into llm.c .bin token shards plus manifest.json. "
        "A rerun verifies every shard and rebuilds only the bad ones.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--source", required=True,
                        help="local parquet/jsonl folder or file, or hub dataset: HuggingFaceFW/NAME or "
                        "hf://datasets/OWNER/NAME")
    parser.add_argument("--config", default=None, help="hub dataset config, e.g. sample-10BT")
    parser.add_argument("--out", required=True, type=Path, help="output folder for the shards and manifest.json")
    parser.add_argument("--name", default="fineweb", help="shard name prefix: {name}_{split}_{idx:06d}.bin")
    parser.add_argument("--shard-size", type=int, default=DEFAULT_SHARD_SIZE,
                        help=f"tokens per shard (1 to {MAX_SHARD_SIZE})")
    parser.add_argument("--limit", type=int, default=None, help="use only the first LIMIT documents (None: all)")
    parser.add_argument("--workers", type=int, default=None,
                        help="tokenizer processes, at most the usable cores (None: all of them)")
    parser.add_argument("--replace", action="store_true",
                        help="rebuild a folder written for another source content or other settings")
    args = parser.parse_args(argv)
    manifest = build_shards_from_source(
        args.source, args.out, args.name, config=args.config, limit=args.limit,
        shard_size=args.shard_size, num_workers=args.workers, replace=args.replace,
    )  # fmt: skip
    print(f"{len(manifest['shards'])} shards, {manifest['num_tokens']:,} tokens in {args.out}")


if __name__ == "__main__":
    run_cli(main)
