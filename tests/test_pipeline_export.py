"""The export stage against the suite's Prefect server: a Hugging Face directory, cached by content."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from tasks.common import run_artifact_key

transformers = pytest.importorskip("transformers")

TINY_GPT2 = "n_layer=2,n_head=2,n_embd=32,block_size=64,vocab_size=50257"


def _export_flow():
    from prefect import flow

    from tasks.export import export_hf

    @flow(name="export-test")
    def export_flow(checkpoint):
        state = export_hf(checkpoint, return_state=True)
        return state.name, state.result()

    return export_flow


def _artifact(key: str, settle_s: float = 30.0):
    """The latest artifact with `key`; the server records artifacts asynchronously."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    deadline = time.monotonic() + settle_s
    with get_client(sync_client=True) as client:
        while True:
            found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
            if found or time.monotonic() > deadline:
                return found[-1] if found else None
            time.sleep(0.5)


def test_export_stage_writes_a_loadable_directory_cached_by_content(prefect_server):
    from gpt2.checkpoint import write_initial_checkpoint
    from gpt2.weights import load_model
    from tasks.init import CheckpointRecord

    run_dir = prefect_server / "runs" / "tiny"
    checkpoint = CheckpointRecord.of(write_initial_checkpoint(run_dir, TINY_GPT2, seed=5), TINY_GPT2)
    export_flow = _export_flow()

    state, record = export_flow(checkpoint)
    assert state == "Completed"
    out = Path(record.path)
    assert out == (run_dir / "hf_step_00000000").resolve() and record.step == 0
    assert {Path(f.path).name for f in record.files} >= {"model.safetensors", "config.json", "tokenizer.json"}

    hf = transformers.GPT2LMHeadModel.from_pretrained(out, local_files_only=True).eval()
    ours, _ = load_model(checkpoint.path)
    idx = torch.randint(0, 50257, (1, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=idx).logits, ours(idx)[0], rtol=1e-5, atol=1e-5)
    artifact = _artifact(run_artifact_key("hf-export", run_dir))
    assert artifact is not None and f'GPT2LMHeadModel.from_pretrained("{out}")' in artifact.data

    # same checkpoint content: from cache, nothing rewritten
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    state, again = export_flow(checkpoint)
    assert (state, again) == ("Cached", record)
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime

    # a damaged export is not served from cache: it is written again
    (out / "model.safetensors").write_bytes(b"truncated")
    state, redone = export_flow(checkpoint)
    assert state == "Completed"
    assert {f.path: f.sha256 for f in redone.files} == {f.path: f.sha256 for f in record.files}  # same bytes
    assert all(f.problem() is None for f in redone.files)
    transformers.GPT2LMHeadModel.from_pretrained(out, local_files_only=True)


def test_export_code_covers_the_tokenizer_and_the_weight_mapping():
    from tasks.cache import code_closure
    from tasks.export import EXPORT_CODE

    assert {"gpt2.export_hf", "gpt2.hf", "data.tokenizer", "gpt2.checkpoint"} <= set(code_closure(EXPORT_CODE))


def test_an_export_leaves_a_file_the_train_stage_is_writing_beside_it(prefect_server):
    """The train stage writes the run's loss curve (`loss_curve.png.<pid>.tmp`, then renamed) after its trainer
    let the run directory's lock go, so a run started twice at once may export while the other start plots.
    Before: the export held the run directory's lock as a plain folder's (tasks.common.writing), which sweeps
    the folder's `*.tmp` files as an interrupted writer's, and deleted the curve being written."""
    import os

    from common.files import temporary_name
    from gpt2.checkpoint import write_initial_checkpoint
    from gpt2.run_dir import RunDir
    from tasks.init import CheckpointRecord

    run_dir = RunDir(prefect_server / "runs" / "plotting")
    checkpoint = CheckpointRecord.of(write_initial_checkpoint(run_dir.root, TINY_GPT2, seed=6), TINY_GPT2)
    being_written = run_dir.loss_curve.with_name(temporary_name(run_dir.loss_curve.name, os.getpid()))
    being_written.write_bytes(b"the first half of a PNG")

    state, record = _export_flow()(checkpoint)
    assert state == "Completed" and Path(record.path) == run_dir.hf_export(0).resolve()
    assert being_written.read_bytes() == b"the first half of a PNG"
