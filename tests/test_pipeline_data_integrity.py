"""The data stages against the suite's Prefect server: inputs are identified by content, outputs are
verified, and a mistyped source fails at once. Only download, tokenize and hellaswag run (no training),
so the module takes seconds after the server is up. Tests run in file order and share one artifacts root.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from test_pipeline_flows import run_flow, smoke_params, states, task_runs

from flows.config import check_settings
from tasks.common import artifact_key

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "fixtures" / "pipeline" / "corpus.jsonl"
HELLASWAG = REPO / "tests" / "fixtures" / "pipeline" / "hellaswag_mini.jsonl"


@pytest.fixture(scope="module")
def data_params(prefect_server):
    """The smoke deployment's parameters, reading a 100-document copy of the corpus that tests edit, into a
    dataset of the module's own name (its artifacts' keys are the module's alone on the suite's server)."""
    corpus = prefect_server / "corpus.jsonl"
    corpus.write_text("".join(CORPUS.read_text().splitlines(keepends=True)[:100]))
    return smoke_params(prefect_server / "data-artifacts", source=str(corpus), dataset="data-integrity")


def manifest(record) -> dict:
    return json.loads((Path(record.out_dir) / "manifest.json").read_text())


def test_edited_corpus_reruns_download_and_tokenize_then_nothing_changed_is_all_cached(data_params):
    from flows.pipeline import tokenize_flow

    _, first = run_flow(tokenize_flow, **data_params)
    assert manifest(first["tokenize"])["num_documents"] == 100

    Path(data_params["source"]).write_text(CORPUS.read_text())  # edited in place: 150 documents
    flow_run_id, records = run_flow(tokenize_flow, **data_params)
    assert states(flow_run_id) == {"download": "Completed", "tokenize": "Completed"}
    assert manifest(records["tokenize"])["num_documents"] == 150
    assert records["tokenize"].num_tokens > first["tokenize"].num_tokens

    flow_run_id, again = run_flow(tokenize_flow, **data_params)
    assert states(flow_run_id) == {"download": "Cached", "tokenize": "Cached"}
    assert again["tokenize"] == records["tokenize"]


def test_a_file_added_to_a_corpus_folder_reruns_download_and_tokenize(data_params, tmp_path):
    from flows.pipeline import tokenize_flow

    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.jsonl").write_text("".join(CORPUS.read_text().splitlines(keepends=True)[:30]))
    config = {**data_params, "source": str(folder), "dataset": "folder"}
    _, first = run_flow(tokenize_flow, **config)
    assert manifest(first["tokenize"])["num_documents"] == 30
    (folder / "b.jsonl").write_text("".join(CORPUS.read_text().splitlines(keepends=True)[30:50]))
    flow_run_id, records = run_flow(tokenize_flow, **config)
    assert states(flow_run_id) == {"download": "Completed", "tokenize": "Completed"}
    assert manifest(records["tokenize"])["num_documents"] == 50


def test_changed_shard_size_rebuilds_the_shards(data_params):
    from flows.pipeline import tokenize_flow

    config = {**data_params, "shard_size": 3000}
    flow_run_id, records = run_flow(tokenize_flow, **config)
    assert isinstance(records, dict), records
    assert states(flow_run_id) == {"download": "Cached", "tokenize": "Completed"}
    shards = manifest(records["tokenize"])["shards"]
    assert [s["ntok"] for s in shards[:-1]] == [3000] * (len(shards) - 1)
    assert sorted(p.name for p in Path(records["tokenize"].out_dir).glob("*.bin")) == sorted(s["file"] for s in shards)


def test_changed_hellaswag_source_writes_the_new_eval_file(data_params, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    from data.hellaswag import iter_jsonl, read_eval_file, render_example
    from flows.pipeline import hellaswag_flow

    _, first = run_flow(hellaswag_flow, **data_params)
    assert first["hellaswag"].num_examples == 8
    three = tmp_path / "three.jsonl"
    three.write_text("".join(HELLASWAG.read_text().splitlines(keepends=True)[:3]))
    flow_run_id, records = run_flow(hellaswag_flow, **{**data_params, "hellaswag_source": str(three)})
    assert states(flow_run_id) == {"hellaswag": "Completed"}
    assert records["hellaswag"].num_examples == 3
    assert read_eval_file(records["hellaswag"].path) == [render_example(r, i) for i, r in enumerate(iter_jsonl(three))]
    digest = hashlib.sha256(three.read_bytes()).hexdigest()
    assert records["hellaswag"].source_sha256 == digest
    key = artifact_key("hellaswag-eval-file", folder=check_settings({**data_params, "hellaswag_source": str(three)})
                       .hellaswag_dir)
    with get_client(sync_client=True) as client:
        (artifact,) = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[key]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    assert str(three) in artifact.data and digest in artifact.data and "3 examples" in artifact.data


def test_a_mistyped_local_source_fails_at_once_naming_the_path(data_params, monkeypatch):
    import flows.pipeline
    from data.fineweb import SourceNotFound

    monkeypatch.setattr(flows.pipeline, "download_documents",
                        flows.pipeline.download_documents.with_options(retry_delay_seconds=0, retry_jitter_factor=None))
    flow_run_id, error = run_flow(flows.pipeline.download_flow,
                                     **{**data_params, "source": "work/mydocs", "dataset": "typo"})
    assert isinstance(error, SourceNotFound) and "work/mydocs: no such file or folder" in str(error)
    (run,) = task_runs(flow_run_id)["download"]
    assert (run.state.name, run.run_count) == ("Failed", 1)


def test_a_same_size_corrupted_shard_is_rebuilt_alone(data_params):
    from flows.pipeline import tokenize_flow

    _, records = run_flow(tokenize_flow, **data_params)
    shards = manifest(records["tokenize"])["shards"]
    out = Path(records["tokenize"].out_dir)
    target = out / shards[1]["file"]
    good = target.read_bytes()
    target.write_bytes(good[:-2] + bytes([good[-2] ^ 0xFF, good[-1]]))
    others = {s["file"]: (out / s["file"]).stat().st_mtime_ns for s in shards if s["file"] != target.name}
    flow_run_id, _ = run_flow(tokenize_flow, **data_params)
    assert states(flow_run_id) == {"download": "Cached", "tokenize": "Completed"}
    assert target.read_bytes() == good
    assert {f: (out / f).stat().st_mtime_ns for f in others} == others


def test_tokenize_reports_progress_as_a_prefect_progress_artifact(data_params):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.pipeline import tokenize_flow

    run_flow(tokenize_flow, **{**data_params, "shard_size": 5000})  # a rebuild: documents tokenized
    settings = check_settings(data_params)
    key = artifact_key("tokenize-progress", settings.dataset, folder=settings.shards_dir)
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    assert artifacts and {a.type for a in artifacts} == {"progress"}
    assert {a.data for a in artifacts} == {100.0}  # every tokenize run of this module finished


def test_a_hub_download_records_its_resolved_revision_and_the_files_sha256_and_reports_progress(
        data_params, monkeypatch):
    """The hub is a replica over HTTP (tests/fixtures/hub_replica.py); the clients and the stage are the real ones."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    from flows.pipeline import download_flow
    from tests.fixtures.hub_replica import HubReplica, dataset_repo, point_clients_at

    texts = [json.loads(line)["text"] for line in CORPUS.read_text().splitlines()]
    replica = HubReplica()
    files = dataset_repo(texts, "small", files=3)
    sha = replica.add_commit("acme/corpus", files)
    point_clients_at(replica.start(), monkeypatch)
    try:
        params = {**data_params, "source": "hf://datasets/acme/corpus", "source_config": "small", "limit": 60,
                  "dataset": "hub"}
        flow_run_id, records = run_flow(download_flow, **params)
    finally:
        replica.stop()
    record = records["download"]
    first_two = [files[p] for p in sorted(files) if p.endswith(".parquet")][:2]  # 50 documents each
    assert json.loads(record.identity) == {"hub": "acme/corpus", "config": "small", "revision": sha, "limit": 60,
                                           "sha256": [hashlib.sha256(b).hexdigest() for b in first_two]}
    assert record.num_documents == 100
    from data.fineweb import iter_documents

    assert list(iter_documents(record.path, limit=60)) == texts[:60]
    progress_key = artifact_key("download-progress", "hub", folder=check_settings(params).documents_dir)
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[progress_key]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    assert [a.data for a in artifacts] == [100.0]
