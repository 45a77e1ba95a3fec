"""A result is filed with the identity of the data it came from, without a Prefect server: the cache key of a stage
holds what its run-time inputs resolve to (a run directory, a source folder, a local file), and the scheduled
scan scores a checkpoint only on the val shards and HellaSwag file its run recorded."""

from __future__ import annotations

import json
import types
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.test_pipeline_units import _save_tiny_checkpoint

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "pipeline"


@pytest.fixture
def store(tmp_path):
    from prefect.filesystems import LocalFileSystem
    from prefect.results import ResultStore

    return ResultStore(result_storage=LocalFileSystem(basepath=str(tmp_path / "results")))


def key_of(task, store, **inputs) -> str | None:
    """The stage's cache key for these inputs, as Prefect asks its policy for it before a run."""
    return task.cache_policy.compute_key(types.SimpleNamespace(result_store=store), inputs, {})


# ---------------------------------------------------------------------------------------------------------
# cache keys hold what an input resolves to, not its name


def test_init_from_a_run_directory_keys_on_its_newest_checkpoint_that_verifies(tmp_path, store):
    from gpt2.checkpoint import TENSORS_FILE
    from tasks.init import init_model
    from tests.fixtures.train.tiny import TINY_MODEL

    run_dir = tmp_path / "run"
    _save_tiny_checkpoint(run_dir, 20, seed=1)
    inputs = dict(model=TINY_MODEL, seed=42, out_dir=str(tmp_path / "init"), init_from=str(run_dir))
    at_20 = key_of(init_model, store, **inputs)
    assert at_20 is not None and key_of(init_model, store, **inputs) == at_20  # nothing changed: the same key

    newer = _save_tiny_checkpoint(run_dir, 22, seed=2)  # the run trained on
    at_22 = key_of(init_model, store, **inputs)
    assert at_22 != at_20, "init_from=<run dir> kept its key after the run gained a newer checkpoint"

    state = newer / TENSORS_FILE  # the newer checkpoint no longer verifies: the run stands for step 20 again
    state.write_bytes(bytes(b ^ 0xFF for b in state.read_bytes()))
    assert key_of(init_model, store, **inputs) == at_20


def test_a_local_corpus_folder_keys_on_the_files_it_holds(tmp_path, store):
    from tasks.download import download_documents

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text('{"text": "one document"}\n')
    inputs = dict(source=str(corpus), config=None, out_dir=str(tmp_path / "documents"), limit=None)
    before = key_of(download_documents, store, **inputs)
    (corpus / "b.jsonl").write_text('{"text": "another document"}\n')
    added = key_of(download_documents, store, **inputs)
    (corpus / "a.jsonl").write_text('{"text": "one document, edited"}\n')
    edited = key_of(download_documents, store, **inputs)
    assert len({before, added, edited}) == 3, "a corpus folder's key did not follow the files in it"


def test_a_local_hellaswag_file_keys_on_its_bytes_even_through_a_link(tmp_path, store):
    from tasks.hellaswag import prepare_hellaswag

    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    lines = (FIXTURES / "hellaswag_mini.jsonl").read_text().splitlines(keepends=True)
    one.write_text("".join(lines[:3]))
    two.write_text("".join(lines[:4]))
    link = tmp_path / "hellaswag.jsonl"
    link.symlink_to(one)
    inputs = dict(source=str(link), out_dir=str(tmp_path / "eval"))
    first = key_of(prepare_hellaswag, store, **inputs)
    link.unlink()
    link.symlink_to(two)  # the same name, other examples
    assert key_of(prepare_hellaswag, store, **inputs) != first


def test_an_input_that_cannot_be_resolved_runs_the_stage_uncached(tmp_path, store):
    """The stage then meets the error itself and fails with its own message; the key computation raises nothing."""
    from tasks.init import init_model
    from tests.fixtures.train.tiny import TINY_MODEL

    assert key_of(init_model, store, model=TINY_MODEL, seed=42, out_dir=str(tmp_path / "init"),
                  init_from=str(tmp_path / "missing")) is None
