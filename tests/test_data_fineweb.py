"""Document sources: local parquet/jsonl folders, the hub path (faked), and the local parquet cache."""

import itertools
import json
import sys
import types

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data.fineweb import DocumentError, download, iter_documents


@pytest.fixture
def local_source(tmp_path):
    """b.jsonl and a.parquet: read in sorted file order, so a.parquet's documents come first."""
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"id": [1, 2], "text": ["first", "second"]}), src / "a.parquet")
    (src / "b.jsonl").write_text(json.dumps({"text": "third"}) + "\n\n" + json.dumps({"text": "fourth\nline"}) + "\n")
    (src / "notes.txt").write_text("not a source file, ignored")
    return src


def test_local_folder_in_sorted_file_order(local_source):
    assert list(iter_documents(local_source)) == ["first", "second", "third", "fourth\nline"]
    assert list(iter_documents(local_source / "b.jsonl")) == ["third", "fourth\nline"]


def test_limit_spans_files(local_source):
    assert list(iter_documents(local_source, limit=3)) == ["first", "second", "third"]
    assert list(iter_documents(local_source, limit=0)) == []


def test_bad_rows_name_file_and_row(tmp_path):
    pq.write_table(pa.table({"text": ["ok", None]}), tmp_path / "a.parquet")
    with pytest.raises(DocumentError, match=r"a\.parquet row 1: 'text' is NoneType, expected a string"):
        list(iter_documents(tmp_path))
    (tmp_path / "a.parquet").unlink()
    (tmp_path / "b.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(DocumentError, match=r"b\.jsonl line 2: not valid JSON"):
        list(iter_documents(tmp_path))
    (tmp_path / "b.jsonl").write_text('{"body": "no text field"}\n')
    with pytest.raises(DocumentError, match=r"b\.jsonl line 1: expected a JSON object with a 'text' field"):
        list(iter_documents(tmp_path))
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "c.parquet")
    with pytest.raises(DocumentError, match=r"c\.parquet: no 'text' column"):
        list(iter_documents(tmp_path / "c.parquet"))


def test_unknown_source_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such-folder: no such file or folder"):
        list(iter_documents("no-such-folder"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DocumentError, match="expected a .parquet or .jsonl file"):
        list(iter_documents(tmp_path / "empty"))


def test_hub_source_streams_train_split_through_the_same_limit(monkeypatch):
    calls = []

    def load_dataset(path, name=None, split=None, streaming=False, revision=None):
        calls.append((path, name, split, streaming))
        return ({"text": f"doc {i}", "id": i} for i in range(10**9))  # "endless": must be streamed lazily

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    docs = list(iter_documents("HuggingFaceFW/fineweb-edu", config="sample-10BT", limit=3))
    assert docs == ["doc 0", "doc 1", "doc 2"]
    assert calls == [("HuggingFaceFW/fineweb-edu", "sample-10BT", "train", True)]


def test_download_makes_a_resumable_local_parquet_cache(local_source, tmp_path):
    cache = tmp_path / "cache"
    assert download(str(local_source), None, cache, docs_per_file=3) == cache
    assert list(iter_documents(cache)) == list(iter_documents(local_source))
    manifest = json.loads((cache / "manifest.json").read_text())
    assert manifest["num_documents"] == 4
    assert [f["num_documents"] for f in manifest["files"]] == [3, 1]

    # interrupted after the first part (download.json lists the parts written): it is kept, the rest is redone
    first = cache / "part_00000.parquet"
    identity = (first.stat().st_ino, first.stat().st_mtime_ns)
    (cache / "download.json").write_text(json.dumps({**{k: v for k, v in manifest.items() if k != "num_documents"},
                                                     "files": manifest["files"][:1]}))
    (cache / "manifest.json").unlink()
    (cache / "part_00001.parquet").unlink()
    download(str(local_source), None, cache, docs_per_file=3)
    assert (first.stat().st_ino, first.stat().st_mtime_ns) == identity
    assert json.loads((cache / "manifest.json").read_text()) == manifest
    assert not (cache / "download.json").exists()

    # a finished download verifies its parts: a damaged one is redone, the intact ones before it are kept
    second = cache / "part_00001.parquet"
    second.write_bytes(second.read_bytes()[:-1] + b"\0")
    download(str(local_source), None, cache, docs_per_file=3)
    assert (first.stat().st_ino, first.stat().st_mtime_ns) == identity
    assert json.loads((cache / "manifest.json").read_text()) == manifest
    assert list(iter_documents(cache)) == list(iter_documents(local_source))

    with pytest.raises(FileExistsError, match="limit: recorded None, requested 2"):
        download(str(local_source), None, cache, limit=2, docs_per_file=3)
    download(str(local_source), None, cache, limit=2, docs_per_file=3, replace=True)
    assert list(iter_documents(cache)) == ["first", "second"]
    assert sorted(p.name for p in cache.glob("*.parquet")) == ["part_00000.parquet"]


def test_unfinished_download_for_other_settings_is_refused(local_source, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "download.json").write_text(json.dumps({"local": [], "limit": 3, "docs_per_file": 3}))
    with pytest.raises(FileExistsError, match=r"download\.json was written for another input or settings"):
        download(str(local_source), None, cache, limit=None, docs_per_file=3)


def _parquet_with_bytes(path, values: list[bytes], row_group_size: int) -> None:
    """A parquet file whose string column holds `values` as they are, valid UTF-8 or not (pyarrow builds a
    string array from its buffers without checking them, as another writer may have)."""
    offsets = pa.array([0, *itertools.accumulate(len(v) for v in values)], type=pa.int32()).buffers()[1]
    column = pa.Array.from_buffers(pa.string(), len(values), [None, offsets, pa.py_buffer(b"".join(values))])
    pq.write_table(pa.table({"text": column}), path, row_group_size=row_group_size)


def test_invalid_utf8_in_a_jsonl_corpus_names_the_file_line_and_byte_offset(tmp_path):
    """Before: `UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 6090`, no file, no line, and
    a position within Python's read buffer, not the file."""
    path = tmp_path / "c.jsonl"
    lines = [json.dumps({"text": f"document {i} " + "words " * 200}).encode() + b"\n" for i in range(40)]
    bad = b'{"text": "bad \xff\xfe"}\n'
    path.write_bytes(b"".join(lines) + bad)
    offset = sum(map(len, lines)) + bad.index(b"\xff")
    with pytest.raises(DocumentError) as info:
        list(iter_documents(path))
    assert str(info.value).startswith(f"{path} line 41: not UTF-8 text: byte 0xff at byte offset {offset:,} of "
                                      "the file (invalid start byte)"), info.value


def test_invalid_utf8_in_a_parquet_corpus_names_the_file_row_group_row_and_column(tmp_path):
    """Before: pyarrow's `UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 1`, naming nothing."""
    path = tmp_path / "c.parquet"
    _parquet_with_bytes(path, [b"one", b"two", b"three", b"f\xffour"], row_group_size=3)
    with pytest.raises(DocumentError) as info:
        list(iter_documents(path))
    assert str(info.value).startswith(f"{path} row 3 (row group 1, its row 0), column 'text': not UTF-8 text: "
                                      "byte 0xff at byte offset 1 of the value (invalid start byte)"), info.value
