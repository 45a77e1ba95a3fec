"""Training runs through the real pipeline (the suite's Prefect server, the smoke deployment's config):
verified checkpoints, the run directory's owner, starting from existing weights, scheduled evaluation.

One module-scoped server and smoke run are shared; each test leaves the run's final checkpoint valid.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tasks.common import run_artifact_key
from tests.fixtures.corruptions import CORRUPTIONS
from tests.fixtures.processes import wait_for
from tests.fixtures.train.tiny import read_metrics
from tests.test_pipeline_flows import run_flow, smoke_params, states, task_runs, tensorboard_scalars

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke(prefect_server):
    from flows.config import check_settings
    from flows.pipeline import gpt2_pretrain

    params = smoke_params(prefect_server / "artifacts")
    _, records = run_flow(gpt2_pretrain, **params)
    assert isinstance(records, dict), f"smoke pipeline failed: {records!r}"
    return params, check_settings(params), records


def artifacts(key: str, flow_run_id) -> list:
    """The artifacts of a flow run under `key` (earlier runs may have made some under the same key)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[key]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_a_corrupt_final_checkpoint_is_never_recorded_and_training_falls_back(smoke, name):
    from flows.pipeline import gpt2_pretrain

    file_name, corrupt = CORRUPTIONS[name]
    params, config, first = smoke
    final = Path(first["train"].checkpoint.path)
    corrupt(final / file_name)

    flow_run_id, records = run_flow(gpt2_pretrain, **params)
    assert isinstance(records, dict), f"the pipeline failed: {records!r}"
    assert states(flow_run_id)["train"] == "Completed"
    (train_run,) = task_runs(flow_run_id)["train"]
    assert train_run.run_count == 1  # no failed attempts on the corrupt checkpoint
    summary = json.loads((Path(records["train"].run_dir) / "summary.json").read_text())
    assert summary["start_step"] == config.checkpoint_every  # the previous checkpoint, not the corrupt one
    from gpt2.checkpoint import COMPLETE_MARKER, verify_checkpoint
    from gpt2.run_dir import RunDir

    run_dir = RunDir(records["train"].run_dir)
    assert len(records["train"].rejected_checkpoints) == 1
    assert f"{final / file_name}" in records["train"].rejected_checkpoints[0]
    record = records["train"].checkpoint
    assert record.path == str(final) and record.step == config.max_steps
    marker = verify_checkpoint(record.path)  # what is recorded verifies, file by file
    recorded = {Path(f.path).name: f.sha256 for f in record.files}
    assert recorded.pop(COMPLETE_MARKER)  # the marker is recorded too: a checkpoint without it is never served
    assert recorded == {n: e["sha256"] for n, e in marker["files"].items()}

    (artifact,) = artifacts(run_artifact_key("train-summary", run_dir.root), flow_run_id)
    assert "failed verification" in artifact.data and str(final) in artifact.data


def test_scheduled_evaluation_files_each_run_even_when_checkpoints_are_equal(smoke, tmp_path):
    from flows.pipeline import gpt2_evaluate
    from gpt2.checkpoint import list_checkpoints

    _, _, first = smoke
    runs_dir = tmp_path / "runs"
    original = Path(first["train"].run_dir)
    for name in ("run-a", "run-b"):  # two runs whose checkpoints hold the same bytes
        shutil.copytree(original, runs_dir / name, ignore=shutil.ignore_patterns("evaluations", "tensorboard", "LOCK"))

    flow_run_id, rows = run_flow(gpt2_evaluate, str(runs_dir))
    steps = [step for step, _ in list_checkpoints(runs_dir / "run-a")]
    assert sorted((r["run"], r["step"]) for r in rows) == [(run, s) for run in ("run-a", "run-b") for s in steps]
    for name in ("run-a", "run-b"):
        run_dir = runs_dir / name
        for step in steps:
            entry = json.loads((run_dir / "evaluations" / f"step_{step:08d}.json").read_text())
            assert entry["checkpoint"].startswith(str(run_dir)), entry["checkpoint"]
        assert [s for s, _ in tensorboard_scalars(run_dir, "eval/val_loss")] == steps, name


def test_scheduled_evaluation_skips_a_checkpoint_that_fails_verification(smoke, tmp_path):
    """docs/pipeline.md: the scan evaluates every checkpoint that verifies and files nothing for one that
    does not (here the final one, 1 KiB of state.safetensors overwritten: same size, so only its hash tells), with a
    warning naming it and a table row saying why; the scan itself completes."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    from flows.pipeline import gpt2_evaluate
    from gpt2.checkpoint import list_checkpoints

    file_name, corrupt = CORRUPTIONS["state.safetensors overwritten (1 KiB)"]
    _, _, first = smoke
    run_dir = tmp_path / "runs" / "damaged"
    shutil.copytree(Path(first["train"].run_dir), run_dir, ignore=shutil.ignore_patterns("evaluations", "tensorboard", "LOCK"))
    (*good, (final_step, final)) = list_checkpoints(run_dir)
    corrupt(final / file_name)

    flow_run_id, rows = run_flow(gpt2_evaluate, str(run_dir.parent))
    assert isinstance(rows, list), f"the scan failed: {rows!r}"
    assert [r["step"] for r in rows if not r["skipped"]] == [step for step, _ in good] and good
    assert [r["step"] for r in rows if r["skipped"]] == [final_step]
    assert not (run_dir / "evaluations" / f"step_{final_step:08d}.json").exists()
    assert [s for s, _ in tensorboard_scalars(run_dir, "eval/val_loss")] == [step for step, _ in good]

    def warning_logged() -> list[str]:  # the server receives run logs in batches, shortly after
        with get_client(sync_client=True) as client:
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
        return [log.message for log in logs if "not evaluated" in log.message and str(final) in log.message]
    assert wait_for(warning_logged, timeout_s=30)


def test_a_run_starts_from_existing_weights_and_records_their_identity(smoke, tmp_path):
    """init_from an exported Hugging Face directory: the init stage records its files' hashes, and the first
    training step's loss is that model's loss on the first batch."""
    from common.files import sha256_file
    from data.loader import DistributedDataLoader
    from flows.pipeline import gpt2_pretrain
    from gpt2.hf import export_hf
    from gpt2.model import GPT
    from gpt2.config import parse_model_spec

    params, config, first = smoke
    weights = GPT.create(parse_model_spec(config.model), seed=1234)
    hf_dir = export_hf(weights, tmp_path / "hf")
    flow_run_id, records = run_flow(gpt2_pretrain, **{**params, "init_from": str(hf_dir), "run_name": "smoke-from-hf"})
    assert isinstance(records, dict), f"the pipeline failed: {records!r}"
    init = records["init"]
    assert (init.source, init.path) == ("hf", str(hf_dir.resolve()))
    assert {Path(f.path).name: f.sha256 for f in init.files} == {
        name: sha256_file(hf_dir / name) for name in ("config.json", "model.safetensors")}

    # the first batch of the training order (llm.c's, rank 0 of 1), as data.loader serves it
    train_shards = str(Path(records["tokenize"].out_dir) / "*_train_*.bin")
    x, y = DistributedDataLoader(train_shards, config.batch_size, config.seq_len).next_batch()
    with torch.no_grad():
        _, expected = weights(x, y)
    first_loss = read_metrics(records["train"].run_dir)[0]["loss"]
    assert first_loss == pytest.approx(expected.item(), rel=1e-5)

    # progress followed the metrics file to the end
    (progress,) = artifacts(run_artifact_key("train-progress", Path(records["train"].run_dir)), flow_run_id)
    assert float(progress.data) == 100.0
