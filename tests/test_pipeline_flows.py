"""The pipeline's flows against the suite's Prefect server, offline, on the smoke deployment's config.

One module-scoped server and one smoke run are shared by the tests below, which run in file order:
each leaves the artifacts valid for the next.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
SHARD_HEADER_BYTES = 1024
EOT = 50256


def smoke_params(root: Path, **changes) -> dict:
    """The `gpt2-pretrain/smoke` deployment's parameters (prefect.yaml), with outputs under `root`."""
    params = yaml.safe_load((REPO / "prefect.yaml").read_text())["definitions"]["smoke"]
    params = {**params, "root": str(root), **changes}
    for key in ("source", "hellaswag_source"):
        params[key] = str(REPO / params[key])
    return params


def run_flow(flow_fn, *args, **kwargs):
    """(flow run id, result or exception) of a flow called in this process."""
    state = flow_fn(*args, return_state=True, **kwargs)
    return state.state_details.flow_run_id, state.result(raise_on_failure=False)


def task_runs(flow_run_id) -> dict[str, list]:
    """Task runs of a flow run from the Prefect API, by task name (`tokenize`, `evaluate`, ...)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    by_task: dict[str, list] = {}
    for run in runs:
        by_task.setdefault(run.name.split("-")[0], []).append(run)  # run names: `tokenize-1a2`, `evaluate-step-10`
    return by_task


def states(flow_run_id, settle_s: float = 1.0, max_wait_s: float = 30.0) -> dict[str, str]:
    """Final state name of each task of a flow run: `Completed` (it ran), `Cached` or `Failed`.

    The server records task-run states from events, asynchronously: read until two reads `settle_s`
    apart agree.
    """
    def read() -> dict[str, str]:
        return {name: runs[-1].state.name for name, runs in task_runs(flow_run_id).items() if len(runs) == 1}

    deadline = time.monotonic() + max_wait_s
    previous = read()
    while True:
        time.sleep(settle_s)
        current = read()
        if current == previous or time.monotonic() > deadline:
            return current
        previous = current


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tensorboard_scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of every event of `tag` in all of a run's TensorBoard event files."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util.tensor_util import make_ndarray

    def number(value) -> float:  # torch writes scalars as tensors, older writers as simple_value
        return float(make_ndarray(value.tensor)) if value.HasField("tensor") else value.simple_value

    events = []
    for path in sorted((run_dir / "tensorboard").glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            events += [(event.step, number(value)) for value in event.summary.value if value.tag == tag]
    return sorted(events)


@dataclasses.dataclass
class SmokeRun:
    params: dict  # the flow's parameters
    config: object  # the same, validated: flows.config.PipelineSettings
    flow_run_id: object
    records: dict


@pytest.fixture(scope="module")
def smoke(prefect_server) -> SmokeRun:
    from flows.config import check_settings
    from flows.pipeline import gpt2_pretrain

    params = smoke_params(prefect_server / "artifacts")
    flow_run_id, records = run_flow(gpt2_pretrain, **params)
    assert isinstance(records, dict), f"smoke pipeline failed: {records!r}"
    return SmokeRun(params, check_settings(params), flow_run_id, records)


# ---------------------------------------------------------------------------------------------------------


def test_smoke_pipeline_end_to_end_offline(smoke):
    from data.shards import manifest_shards
    from data.tokenizer import get_gpt2_encoding

    config, records = smoke.config, smoke.records
    assert states(smoke.flow_run_id) == {name: "Completed" for name in
                                         ("download", "tokenize", "hellaswag", "init", "train", "evaluate", "sample",
                                          "export")}

    # shards: the corpus, EOT-prefixed and tokenized independently here, cut at shard_size
    enc = get_gpt2_encoding()
    docs = [json.loads(line)["text"] for line in Path(config.source).read_text().splitlines()]
    expected = np.concatenate([[EOT] + enc.encode_ordinary(d) for d in docs]).astype(np.uint16)
    paths = manifest_shards(records["tokenize"].manifest, "val") + manifest_shards(records["tokenize"].manifest, "train")
    written = []
    for path in paths:
        raw = Path(path).read_bytes()
        header = np.frombuffer(raw[:SHARD_HEADER_BYTES], "<i4")
        assert (header[0], header[1]) == (20240520, 1)
        written.append(np.frombuffer(raw[SHARD_HEADER_BYTES:], "<u2"))
        assert header[2] == len(written[-1])
    assert [len(w) for w in written[:-1]] == [config.shard_size] * (len(written) - 1)
    np.testing.assert_array_equal(np.concatenate(written), expected)

    # training ran to max_steps from the init checkpoint and left a loss curve
    run = records["train"]
    assert run.steps == config.max_steps
    assert Path(run.loss_curve).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # final evaluation: val loss recomputed here from the val shard (B x T batches, in order)
    from gpt2.weights import load_model

    model, step = load_model(run.checkpoint.path)
    B, T, steps = config.batch_size, config.seq_len, config.val_steps
    val = torch.from_numpy(written[0].astype(np.int64))
    with torch.no_grad():
        losses = [model(val[i * B * T: (i + 1) * B * T].view(B, T), val[i * B * T + 1: (i + 1) * B * T + 1].view(B, T),
                        return_logits=False)[1].item() for i in range(steps)]
    evaluation = records["evaluate"]
    assert evaluation.step == step == run.steps
    assert evaluation.val_loss == pytest.approx(sum(losses) / steps, rel=1e-5)
    assert evaluation.hellaswag["n"] == 8
    assert tensorboard_scalars(Path(run.run_dir), "eval/val_loss") == [(run.steps, pytest.approx(evaluation.val_loss))]
    assert len(records["sample"].samples) == config.num_samples
    # the final checkpoint as a Hugging Face directory that transformers loads, with our weights
    from transformers import GPT2LMHeadModel

    hf_model = GPT2LMHeadModel.from_pretrained(records["export"].path)
    assert records["export"].step == run.steps
    assert torch.equal(hf_model.transformer.wte.weight, model.transformer.wte.weight[:hf_model.config.vocab_size])

    # the summary artifact sets the run beside the reference points
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    with get_client(sync_client=True) as client:  # the server is the suite's: other modules' runs have summaries too
        (summary,) = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["gpt2-pretrain-summary"]), flow_run_id=ArtifactFilterFlowRunId(any_=[smoke.flow_run_id])))
    assert "3.28" in summary.data and "0.2955" in summary.data and f"{evaluation.val_loss:.4f}" in summary.data
    from tasks.common import run_artifact_key

    with get_client(sync_client=True) as client:  # the samples under the run's own key
        (samples,) = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[run_artifact_key("samples", Path(run.run_dir))]),
            flow_run_id=ArtifactFilterFlowRunId(any_=[smoke.flow_run_id])))
    assert all(text in samples.data for text in records["sample"].samples)


def test_second_run_is_all_from_cache(smoke):
    from flows.pipeline import gpt2_pretrain

    flow_run_id, records = run_flow(gpt2_pretrain, **smoke.params)
    assert set(states(flow_run_id).values()) == {"Cached"}, states(flow_run_id)
    assert records["train"] == smoke.records["train"]


def test_single_stage_rerun(smoke):
    from flows.pipeline import tokenize_flow

    before = {p: sha256(p) for p in glob.glob(f"{smoke.records['tokenize'].out_dir}/*.bin")}
    flow_run_id, records = run_flow(tokenize_flow, **smoke.params, force=True)
    assert states(flow_run_id) == {"download": "Cached", "tokenize": "Completed"}
    assert {p: sha256(p) for p in before} == before


def test_deleted_shard_reruns_tokenize_and_only_what_depends_on_it(smoke):
    from data.shards import manifest_shards
    from flows.pipeline import gpt2_pretrain

    shard = manifest_shards(smoke.records["tokenize"].manifest, "train")[0]
    digest = sha256(shard)
    shard.unlink()
    flow_run_id, records = run_flow(gpt2_pretrain, **smoke.params)
    assert states(flow_run_id) == {
        "download": "Cached", "hellaswag": "Cached", "init": "Cached",  # independent of the shards
        "tokenize": "Completed",  # its cached record named a file that is gone
        # the rebuilt shards hold the same tokens, so what depends on their content is still valid
        "train": "Cached", "evaluate": "Cached", "sample": "Cached", "export": "Cached",
    }
    assert sha256(shard) == digest


def test_corrupted_output_is_recomputed_not_returned_from_cache(smoke):
    from flows.pipeline import hellaswag_flow

    eval_file = Path(smoke.records["hellaswag"].path)
    good = eval_file.read_bytes()
    eval_file.write_bytes(good[:-2] + bytes([good[-2] ^ 0xFF, good[-1]]))  # same size, one byte flipped
    flow_run_id, records = run_flow(hellaswag_flow, **smoke.params)
    assert states(flow_run_id) == {"hellaswag": "Completed"}
    assert eval_file.read_bytes() == good


def test_changed_training_parameter_reruns_training_and_what_follows_only(smoke):
    from flows.pipeline import gpt2_pretrain

    flow_run_id, records = run_flow(gpt2_pretrain, **{**smoke.params, "run_name": "smoke-lr", "lr": 3e-4})
    assert states(flow_run_id) == {
        "download": "Cached", "tokenize": "Cached", "hellaswag": "Cached", "init": "Cached",
        "train": "Completed", "evaluate": "Completed", "sample": "Completed", "export": "Completed",
    }
    assert json.loads((Path(records["train"].run_dir) / "config.json").read_text())["lr"] == 3e-4
    assert records["train"].checkpoint.content_digest() != smoke.records["train"].checkpoint.content_digest()


def test_tokenize_hellaswag_and_init_run_at_the_same_time(smoke, tmp_path, monkeypatch):
    """Each of the three independent stages waits, inside its work, until the other two have started theirs:
    run one after another, the first would wait in vain and fail the run."""
    import threading

    import data.hellaswag
    import data.shards
    import gpt2.checkpoint
    from flows.pipeline import train_flow

    meeting = threading.Barrier(3, timeout=120)

    def meet_then(real):
        def wrapper(*args, **kwargs):
            meeting.wait()  # BrokenBarrierError when the others do not start meanwhile
            return real(*args, **kwargs)
        return wrapper

    for module, name in ((data.shards, "build_shards"), (data.hellaswag, "prepare"),
                         (gpt2.checkpoint, "write_initial_checkpoint")):
        monkeypatch.setattr(module, name, meet_then(getattr(module, name)))
    flow_run_id, records = run_flow(train_flow, **{**smoke.params, "root": str(tmp_path), "max_steps": 2,
                                                      "checkpoint_every": 0, "val_every": 0})
    assert isinstance(records, dict), records
    assert states(flow_run_id) == {name: "Completed" for name in ("download", "tokenize", "hellaswag", "init", "train")}


def test_transient_failure_is_retried_and_succeeds(smoke, tmp_path, monkeypatch):
    import data.hellaswag
    import flows.pipeline

    real_prepare, calls = data.hellaswag.prepare, []

    def flaky_prepare(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise ConnectionResetError("connection reset by peer")
        return real_prepare(*args, **kwargs)

    monkeypatch.setattr(data.hellaswag, "prepare", flaky_prepare)
    fast_retries = flows.pipeline.prepare_hellaswag.with_options(retry_delay_seconds=0, retry_jitter_factor=None)
    monkeypatch.setattr(flows.pipeline, "prepare_hellaswag", fast_retries)

    flow_run_id, records = run_flow(flows.pipeline.hellaswag_flow, **{**smoke.params, "root": str(tmp_path)})
    (run,) = task_runs(flow_run_id)["hellaswag"]
    assert (run.state.name, run.run_count, len(calls)) == ("Completed", 2, 2)
    assert records["hellaswag"].num_examples == 8


def test_deterministic_failure_is_not_retried(smoke, tmp_path, monkeypatch):
    import flows.pipeline
    from data.hellaswag import EvalFileError

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"ctx": "no endings"}\n')
    fast_retries = flows.pipeline.prepare_hellaswag.with_options(retry_delay_seconds=0, retry_jitter_factor=None)
    monkeypatch.setattr(flows.pipeline, "prepare_hellaswag", fast_retries)

    flow_run_id, error = run_flow(flows.pipeline.hellaswag_flow,
                                     **{**smoke.params, "root": str(tmp_path), "hellaswag_source": str(bad)})
    assert isinstance(error, EvalFileError) and "bad.jsonl line 1" in str(error)
    (run,) = task_runs(flow_run_id)["hellaswag"]
    assert (run.state.name, run.run_count) == ("Failed", 1)


@pytest.mark.parametrize("changes, message", [
    ({"warmup_steps": 50}, "warmup_steps=50 exceeds max_steps=20"),  # gpt2.train's own check
    ({"total_batch_size": 100}, "total_batch_size=100 is not a multiple of batch_size*seq_len*world_size"),
    ({"model": "n_layer=2,n_head=3,n_embd=64,block_size=64"}, "n_head"),
    ({"shard_size": 0}, "shard_size=0: must lie in [1, 2147483647]"),
])
def test_bad_setting_fails_before_any_stage_runs_naming_the_field(smoke, tmp_path, changes, message):
    from flows.pipeline import gpt2_pretrain

    params = {**smoke.params, "root": str(tmp_path), "run_name": "smoke-bad", **changes}
    flow_run_id, error = run_flow(gpt2_pretrain, **params)
    assert isinstance(error, ValueError) and message in str(error), error
    assert task_runs(flow_run_id) == {}  # no stage ran: nothing downloaded, nothing trained
    assert not (tmp_path / "data").exists()


def test_failed_training_is_retried_and_resumes_from_the_latest_checkpoint(smoke, monkeypatch):
    import flows.pipeline
    import tasks.train
    from tasks.launch import CommandFailed

    real_run, starts = tasks.train.run_streaming, []

    def crash_after_first_checkpoint(cmd, on_line, **kwargs):
        """The first launch dies right after checkpoint 10 is written, as a node failure would kill it."""
        attempt = len(starts)

        def watch(line: str) -> None:
            on_line(line)
            if m := re.search(r"start step (\d+)/", line):
                starts.append(int(m.group(1)))
            if attempt == 0 and line.startswith("step    10/"):  # the step after checkpoint 10
                raise CommandFailed(cmd, -9, [line])

        real_run(cmd, watch, **kwargs)

    monkeypatch.setattr(tasks.train, "run_streaming", crash_after_first_checkpoint)
    monkeypatch.setattr(flows.pipeline, "train", flows.pipeline.train.with_options(retry_delay_seconds=0))

    flow_run_id, records = run_flow(flows.pipeline.train_flow, **{**smoke.params, "run_name": "smoke-retry"})
    (run,) = task_runs(flow_run_id)["train"]
    assert (run.state.name, run.run_count) == ("Completed", 2)
    assert starts == [0, 10]  # the retry resumed from checkpoint 10 instead of starting over
    assert records["train"].steps == smoke.config.max_steps


def test_scheduled_evaluation_evaluates_each_checkpoint_exactly_once(smoke):
    from flows.pipeline import gpt2_evaluate
    from gpt2.checkpoint import list_checkpoints, load_checkpoint, model_from_state, save_checkpoint

    run_dir = Path(smoke.records["train"].run_dir)
    runs_dir = str(smoke.config.runs_dir)
    first_id, first_rows = run_flow(gpt2_evaluate, runs_dir)

    # training goes on: a new checkpoint appears between two scans
    state = load_checkpoint(smoke.records["train"].checkpoint.path)
    model = model_from_state(state)
    with torch.no_grad():
        model.transformer.wte.weight.mul_(0.5)
    new_step = smoke.records["train"].steps + 10
    save_checkpoint(run_dir, new_step, {**state, "step": new_step, "model": model.state_dict()}, model)

    second_id, second_rows = run_flow(gpt2_evaluate, runs_dir)
    steps = [step for step, _ in list_checkpoints(run_dir)]
    evaluated_by_pipeline = smoke.records["evaluate"].step
    first_evaluations = task_runs(first_id).get("evaluate", [])
    first_steps = sorted(r["step"] for r in first_rows if r["evaluated_now"])
    second_steps = sorted(r["step"] for r in second_rows if r["evaluated_now"])
    assert first_steps == [s for s in steps if s not in (evaluated_by_pipeline, new_step)]
    assert second_steps == [new_step]
    assert [run.state.name for run in first_evaluations] == ["Completed"] * len(first_steps)
    assert sorted(r["step"] for r in second_rows) == steps  # the table lists every checkpoint

    # every checkpoint has exactly one evaluation in the run's TensorBoard log, at its own step
    val_events = tensorboard_scalars(run_dir, "eval/val_loss")
    assert [step for step, _ in val_events] == steps
    ledger = {r["step"]: r["val_loss"] for r in second_rows}
    assert all(value == pytest.approx(ledger[step]) for step, value in val_events)


def test_an_empty_corpus_fails_the_download_stage_naming_it_and_is_not_retried(smoke, tmp_path):
    from data.fineweb import EmptySource
    from flows.pipeline import download_flow

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    flow_run_id, error = run_flow(download_flow, **{**smoke.params, "root": str(tmp_path), "source": str(empty),
                                                    "dataset": "empty"})
    assert isinstance(error, EmptySource) and f"{empty} holds no documents" in str(error), error
    (run,) = task_runs(flow_run_id)["download"]
    assert (run.state.name, run.run_count) == ("Failed", 1)


def test_the_scheduled_scan_runs_no_code_from_a_planted_checkpoint(smoke, tmp_path):
    """A pickled state.pt that runs code (its COMPLETE marker's sha256 matching) planted under the scanned runs
    folder: the scan completes, reports it skipped naming the conversion command, evaluates nothing and runs
    nothing."""
    from flows.pipeline import gpt2_evaluate
    from gpt2.run_dir import RunDir
    from tests.fixtures.pickled import plant_malicious_checkpoint

    planted = RunDir(tmp_path / "runs" / "planted")
    planted.root.mkdir(parents=True)
    trained = RunDir(smoke.records["train"].run_dir)
    shutil.copy(trained.config, planted.config)  # a real run's inputs
    shutil.copy(trained.data_identity, planted.data_identity)
    marker = tmp_path / "code-ran"
    plant_malicious_checkpoint(planted.checkpoint(7), marker, step=7)

    flow_run_id, rows = run_flow(gpt2_evaluate, str(tmp_path / "runs"))
    assert not marker.exists(), "the scheduled scan ran a planted checkpoint's code"
    assert [(r["step"], r["val_loss"]) for r in rows] == [(7, None)] and "evaluate" not in task_runs(flow_run_id)
    assert "python -m gpt2.checkpoint convert" in rows[0]["skipped"]


def test_a_full_disk_fails_training_at_once_naming_it_and_is_not_retried(smoke, tmp_path):
    """Training's first checkpoint does not fit on a 48 MiB filesystem (the data and the init checkpoint do):
    the train task fails on its first run with the path, bytes needed and bytes free; no retry redoes steps."""
    from flows.pipeline import train_flow

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        flow_run_id, error = run_flow(train_flow, **{**smoke.params, "root": str(disk), "run_name": "full"})
        found = re.search(r"no space left on (\S+): ([\d,]+) bytes needed, ([\d,]+) free", str(error))
        assert found and found.group(1).endswith("/checkpoints/step_00000010"), error
        assert int(found.group(2).replace(",", "")) > int(found.group(3).replace(",", ""))
        (run,) = task_runs(flow_run_id)["train"]
        assert (run.state.name, run.run_count) == ("Failed", 1)
    finally:
        subprocess.run(["umount", str(disk)], check=True)
