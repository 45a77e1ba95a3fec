"""FineWeb documents, streamed from the Hugging Face hub or read from a local folder.

`iter_documents` is the one entry point: given a hub dataset (`HuggingFaceFW/fineweb`,
`HuggingFaceFW/fineweb-edu`, or `hf://datasets/OWNER/NAME` for any dataset with a `text` column) it streams
the `train` split, so the dataset is never held in memory; given a local directory (or file) of parquet /
jsonl files with a `text` column it reads those, in sorted file order. Both go through the same validation
and `limit` code. `parse_source` says which a string names; `source_identity` is what the documents are
by content (local file bytes, or hub id + config + resolved revision).

`download` makes a local copy that later stages and reruns read offline: of a hub dataset, its parquet
files at one commit, fetched in parallel through huggingface_hub, resumed byte-exactly after any
interruption and checked against the hub's sha256 (`download_hub`); of a local corpus, parts of it
(`copy_local`).

CLI: `python -m data.fineweb --help`.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tqdm import tqdm

from common.cli import run_cli
from common.files import (atomic_path, iter_jsonl_records, naming_disk_full, read_json, require_free_space,
                          sha256_file, utf8_text, write_json)

FINEWEB_DATASETS = ("HuggingFaceFW/fineweb", "HuggingFaceFW/fineweb-edu")
FINEWEB_CONFIGS = ("sample-10BT", "sample-100BT")
LOCAL_SUFFIXES = (".parquet", ".jsonl")
TEXT_COLUMN = "text"


logger = logging.getLogger(__name__)
T = TypeVar("T")


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
        for text in _python_values(batch.column(0), path, pf.metadata, row):
            yield f"{path} row {row}", text
            row += 1


def _python_values(column, path: Path, metadata, first_row: int) -> list:
    """A batch's text column as Python values; a value that is not UTF-8 raises DocumentError naming the file,
    row, row group and column (pyarrow's own UnicodeDecodeError names none of them)."""
    import pyarrow as pa

    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        as_bytes = column.view(pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary())
        for i, raw in enumerate(as_bytes.to_pylist()):
            if raw is not None:
                row = first_row + i
                group, row_in_group = _row_group_of(metadata, row)
                utf8_text(raw, f"{path} row {row} (row group {group}, its row {row_in_group}), column "
                               f"'{TEXT_COLUMN}'", DocumentError, of="the value")
        raise  # every value decodes by itself: not a text problem of the file's, so pyarrow's error stands


def _row_group_of(metadata, row: int) -> tuple[int, int]:
    """(row group, row within it) of a parquet file's `row`, from its metadata."""
    for group in range(metadata.num_row_groups):
        if row < (rows := metadata.row_group(group).num_rows):
            return group, row
        row -= rows
    raise IndexError(f"row {row} past the last row group")


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
    Raises DocumentError naming the file and row of a document whose text is missing, not a string or not UTF-8.
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

DOWNLOAD_WORKERS = 8  # files fetched at once (snapshot_download's default)
FILE_ATTEMPTS = 5  # per file: a transient failure is retried, resuming the partial file, after 1, 2, 4, 8 s
PARTIAL_SUFFIX = ".partial"
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
    progress: Callable[[int, int | None, str], None] | None = None,
    revision: str | None = None,
    max_workers: int = DOWNLOAD_WORKERS,
) -> Path:
    """A local copy of `source`'s documents in `out_dir` (parquet files with a `text` column); returns `out_dir`.

    A hub dataset: the parquet files of `config`'s train split at one commit, fetched in parallel, resumed
    and verified against the hub's sha256 (`download_hub`). A local corpus: copied into parts of
    `docs_per_file` documents (`copy_local`). `progress(done, total or None, unit)` reports either.
    """
    if parse_source(source).kind == "hub":
        return download_hub(parse_source(source).location, config, out_dir, limit, revision=revision,
                            replace=replace, max_workers=max_workers, progress=progress)
    return copy_local(source, out_dir, limit, docs_per_file, replace, progress)


def copy_local(
    source: str,
    out_dir: str | os.PathLike,
    limit: int | None = None,
    docs_per_file: int = 100_000,
    replace: bool = False,
    progress: Callable[[int, int | None, str], None] | None = None,
) -> Path:
    """Copy a local corpus into `out_dir/part_NNNNN.parquet` files (a `text` column) and return `out_dir`.

    The folder records its identity (`source_identity` plus docs_per_file). Idempotent, verified and
    resumable: a finished copy (manifest.json, every part with size and sha256, written last) is returned once
    its parts verify; a damaged part, or an interruption (download.json), resumes after the last intact full
    part. A folder recorded for another identity is refused, or cleared and redone with `replace`.
    `progress(documents_done, total or None, "documents")` is called after each part.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest_path, progress_path = out_dir / DOWNLOAD_MANIFEST, out_dir / DOWNLOAD_PROGRESS
    recorded_path = next((p for p in (manifest_path, progress_path) if p.exists()), None)
    recorded = read_json(recorded_path) if recorded_path else None
    identity = {**source_identity(source, None, limit), "docs_per_file": docs_per_file}
    if recorded and (difference := mismatch(recorded, identity)):
        refuse_or_clear(recorded_path, difference, replace, lambda: _clear_download(out_dir))
        recorded = None
    parts = recorded.get("files", []) if recorded else []
    done = _intact_parts(out_dir, parts)
    if recorded_path == manifest_path and recorded and done == len(parts):
        return out_dir
    write_json(progress_path, {**identity, "files": parts[:done]})
    manifest_path.unlink(missing_ok=True)

    # a short part is the corpus's last one: it is redone, since the corpus may have grown
    while done and parts[done - 1]["num_documents"] != docs_per_file:
        done -= 1
    parts = parts[:done]
    skip = done * docs_per_file
    total = None if limit is None else max(limit, 0)
    documents = itertools.islice(iter_documents(source, None, limit), skip, None)
    written = skip
    with tqdm(total=total, initial=skip, unit="doc", desc=f"copy {source}", disable=None) as bar:
        for idx, texts in enumerate(batched(documents, docs_per_file), start=done):
            part = _part_path(out_dir, idx)
            _write_part(part, texts)
            parts.append({"file": part.name, "num_documents": len(texts), "size": part.stat().st_size,
                          "sha256": sha256_file(part)})
            write_json(progress_path, {**identity, "files": parts})
            bar.update(len(texts))
            written += len(texts)
            if progress:
                progress(written, total, "documents")
    for stale in sorted(out_dir.glob("part_*.parquet"))[len(parts):]:  # a longer earlier corpus's tail
        stale.unlink()
    require_documents(written, source)
    write_json(manifest_path, {**identity, "num_documents": sum(p["num_documents"] for p in parts), "files": parts})
    progress_path.unlink()
    return out_dir


def _clear_download(out_dir: Path) -> None:
    """Delete what a download wrote in `out_dir`: its records, parts and partial files."""
    for path in [out_dir / DOWNLOAD_MANIFEST, out_dir / DOWNLOAD_PROGRESS, *out_dir.glob("part_*.parquet"),
                 *out_dir.glob(f"part_*.parquet{PARTIAL_SUFFIX}")]:
        path.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------------------
# hub download: a config's files at one commit, in parallel, resumable, verified
#
# huggingface_hub's own machinery does the HTTP: HfApi for the commit and the file list (with each file's
# sha256, its LFS oid), hf_hub_url for the URLs, http_get for each file (its session and headers, ranged
# resume and retries of dropped connections within a call). Its hf_hub_download/snapshot_download are not
# used: they write each file to a temporary file unique to the process and delete it on failure, so an
# interrupted 2 GB file restarts from its first byte, and they check sizes but no hashes. Here each file
# has a stable partial file next to its final name, so any rerun resumes it where it stopped.

class HubFileError(RuntimeError):
    """A hub file that cannot be had as recorded: refused by the hub (4xx) or never matching its sha256."""


class DownloadInterrupted(ConnectionError):
    """A file whose transfer kept failing (network); its bytes so far are kept, so a rerun resumes it."""


@dataclass(frozen=True)
class HubFile:
    path: str  # in the repository
    size: int
    sha256: str | None  # the LFS oid the hub publishes; None for a file kept in git (then `blob_sha1` is checked)
    blob_sha1: str

    def digest_of(self, path: Path) -> tuple[str, str]:
        """(what the hub records, what the local file hashes to), in the same kind of hash."""
        if self.sha256:
            return self.sha256, sha256_file(path)
        with open(path, "rb") as f:  # git's blob id: sha1 of a "blob SIZE\0" header, then the bytes
            blob = hashlib.file_digest(f, lambda: hashlib.sha1(b"blob %d\0" % path.stat().st_size))
        return self.blob_sha1, blob.hexdigest()

    def record(self, index: int) -> dict:
        return {"file": _part_path(Path(), index).name, "path": self.path, "size": self.size, "sha256": self.sha256,
                "blob_sha1": self.blob_sha1}


def _glob_regex(pattern: str) -> re.Pattern:
    """A data_files glob as the hub's clients read it: `*` and `?` within one folder, `**` across folders."""
    parts = re.split(r"(\*\*/?|\*|\?)", pattern)
    table = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
    return re.compile("".join(table.get(p, re.escape(p)) for p in parts))


def _fixed_folder(pattern: str) -> str:
    """The folders of a glob before its first wildcard: the only part of the repository to list."""
    folders = pattern.split("/")[:-1]
    fixed = itertools.takewhile(lambda part: not any(c in part for c in "*?["), folders)
    return "/".join(fixed)


def _fetch_text(url: str) -> str:
    import io

    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    buffer = io.BytesIO()
    http_get(url, buffer, headers=build_hf_headers())
    return buffer.getvalue().decode()


def config_patterns(repo_id: str, sha: str, config: str | None) -> list[str]:
    """The `train` data_files globs of `config`, from the `configs:` YAML of the dataset card at commit `sha`.

    A dataset whose card names no configs (and config None): every parquet file.
    """
    from huggingface_hub import DatasetCard, hf_hub_url

    card = DatasetCard(_fetch_text(hf_hub_url(repo_id, "README.md", repo_type="dataset", revision=sha)))
    configs = {c.get("config_name"): c.get("data_files") for c in card.data.to_dict().get("configs") or []}
    if config is None and not configs:
        return ["**/*.parquet"]
    name = config if config is not None else "default"
    if name not in configs:
        raise SourceNotFound(f"{repo_id}: no config {name!r} in the configs of its README.md at {sha} "
                             f"(configs: {', '.join(map(str, configs)) or 'none'}); set --config to one of them")
    data_files = configs[name]
    if isinstance(data_files, (str, list)) and not (isinstance(data_files, list) and data_files
                                                    and isinstance(data_files[0], dict)):
        data_files = [{"split": "train", "path": data_files}]
    paths = [entry["path"] for entry in data_files if entry.get("split", "train") == "train"]
    return [p for path in paths for p in ([path] if isinstance(path, str) else path)]


def list_hub_files(repo_id: str, sha: str, config: str | None) -> list[HubFile]:
    """The document files of `config` at commit `sha`, in the order of their paths (the hub's reading order)."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    files = {}
    for pattern in config_patterns(repo_id, sha, config):
        regex = _glob_regex(pattern)
        tree = HfApi().list_repo_tree(repo_id, path_in_repo=_fixed_folder(pattern) or None, recursive=True,
                                      revision=sha, repo_type="dataset")
        for entry in tree:
            if isinstance(entry, RepoFile) and regex.fullmatch(entry.path) and entry.path.endswith(LOCAL_SUFFIXES):
                files[entry.path] = HubFile(entry.path, entry.size, entry.lfs.sha256 if entry.lfs else None,
                                            entry.blob_id)
    if not files:
        raise EmptySource(f"{repo_id} (config {config}) at {sha}: no {' or '.join(LOCAL_SUFFIXES)} file matches "
                          f"{config_patterns(repo_id, sha, config)}: nothing to download")
    return [files[path] for path in sorted(files)]


def _fetch_attempt(url: str, partial: Path, file: HubFile) -> None:
    """One ranged GET of what `partial` still lacks (http_get also resumes dropped connections itself)."""
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    if partial.exists() and partial.stat().st_size > file.size:  # not a prefix of this file
        partial.unlink()
    with open(partial, "r+b" if partial.exists() else "wb") as f:
        f.seek(0, os.SEEK_END)
        # expected_size: a partial file that is already whole (killed before its check) is not requested again;
        # a range from its end would be refused with a 416
        http_get(url, f, resume_size=f.tell(), headers=build_hf_headers(), expected_size=file.size,
                 displayed_filename=file.path)


def retry_transient(what: str, call: Callable[[], T]) -> T:
    """`call()`, retried after 1, 2, 4, 8 s while it fails transiently (common.network); its last error raised."""
    from common.network import is_transient_network_error

    for attempt in itertools.count(1):
        try:
            return call()
        except Exception as e:
            if attempt == FILE_ATTEMPTS or not is_transient_network_error(e):
                raise
            logger.warning("%s: %s: %s; retrying in %d s", what, type(e).__name__, e, 2 ** (attempt - 1))
            time.sleep(2 ** (attempt - 1))


def fetch_hub_file(repo_id: str, sha: str, file: HubFile, dest: Path) -> None:
    """`file` of commit `sha` at `dest`, verified against the hub's hash; resumes `dest`'s partial file.

    Transient failures are retried (`retry_transient`), each attempt resuming what is on disk; then
    DownloadInterrupted (transient, the bytes kept). A hub refusal (an HTTP 4xx) is HubFileError at once. A
    file whose hash differs from the hub's is fetched again from scratch once, then HubFileError names both.
    """
    from huggingface_hub import hf_hub_url

    from common.network import http_status, is_transient_network_error

    url = hf_hub_url(repo_id, file.path, repo_type="dataset", revision=sha)
    partial = _partial_path(dest)
    where = f"{repo_id}: {file.path} at {sha}"
    for _ in range(2):
        try:
            with naming_disk_full(partial, lambda: _missing_bytes(partial, file)):
                retry_transient(file.path, lambda: _fetch_attempt(url, partial, file))
        except Exception as e:
            if is_transient_network_error(e):
                kept = partial.stat().st_size if partial.exists() else 0
                raise DownloadInterrupted(f"{where}: {type(e).__name__}: {e}, {FILE_ATTEMPTS} attempts; {kept:,} of "
                                          f"{file.size:,} bytes kept in {partial}: rerun the same command to resume") from e
            if http_status(e) is not None:
                raise HubFileError(f"{where}: HTTP {http_status(e)} ({e}); not retried: the hub refuses it") from e
            raise  # a local failure (a full disk, a permission): its own error names it
        expected, actual = file.digest_of(partial)
        if expected == actual:
            os.replace(partial, dest)
            return
        partial.unlink()
        logger.warning("%s: hash %s, but the hub records %s; fetching it again", file.path, actual, expected)
    raise HubFileError(f"{where} hashes to {actual} twice, but the hub records {expected}; nothing was kept. "
                       f"The hub's copy or the way to it is damaged: retry later")


def _partial_path(dest: Path) -> Path:
    """Where the bytes of `dest` gather until they are whole and verified."""
    return dest.with_name(dest.name + PARTIAL_SUFFIX)


def _missing_bytes(partial: Path, file: HubFile) -> int:
    """What the download of `file` still has to write, given its partial file (resumed when it is a prefix)."""
    kept = partial.stat().st_size if partial.exists() else 0
    return file.size - kept if kept <= file.size else file.size


def _verified(dest: Path, file: HubFile) -> bool:
    if not dest.is_file() or dest.stat().st_size != file.size:
        return False
    expected, actual = file.digest_of(dest)
    if expected != actual:
        logger.warning("%s differs from the hub's %s (hash %s, not %s); fetching it again", dest, file.path,
                       actual, expected)
        dest.unlink()
    return expected == actual


def _files_needed(files: list[HubFile], out_dir: Path, limit: int | None,
                  fetch: Callable[[range], None]) -> int:
    """How many leading files hold the first `limit` documents (all of them without a limit), fetching them.

    The first file is fetched alone; then the documents per byte of the files on disk estimate how many more
    hold the rest, and those are fetched together, until the files on disk hold `limit` documents.
    """
    if limit is None:
        fetch(range(len(files)))
        return len(files)
    n, documents = 0, 0
    while documents < limit and n < len(files):
        more = 1
        if documents:
            wanted_bytes = (limit - documents) * sum(f.size for f in files[:n]) / documents
            more += sum(1 for size in itertools.accumulate(f.size for f in files[n:]) if size < wanted_bytes)
        batch = range(n, min(n + more, len(files)))
        fetch(batch)
        for i in batch:
            documents, n = documents + _num_rows(_part_path(out_dir, i)), i + 1
            if documents >= limit:
                break
    return n


def download_hub(
    repo_id: str,
    config: str | None,
    out_dir: str | os.PathLike,
    limit: int | None = None,
    revision: str | None = None,
    replace: bool = False,
    max_workers: int = DOWNLOAD_WORKERS,
    progress: Callable[[int, int | None, str], None] | None = None,
) -> Path:
    """The parquet files of `config`'s train split at one commit, in `out_dir` as part_NNNNN.parquet.

    `revision` (a branch, tag or commit; default the main branch) is resolved to a commit sha when the
    download starts; every request names that sha, and a rerun of the same request keeps it (download.json,
    then manifest.json record it), so the folder never mixes two commits. Files come down `max_workers` at
    a time; each is resumed from its partial file and checked against the hub's sha256 (`fetch_hub_file`).
    With `limit`, only the leading files that hold `limit` documents. manifest.json, written last, lists each
    file (part name, repository path, size, sha256) and the documents they hold. A folder recorded for
    another dataset, config or revision is refused, or cleared with `replace`.
    """
    from concurrent.futures import ThreadPoolExecutor

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest_path, progress_path = out_dir / DOWNLOAD_MANIFEST, out_dir / DOWNLOAD_PROGRESS
    recorded_path = next((p for p in (manifest_path, progress_path) if p.exists()), None)
    recorded = read_json(recorded_path) if recorded_path else None
    request = {"hub": repo_id, "config": config, "requested_revision": revision}
    if recorded and (difference := mismatch(recorded, request)):
        refuse_or_clear(recorded_path, difference, replace, lambda: _clear_download(out_dir))
        recorded = None
    if recorded:
        sha, listing = recorded["revision"], [HubFile(**f) for f in recorded["listing"]]
    else:
        sha = retry_transient(repo_id, lambda: resolve_hub_revision(repo_id, revision))
        listing = retry_transient(f"{repo_id} at {sha}", lambda: list_hub_files(repo_id, sha, config))
    identity = {**request, "revision": sha, "listing": [dataclasses.asdict(f) for f in listing]}
    write_json(progress_path, {**identity, "limit": limit})
    manifest_path.unlink(missing_ok=True)

    total_bytes = sum(f.size for f in listing)
    done_bytes = [0]

    def fetch(indices: range) -> None:
        todo = [i for i in indices if not _verified(_part_path(out_dir, i), listing[i])]
        done_bytes[0] += sum(listing[i].size for i in indices if i not in todo)
        # the listed sizes, before the first byte: a full disk is named now, not as a bare OSError mid-file
        require_free_space(out_dir, sum(_missing_bytes(_partial_path(_part_path(out_dir, i)), listing[i]) for i in todo))
        with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(todo) or 1))) as pool:
            jobs = [pool.submit(fetch_hub_file, repo_id, sha, listing[i], _part_path(out_dir, i)) for i in todo]
            for i, job in zip(todo, jobs):
                job.result()  # the first failure, in file order; the others finish or fail on their own
                done_bytes[0] += listing[i].size
                if progress:
                    progress(done_bytes[0], total_bytes, "bytes")

    n = _files_needed(listing, out_dir, limit, fetch)
    for extra in out_dir.glob("part_*.parquet*"):  # files beyond the limit, or of an earlier, longer request
        if extra.name not in {_part_path(out_dir, i).name for i in range(n)}:
            extra.unlink()
    files = [{**listing[i].record(i), "num_documents": _num_rows(_part_path(out_dir, i))} for i in range(n)]
    num_documents = require_documents(sum(f["num_documents"] for f in files), repo_id, config)
    write_json(manifest_path, {**identity, "limit": limit, "num_documents": num_documents, "files": files})
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
    parser.add_argument("--revision", default=None,
                        help="hub branch, tag or commit sha (default: the main branch, resolved to its commit once)")
    parser.add_argument("--max-workers", type=int, default=DOWNLOAD_WORKERS, help="hub files fetched at once")
    parser.add_argument("--docs-per-file", type=int, default=100_000,
                        help="a local source only: documents per parquet part (hub files are kept as published)")
    parser.add_argument("--replace", action="store_true", help="clear a folder recorded for another download")
    args = parser.parse_args(argv)
    if args.max_workers < 1:
        parser.error(f"--max-workers must be >= 1, got {args.max_workers}")
    out = download(args.source, args.config, args.out, limit=args.limit, docs_per_file=args.docs_per_file,
                   replace=args.replace, revision=args.revision, max_workers=args.max_workers)
    print(f"documents cached in {out}")


if __name__ == "__main__":
    run_cli(main)
