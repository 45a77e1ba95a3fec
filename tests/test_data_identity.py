"""Content identity and verified outputs in data/: sources by content, shard folders that check and repair
themselves, loaders that name a bad shard, source strings classified before any network call, and the
edges of the text (lone surrogates, `<|endoftext|>`, HellaSwag labels)."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from data import fineweb, hellaswag, shards
from data.fineweb import DocumentError, SourceNotFound, iter_documents, parse_source, source_identity
from data.loader import DistributedDataLoader
from data.shards import ShardError, build_shards, build_shards_from_source
from data.tokenizer import EOT, encode_documents, get_gpt2_encoding

REPO = Path(__file__).resolve().parents[1]
HELLASWAG_FIXTURE = REPO / "tests" / "fixtures" / "data" / "hellaswag_mini.jsonl"


def write_corpus(path: Path, n: int) -> list[str]:
    docs = [f"Document number {i}: " + "word " * (i % 17 + 1) for i in range(n)]
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return docs


def stream_tokens(docs: list[str]) -> list[int]:
    enc = get_gpt2_encoding()
    return [t for d in docs for t in [EOT, *enc.encode_ordinary(d)]]


def shard_stamps(out: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.glob("*.bin")}


# ---------------------------------------------------------------------------------------------------------
# source classification


def test_a_missing_local_looking_path_is_not_found_before_any_network_call(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", lambda *a, **k: pytest.fail("asked the hub"))
    for source in ("work/mydocs", "./mydocs", "/nonexistent/corpus", "corpus.jsonl", "a/b/c", "mydocs"):
        with pytest.raises(SourceNotFound) as info:
            list(iter_documents(source))
        message = str(info.value)
        assert source in message and "no such file or folder" in message and "hf://datasets/" in message
    from tasks.retry import is_transient

    assert not is_transient(info.value)


def test_source_strings_are_classified_by_one_rule(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "a.jsonl").write_text('{"text": "x"}\n')
    assert parse_source("work") == fineweb.Source("local", str(tmp_path / "work"))
    assert parse_source("work/a.jsonl") == fineweb.Source("local", str(tmp_path / "work" / "a.jsonl"))
    assert parse_source("HuggingFaceFW/fineweb-edu") == fineweb.Source("hub", "HuggingFaceFW/fineweb-edu")
    assert parse_source("hf://datasets/allenai/c4") == fineweb.Source("hub", "allenai/c4")
    with pytest.raises(DocumentError, match="not a hub dataset id"):
        parse_source("hf://datasets/no-owner")


def test_hub_identity_is_id_config_and_resolved_revision_and_the_stream_reads_that_revision(monkeypatch):
    import huggingface_hub

    asked, streamed = [], []

    def dataset_info(self, repo_id, revision=None, **kwargs):
        asked.append((repo_id, revision))
        return type("Info", (), {"sha": "c0ffee" * 6 + "abcd"})()

    def load_dataset(path, name=None, split=None, streaming=False, revision=None):
        streamed.append((path, name, split, streaming, revision))
        return ({"text": f"doc {i}"} for i in range(10**9))

    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", dataset_info)
    monkeypatch.setitem(sys.modules, "datasets", type(sys)("datasets"))
    sys.modules["datasets"].load_dataset = load_dataset
    identity = source_identity("HuggingFaceFW/fineweb", "sample-10BT", limit=2)
    assert identity == {"hub": "HuggingFaceFW/fineweb", "config": "sample-10BT",
                        "revision": "c0ffee" * 6 + "abcd", "limit": 2}
    assert list(iter_documents("HuggingFaceFW/fineweb", "sample-10BT", 2, revision=identity["revision"])) == [
        "doc 0", "doc 1"]
    assert streamed == [("HuggingFaceFW/fineweb", "sample-10BT", "train", True, "c0ffee" * 6 + "abcd")]


def test_a_hub_dataset_that_does_not_exist_is_not_found_and_not_retried(monkeypatch):
    import httpx
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    def dataset_info(self, repo_id, revision=None, **kwargs):  # what the hub answers for an unknown id
        url = f"https://huggingface.co/api/datasets/{repo_id}"
        response = httpx.Response(404, request=httpx.Request("GET", url))
        raise RepositoryNotFoundError("404 Client Error. Repository Not Found", response=response)

    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", dataset_info)
    with pytest.raises(SourceNotFound, match="HuggingFaceFW/fineweb-typo: no such dataset on the Hugging Face hub"):
        source_identity("HuggingFaceFW/fineweb-typo")
    from tasks.retry import is_transient

    with pytest.raises(SourceNotFound) as info:
        source_identity("HuggingFaceFW/fineweb-typo")
    assert not is_transient(info.value)


def test_local_identity_is_the_bytes_of_the_files_not_their_path(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    write_corpus(a / "docs.jsonl", 5)
    write_corpus(b / "docs.jsonl", 5)
    assert source_identity(a) == source_identity(b)
    write_corpus(a / "docs.jsonl", 6)
    assert source_identity(a) != source_identity(b)
    assert source_identity(a)["local"][0]["sha256"] == hashlib.sha256((a / "docs.jsonl").read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------------------
# shard folders: identity, verification, repair


def test_edited_corpus_is_refused_naming_the_difference_and_rebuilt_with_replace(tmp_path):
    corpus, out = tmp_path / "corpus.jsonl", tmp_path / "out"
    write_corpus(corpus, 100)
    assert build_shards_from_source(corpus, out, "c", shard_size=500, num_workers=1)["num_documents"] == 100
    docs = write_corpus(corpus, 150)  # edited in place
    with pytest.raises(FileExistsError, match="source: recorded .* requested"):
        build_shards_from_source(corpus, out, "c", shard_size=500, num_workers=1)
    manifest = build_shards_from_source(corpus, out, "c", shard_size=500, num_workers=1, replace=True)
    assert manifest["num_documents"] == 150
    written = [t for r in manifest["shards"] for t in shards.read_shard(out / r["file"]).tolist()]
    assert written == stream_tokens(docs)
    assert sorted(p.name for p in out.glob("*.bin")) == sorted(r["file"] for r in manifest["shards"])


def test_other_shard_size_with_replace_rebuilds_and_removes_the_old_shards(tmp_path):
    corpus, out = tmp_path / "corpus.jsonl", tmp_path / "out"
    docs = write_corpus(corpus, 60)
    build_shards_from_source(corpus, out, "c", shard_size=200, num_workers=1)
    manifest = build_shards_from_source(corpus, out, "c", shard_size=700, num_workers=1, replace=True)
    assert [r["ntok"] for r in manifest["shards"][:-1]] == [700] * (len(manifest["shards"]) - 1)
    assert sorted(p.name for p in out.glob("*.bin")) == sorted(r["file"] for r in manifest["shards"])
    assert [t for r in manifest["shards"] for t in shards.read_shard(out / r["file"]).tolist()] == stream_tokens(docs)


@pytest.mark.parametrize("damage", ["same-size overwrite", "truncated", "deleted"])
def test_a_rerun_verifies_every_shard_and_rebuilds_only_the_bad_ones(tmp_path, damage):
    corpus, out = tmp_path / "corpus.jsonl", tmp_path / "out"
    write_corpus(corpus, 80)
    manifest = build_shards_from_source(corpus, out, "c", shard_size=300, num_workers=1)
    assert len(manifest["shards"]) >= 4
    good = {r["file"]: (out / r["file"]).read_bytes() for r in manifest["shards"]}
    bad = out / manifest["shards"][2]["file"]
    if damage == "same-size overwrite":
        raw = bytearray(bad.read_bytes())
        raw[2000:2010] = b"\x01" * 10
        bad.write_bytes(bytes(raw))
    elif damage == "truncated":
        bad.write_bytes(bad.read_bytes()[:-7])
    else:
        bad.unlink()
    before = shard_stamps(out)

    assert build_shards_from_source(corpus, out, "c", shard_size=300, num_workers=1) == manifest
    assert {f: (out / f).read_bytes() for f in good} == good
    after = shard_stamps(out)
    assert {f for f in after if after[f] != before.get(f)} == {bad.name}  # only the bad shard was written


def test_a_rebuilt_shard_that_differs_from_its_manifest_is_an_error(tmp_path):
    """Same recorded identity, other documents (a source that changed without its identity changing)."""
    docs = [f"doc {i} " * 20 for i in range(40)]
    manifest = build_shards(docs, tmp_path, "c", shard_size=300, num_workers=1, source={"id": "x"})
    (tmp_path / manifest["shards"][1]["file"]).unlink()
    with pytest.raises(ShardError, match=r"c_train_000001\.bin: rebuilt from the source, its sha256 is .* the manifest"):
        build_shards([d.upper() for d in docs], tmp_path, "c", shard_size=300, num_workers=1, source={"id": "x"})


def test_progress_callback_counts_documents_and_tqdm_writes_no_carriage_returns_without_a_terminal(tmp_path, capfd):
    seen = []
    manifest = build_shards([f"d{i}" for i in range(300)], tmp_path, "p", shard_size=100, num_workers=1,
                            progress=seen.append)
    assert seen and seen == sorted(seen) and seen[-1] == manifest["num_documents"] == 300
    assert "\r" not in capfd.readouterr().err


def test_shards_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        shards.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 100000000)" in text and "(default: fineweb)" in text


# ---------------------------------------------------------------------------------------------------------
# the loader verifies what it reads


def test_the_loader_names_a_shard_whose_bytes_differ_from_its_manifest(tmp_path):
    manifest = build_shards([f"document {i} " * 30 for i in range(30)], tmp_path, "l", shard_size=400,
                            num_workers=1)
    path = tmp_path / manifest["shards"][1]["file"]
    raw = bytearray(path.read_bytes())
    raw[1100:1102] = b"\xff\xff"  # token 65535: out of GPT-2's range, as a corrupt shard would hold
    path.write_bytes(bytes(raw))
    with pytest.raises(ShardError, match=r"l_train_000001\.bin: sha256 .* manifest\.json records"):
        loader = DistributedDataLoader([tmp_path / r["file"] for r in manifest["shards"]], B=2, T=16)
        for _ in range(200):
            loader.next_batch()


def test_the_loader_names_a_shard_with_out_of_range_tokens_when_there_is_no_manifest(tmp_path):
    shards.write_shard(tmp_path / "x_000.bin", np.arange(100) % 50257)
    shards.write_shard(tmp_path / "x_001.bin", np.r_[np.arange(99), 60000])
    loader = DistributedDataLoader(str(tmp_path / "x_*.bin"), B=2, T=8, order="file")  # x_001 is read second
    with pytest.raises(ShardError, match=r"x_001\.bin: token 60000 at position 99 is outside GPT-2's vocabulary"):
        for _ in range(20):
            loader.next_batch()


# ---------------------------------------------------------------------------------------------------------
# text edges


def test_a_lone_surrogate_is_encoded_as_tiktokens_encode_ordinary_does(tmp_path):
    enc = get_gpt2_encoding()
    texts = ["broken emoji \ud83d here", "fine"]
    tokens, lengths = encode_documents(texts)
    expected = [t for text in texts for t in [EOT, *enc.encode_ordinary(text)]]
    assert tokens.tolist() == expected and lengths.tolist() == [len(enc.encode_ordinary(t)) + 1 for t in texts]
    assert enc.encode_ordinary("\ud83d") == enc.encode_ordinary("\ufffd")

    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "a \\ud83d b"}\n{"text": "ok"}\n')  # valid JSON, not valid UTF-8 text
    manifest = build_shards_from_source(corpus, tmp_path / "out", "u", shard_size=100, num_workers=2)
    assert shards.read_shard(tmp_path / "out" / manifest["shards"][0]["file"]).tolist() == [
        EOT, *enc.encode_ordinary("a \ud83d b"), EOT, *enc.encode_ordinary("ok")]


# ---------------------------------------------------------------------------------------------------------
# HellaSwag


def _hellaswag_records(n: int) -> list[dict]:
    return [{"ctx": f"Context {i}", "endings": [f"end {i}.{j}" for j in range(4)], "label": i % 4} for i in range(n)]


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_hellaswag_prepare_follows_its_source_content(tmp_path):
    out = tmp_path / "eval"
    first = hellaswag.prepare(out, HELLASWAG_FIXTURE)
    n_first = len(hellaswag.read_eval_file(first))
    stamp = (first.stat().st_ino, first.stat().st_mtime_ns)
    assert hellaswag.prepare(out, HELLASWAG_FIXTURE) == first  # same source: kept as is
    assert (first.stat().st_ino, first.stat().st_mtime_ns) == stamp

    other = _write_jsonl(tmp_path / "two.jsonl", _hellaswag_records(2))
    path = hellaswag.prepare(out, other)
    assert [hellaswag.render_example(r, i) for i, r in enumerate(_hellaswag_records(2))] == hellaswag.read_eval_file(path)
    assert n_first != 2

    _write_jsonl(other, _hellaswag_records(5))  # edited in place
    assert len(hellaswag.read_eval_file(hellaswag.prepare(out, other))) == 5


def test_hellaswag_cli_follows_another_source(tmp_path, capsys):
    out = tmp_path / "eval"
    hellaswag.main(["--out", str(out), "--source", str(HELLASWAG_FIXTURE)])
    hellaswag.main(["--out", str(out), "--source", str(_write_jsonl(tmp_path / "2.jsonl", _hellaswag_records(2)))])
    assert capsys.readouterr().out.splitlines()[-1].startswith("2 examples in ")
    assert len(hellaswag.read_eval_file(out / hellaswag.EVAL_NAME)) == 2


@pytest.mark.parametrize("label", ["true", "1.0", "4", "-1", '"1"'])
def test_a_hellaswag_label_that_is_not_an_integer_0_to_3_names_file_and_line(tmp_path, label):
    path = tmp_path / "h.jsonl"
    good = json.dumps(_hellaswag_records(1)[0])
    path.write_text(good + "\n" + good.replace('"label": 0', f'"label": {label}') + "\n")
    with pytest.raises(hellaswag.EvalFileError, match=rf"h\.jsonl line 2: 'label' is {label}, expected an integer 0-3"):
        hellaswag.prepare(tmp_path / "out", path)


def test_a_missing_local_hellaswag_file_is_not_found(tmp_path):
    from tasks.retry import is_transient

    for source in (tmp_path / "missing.jsonl", "data/missing.jsonl"):
        with pytest.raises(FileNotFoundError, match="missing.jsonl: no such file") as info:
            hellaswag.prepare(tmp_path / "out", source)
        assert "unknown url type" not in str(info.value) and not is_transient(info.value)


def test_an_ending_with_endoftext_is_scored_as_the_text_it_is(tmp_path):
    enc = get_gpt2_encoding()
    records = _hellaswag_records(2)
    records[1]["endings"][2] = "stops here <|endoftext|> and goes on"
    path = hellaswag.prepare(tmp_path / "out", _write_jsonl(tmp_path / "h.jsonl", records))
    example = hellaswag.read_eval_file(path)[1]
    assert example.ending_tokens[2] == enc.encode_ordinary(" stops here <|endoftext|> and goes on")
    assert EOT not in example.ending_tokens[2]
    with pytest.raises(ValueError, match="disallowed special token"):
        enc.encode(" " + records[1]["endings"][2])  # llm.c's script would stop here
