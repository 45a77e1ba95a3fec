"""A result is filed with the identity of the data it came from, without a Prefect server: the cache key of a stage
holds what its run-time inputs resolve to (a run directory, a source folder, a local file), and the scheduled
scan scores a checkpoint only on the val shards and HellaSwag file its run recorded."""

from __future__ import annotations

import hashlib
import json
import types
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


# ---------------------------------------------------------------------------------------------------------
# a result is filed with, and scored on, the data its run recorded


def _shards(folder: Path, documents: list[str]):
    """A shard folder built from `documents` (rebuilt in place when it holds another build), and its record."""
    from data.shards import build_shards
    from tasks.tokenize import ShardsRecord

    build_shards(documents, folder, "ds", shard_size=64, num_workers=1, replace=True, source={"documents": documents})
    return ShardsRecord.from_manifest(folder)


def _eval_file(folder: Path, examples: int):
    """The HellaSwag eval file of the fixture's first `examples` examples (rewritten in place), and its record."""
    from data.hellaswag import prepare
    from tasks.hellaswag import EvalFileRecord

    source = folder.parent / f"hellaswag_{examples}.jsonl"
    source.write_text("".join((FIXTURES / "hellaswag_mini.jsonl").read_text().splitlines(keepends=True)[:examples]))
    return EvalFileRecord.of(prepare(folder, source))


CORPUS = [f"Document {i} tells of the river, the hill and the road to town number {i}." * 3 for i in range(12)]
OTHER_CORPUS = [f"Another text, {i}: numbers and letters in another order entirely, {i * 7}." * 3 for i in range(12)]


@pytest.fixture
def trained_run(tmp_path):
    """A run directory with checkpoints at steps 10 and 20 that recorded its val shards and HellaSwag file, as the
    train stage does; (run dir, its data identity)."""
    from gpt2.run_dir import RunDir
    from tasks.evaluate import data_identity
    from tests.fixtures.train.tiny import TINY_MODEL

    run_dir = RunDir(tmp_path / "runs" / "r" / "0123456789ab")
    for step in (10, 20):
        _save_tiny_checkpoint(run_dir.root, step, seed=step)
    run_dir.config.write_text(json.dumps({"model": TINY_MODEL}))
    data = data_identity(_shards(tmp_path / "shards", CORPUS), _eval_file(tmp_path / "eval", 8))
    run_dir.data_identity.write_text(json.dumps(data))
    return run_dir, data


def test_the_data_a_run_recorded_is_named_where_it_changed_or_is_gone(trained_run, tmp_path):
    from tasks.evaluate import DataChanged, data_as_recorded, data_identity, recorded_data

    run_dir, data = trained_run
    shards, hellaswag = data_as_recorded(run_dir, recorded_data(run_dir))
    assert data_identity(shards, hellaswag) == data

    _shards(tmp_path / "shards", OTHER_CORPUS)  # the same dataset name, rebuilt from another corpus
    with pytest.raises(DataChanged, match=r"the val shards changed since the run was trained on them: .*manifest.json "
                                          r"lists ds_val_000000.bin sha256 \w{16} where the run recorded \w{16}"):
        data_as_recorded(run_dir, recorded_data(run_dir))
    _shards(tmp_path / "shards", CORPUS)  # built again from the run's corpus: the same content, usable again
    data_as_recorded(run_dir, recorded_data(run_dir))

    _eval_file(tmp_path / "eval", 3)
    with pytest.raises(DataChanged, match=r"the HellaSwag file changed since the run was trained with it: "
                                          rf"{tmp_path / 'eval' / 'hellaswag_val.bin'} has sha256"):
        data_as_recorded(run_dir, recorded_data(run_dir))
    _eval_file(tmp_path / "eval", 8)

    (tmp_path / "shards" / "manifest.json").unlink()
    with pytest.raises(DataChanged, match=rf"are gone: {tmp_path / 'shards' / 'manifest.json'} is missing"):
        data_as_recorded(run_dir, recorded_data(run_dir))

    run_dir.data_identity.unlink()
    with pytest.raises(DataChanged, match="data_identity.json is missing: the run recorded no identity"):
        data_as_recorded(run_dir, recorded_data(run_dir))


def test_an_evaluation_is_filed_with_its_data_and_counts_only_for_that_data(trained_run, tmp_path):
    from tasks.evaluate import file_evaluation, read_evaluation
    from tasks.init import CheckpointRecord
    from tests.fixtures.train.tiny import TINY_MODEL

    run_dir, data = trained_run
    checkpoint = CheckpointRecord.of(run_dir.checkpoint(10), TINY_MODEL)
    file_evaluation(checkpoint, 5.25, None, data)
    entry = json.loads(run_dir.evaluation(10).read_text())
    assert entry["data"] == data
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    assert data["val_shards"]["sha256"] == {s["file"]: s["sha256"] for s in manifest["shards"] if s["split"] == "val"}
    eval_file = (tmp_path / "eval" / "hellaswag_val.bin").read_bytes()
    assert data["hellaswag"]["sha256"] == hashlib.sha256(eval_file).hexdigest()
    assert read_evaluation(run_dir, 10, data)["val_loss"] == 5.25

    other = {**data, "val_shards": {**data["val_shards"], "sha256": {"ds_val_000000.bin": "0" * 64}}}
    assert read_evaluation(run_dir, 10, other) is None  # scored on other data: not this run's evaluation
    assert read_evaluation(run_dir, 10, None) is None  # a run that recorded no data has no evaluation
    del entry["data"]
    run_dir.evaluation(10).write_text(json.dumps(entry))  # a ledger entry that names no data
    assert read_evaluation(run_dir, 10, data) is None


def test_the_scan_skips_each_checkpoint_of_a_run_whose_data_changed_and_keeps_its_earlier_results(trained_run,
                                                                                                  tmp_path):
    """Step 10 was evaluated on the run's data; then the dataset was rebuilt from another corpus. The scan reports
    step 10's earlier result and step 20 skipped with the reason, and files nothing for step 20 (the evaluate
    stage is never reached: no server is needed; the scan's progress, with no API to take it, is dropped)."""
    from prefect.logging.loggers import disable_run_logger

    from tasks.evaluate import file_evaluation, scan_runs
    from tasks.init import CheckpointRecord
    from tests.fixtures.outage import api_away
    from tests.fixtures.train.tiny import TINY_MODEL

    run_dir, data = trained_run
    file_evaluation(CheckpointRecord.of(run_dir.checkpoint(10), TINY_MODEL), 5.25, None, data)
    _shards(tmp_path / "shards", OTHER_CORPUS)
    with disable_run_logger(), api_away():
        rows = scan_runs(tmp_path / "runs")
    assert [(r["step"], r["val_loss"], r["evaluated_now"]) for r in rows] == [(10, 5.25, False), (20, None, False)]
    assert rows[0]["skipped"] is None
    assert rows[1]["skipped"].startswith("DataChanged: the val shards changed since the run was trained on them")
    assert not run_dir.evaluation(20).exists()
