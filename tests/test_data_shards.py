"""llm.c token shards: byte image, worker independence, resume after SIGKILL, validation."""

import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from data import shards
from data.fineweb import DocumentError
from data.shards import ShardError, build_shards, read_shard, shard_num_tokens, write_shard
from data.tokenizer import get_gpt2_encoding

REPO = Path(__file__).resolve().parents[1]


def make_documents(n: int) -> list[str]:
    """Deterministic documents of varied length (a few tokens to ~100)."""
    words = ["alpha", "beta", "gamma", "delta", "the", "of", "and", "naïve", "42", "don't", "!", "\n"]
    return [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range((i * 37) % 90 + 1)) for i in range(n)]


def llmc_shard_bytes(tokens: list[int]) -> bytes:
    """What llm.c's write_datafile writes: 256 int32 header (magic, version, ntok), then uint16 tokens."""
    header = struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253))
    return header + struct.pack(f"<{len(tokens)}H", *tokens)


def expected_shards(documents: list[str], shard_size: int) -> list[list[int]]:
    """The llm.c token stream (EOT before each document) cut into shard_size pieces, the last shorter."""
    enc = get_gpt2_encoding()  # tiktoken's "gpt2", its cache seeded offline
    stream = [t for doc in documents for t in [50256, *enc.encode_ordinary(doc)]]
    return [stream[i : i + shard_size] for i in range(0, len(stream), shard_size)]


def test_bytes_equal_llmc_image(tmp_path):
    documents = [
        "Hello world",
        "The quick brown fox jumps over the lazy dog.",
        "a " * 40,  # ~41 tokens: longer than a shard, so it spans three shards
        "Short one.",
        "Another document\n with  odd   spacing and naïve unicode.",
    ]
    shard_size = 16
    manifest = build_shards(documents, tmp_path, "tiny", shard_size=shard_size, num_workers=1)

    chunks = expected_shards(documents, shard_size)
    assert len(chunks[-1]) < shard_size  # the case of a short last shard is exercised
    names = ["tiny_val_000000.bin"] + [f"tiny_train_{i:06d}.bin" for i in range(1, len(chunks))]
    assert sorted(p.name for p in tmp_path.glob("*.bin")) == sorted(names)
    for name, chunk, record in zip(names, chunks, manifest["shards"]):
        image = llmc_shard_bytes(chunk)
        assert (tmp_path / name).read_bytes() == image
        assert record["file"] == name and record["ntok"] == len(chunk)
        assert record["sha256"] == hashlib.sha256(image).hexdigest()
        assert record["split"] == ("val" if name == names[0] else "train")
    assert manifest["num_tokens"] == sum(map(len, chunks))
    assert manifest["num_documents"] == len(documents)
    assert json.loads((tmp_path / "manifest.json").read_text()) == manifest


def test_document_exactly_filling_a_shard_starts_the_next_shard_fresh(tmp_path):
    enc = get_gpt2_encoding()  # tiktoken's "gpt2", its cache seeded offline
    documents = ["Hello world", "Hello world", "Hello"]  # 3 + 3 + 2 tokens with the EOTs
    assert len(enc.encode_ordinary("Hello world")) + 1 == 3
    manifest = build_shards(documents, tmp_path, "t", shard_size=3, num_workers=1)
    assert [r["ntok"] for r in manifest["shards"]] == [3, 3, 2]
    assert [(r["next_document"], r["next_offset"]) for r in manifest["shards"]] == [(1, 0), (2, 0), (3, 0)]


def test_output_does_not_depend_on_worker_count(tmp_path):
    documents = make_documents(600)  # several tasks of shards.DOCS_PER_TASK documents
    one = build_shards(documents, tmp_path / "one", "w", shard_size=5000, num_workers=1)
    two = build_shards(documents, tmp_path / "two", "w", shard_size=5000, num_workers=2)
    assert one == two
    for record in one["shards"]:
        assert (tmp_path / "one" / record["file"]).read_bytes() == (tmp_path / "two" / record["file"]).read_bytes()


def test_finished_build_is_returned_without_reading_documents(tmp_path):
    manifest = build_shards(make_documents(20), tmp_path, "s", shard_size=300, num_workers=1)

    def must_not_be_read():
        raise AssertionError("documents were read again")
        yield

    assert build_shards(must_not_be_read(), tmp_path, "s", shard_size=300, num_workers=1) == manifest


def test_rerun_with_other_settings_is_refused(tmp_path):
    build_shards(make_documents(5), tmp_path, "s", shard_size=300, num_workers=1)
    with pytest.raises(FileExistsError, match="shard_size: recorded 300, requested 200"):
        build_shards(make_documents(5), tmp_path, "s", shard_size=200, num_workers=1)


# The child builds shards from a generator that, after HANG_AT documents, announces itself and blocks
# forever, so the parent can SIGKILL it while shards are partly written.
CHILD = """
import sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
from tests.test_data_shards import make_documents
from data.shards import build_shards

def documents():
    for i, doc in enumerate(make_documents({n})):
        if i == {hang_at}:
            Path({signal_file!r}).touch()
            time.sleep(600)
        yield doc

build_shards(documents(), {out!r}, "r", shard_size={shard_size}, num_workers=1)
"""


def test_resume_after_sigkill_rewrites_only_unfinished_shards(tmp_path):
    n, shard_size = 700, 2000
    out, signal_file = tmp_path / "out", tmp_path / "hanging"
    script = CHILD.format(repo=str(REPO), n=n, hang_at=500, signal_file=str(signal_file), out=str(out), shard_size=shard_size)
    child = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while not signal_file.exists():
            assert child.poll() is None, "child exited before reaching the kill point"
            assert time.monotonic() < deadline, "child never reached the kill point"
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()

    assert not (out / "manifest.json").exists()
    finished = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.glob("*.bin")}
    assert len(finished) >= 2  # it was killed mid-way: some shards done...
    progress = json.loads((out / shards.PROGRESS).read_text())
    assert [r["file"] for r in progress["shards"]] == sorted(finished, key=lambda f: f[-10:])

    resumed = build_shards(make_documents(n), out, "r", shard_size=shard_size, num_workers=1)
    reference = build_shards(make_documents(n), tmp_path / "reference", "r", shard_size=shard_size, num_workers=1)
    assert resumed == reference
    assert len(resumed["shards"]) > len(finished)  # ...and some were still to do
    for name, identity in finished.items():  # finished shards were not rewritten
        assert ((out / name).stat().st_ino, (out / name).stat().st_mtime_ns) == identity
    for record in resumed["shards"]:
        assert (out / record["file"]).read_bytes() == (tmp_path / "reference" / record["file"]).read_bytes()
    assert not (out / shards.PROGRESS).exists()


def test_read_shard_round_trip_and_validation(tmp_path):
    path = tmp_path / "x.bin"
    write_shard(path, [1, 2, 65535])
    assert read_shard(path).tolist() == [1, 2, 65535]

    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ShardError, match=r"x\.bin: header says 3 tokens, so 1030 bytes, but the file has 1029"):
        shard_num_tokens(path)
    path.write_bytes(struct.pack("<256i", 20240522, 1, 0, *([0] * 253)))
    with pytest.raises(ShardError, match=r"x\.bin: header starts 20240522, 1; an llm.c token shard starts 20240520"):
        read_shard(path)
    with pytest.raises(ShardError, match="not found"):
        read_shard(tmp_path / "missing.bin")
    with pytest.raises(ValueError, match=r"\[0, 65535\]"):
        write_shard(path, [70000])


@pytest.mark.parametrize("module", ["data.shards", "data.fineweb", "data.hellaswag"])
def test_clis_have_help(module, capsys):
    main = __import__(module, fromlist=["main"]).main
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "--out" in capsys.readouterr().out


def test_cli_builds_shards_from_a_local_folder(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    documents = make_documents(12)
    (src / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
    shards.main(["--source", str(src), "--out", str(tmp_path / "out"), "--name", "cli", "--shard-size", "100",
                 "--limit", "10", "--workers", "1"])  # fmt: skip
    chunks = expected_shards(documents[:10], 100)
    files = sorted((tmp_path / "out").glob("cli_*.bin"))
    assert [read_shard(f).tolist() for f in sorted(files, key=lambda f: f.name[-10:])] == chunks
    assert os.path.exists(tmp_path / "out" / "manifest.json")


def test_bad_document_fails_naming_it_and_keeps_finished_shards(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    lines = [json.dumps({"text": d}) for d in make_documents(300)] + ['{"text": null}']
    (src / "docs.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    with pytest.raises(DocumentError, match=r"docs\.jsonl line 301: 'text' is NoneType"):
        shards.build_shards_from_source(src, out, "bad", shard_size=2000, num_workers=1)
    progress = json.loads((out / shards.PROGRESS).read_text())
    assert progress["shards"] and not (out / "manifest.json").exists()
    for record in progress["shards"]:  # what was written is complete and listed
        assert hashlib.sha256((out / record["file"]).read_bytes()).hexdigest() == record["sha256"]


@pytest.mark.parametrize("module", ["data.shards", "data.fineweb"])
def test_an_empty_corpus_is_refused_naming_it_and_writes_no_manifest(tmp_path, module):
    """0 documents is an error where it is found (tokenize, download), not a 0-shard success that training
    later reports as "run the tokenize stage"."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", module, "--source", str(empty), "--out", str(out)], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert f"EmptySource: {empty} holds no documents: nothing to tokenize" in result.stderr, result.stderr[-2000:]
    assert not (out / "manifest.json").exists()


def test_invalid_utf8_in_a_corpus_ends_the_cli_with_one_error_line_naming_file_line_and_offset(tmp_path):
    """Before: `error: UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 23: invalid start byte`."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_bytes(b'{"text": "fine"}\n{"text": "bad \xff\xfe"}\n')
    command = [sys.executable, "-m", "data.shards", "--source", str(corpus), "--out", str(tmp_path / "out")]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        f"error: DocumentError: {corpus} line 2: not UTF-8 text: byte 0xff at byte offset 31 of the file (invalid "
        "start byte); save the input as UTF-8, or remove the bad bytes"), result.stderr[-2000:]
