"""The deployment users run, `bash scripts/run.sh gpt2-pretrain/gpt2-124m`, with its data from a hub replica.

A fresh clone, its own Prefect server and worker (scripts/run.sh), the real huggingface_hub client reaching
the replica (tests/fixtures/hub_replica.py) through HF_ENDPOINT: download -> tokenize -> train -> evaluate on
the CPU, changed only through the documented parameters (a small model, `limit`, `max_steps`, a pinned
`source_revision`).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from pathlib import Path

import pytest
from test_pipeline_deployments import clone, run_sh  # noqa: F401  (clone is a fixture)

from common.locks import folder_lock
from tests.fixtures.hub_replica import HubReplica, fineweb_like
from tests.test_pipeline_integrity import folder_snapshot, state_once_logged
from tests.fixtures.deployed import wait_for_final_state

pytestmark = pytest.mark.slow

CPU_PARAMS = {  # gpt2-124m's recipe, scaled down to a CPU: every value is a documented parameter
    "limit": "200", "shard_size": "8192", "tokenize_workers": "1", "model": "n_layer=2,n_head=2,n_embd=64,block_size=64",
    "nproc": "1", "device": "cpu", "batch_size": "4", "seq_len": "32", "total_batch_size": "128", "max_steps": "4",
    "warmup_steps": "1", "val_every": "2", "val_steps": "1", "hellaswag_every": "0", "sample_every": "0",
    "sample_tokens": "8", "checkpoint_every": "2", "num_samples": "1", "eval": '{"device": "cpu"}',
    "hellaswag_source": "tests/fixtures/pipeline/hellaswag_mini.jsonl",
}


def test_run_sh_gpt2_124m_downloads_from_the_hub_at_a_pinned_revision_and_trains(clone, tmp_path):  # noqa: F811
    replica = HubReplica()
    old, main = fineweb_like(replica, num_files=3)
    replica.start()
    try:
        params = {**CPU_PARAMS, "source_revision": old}
        args = [arg for name, value in params.items() for arg in ("--param", f"{name}={value}")]
        result = run_sh(clone, "gpt2-pretrain/gpt2-124m", *args,
                        env={"HF_ENDPOINT": replica.url, "HF_HOME": str(tmp_path / "hf-home")})
    finally:
        replica.stop()
    assert "gpt2-pretrain/gpt2-124m finished with exit code 0" in result.stdout

    first = "sample/10BT/000_00000.parquet"  # 300 documents: the limit needs no other file
    assert {p for p in replica.bytes_served if p.endswith(".parquet")} == {first}
    assert not any(main in path for _, path, _ in replica.requests)
    documents = json.loads((clone / "artifacts/data/fineweb10B/documents/manifest.json").read_text())
    expected = hashlib.sha256(replica.repos["HuggingFaceFW/fineweb"].commits[old].files[first]).hexdigest()
    assert (documents["revision"], [(f["path"], f["sha256"]) for f in documents["files"]]) == (old, [(first, expected)])
    shards = json.loads((clone / "artifacts/data/fineweb10B/shards/manifest.json").read_text())
    assert shards["source"]["revision"] == old and shards["source"]["sha256"] == [expected]
    assert shards["num_documents"] == 200

    (run_dir,) = [Path(p) for p in glob.glob(str(clone / "artifacts/runs/gpt2-124m/*"))]
    evaluations = sorted((run_dir / "evaluations").glob("*.json"))
    assert [p.name for p in evaluations] == ["step_00000004.json"]
    assert json.loads(evaluations[0].read_text())["hellaswag"]["n"] == 8


def test_a_tokenize_run_waits_while_a_download_rewrites_the_documents_it_reads(server, tmp_path):
    """`prefect deployment run gpt2-tokenize/gpt2-124m` through a real server and worker, its documents from the
    hub replica. While the documents folder's writer lock is held (here by the test, as a download rerun holds it
    while it rewrites the files), a tokenize run waits before reading a document, naming the writer, and leaves
    the shards as they were; once the writer is gone it builds them. Before, it read the folder regardless."""
    replica = HubReplica()
    old, _ = fineweb_like(replica, num_files=3)
    replica.start()
    env = {"HF_ENDPOINT": replica.url, "HF_HOME": str(tmp_path / "hf-home")}
    params = {"limit": "200", "source_revision": old, "tokenize_workers": "1", "shard_size": "8192"}

    def tokenize(server, **changed: str) -> str:
        return server.run("gpt2-tokenize/gpt2-124m",
                          *[a for k, v in {**params, **changed}.items() for a in ("--param", f"{k}={v}")])

    try:
        server.worker(env=env)  # its flow runs reach the replica as the hub
        first = tokenize(server)
        assert wait_for_final_state(server, first)["state"]["type"] == "COMPLETED"
        data = server.tree / "artifacts" / "data" / "fineweb10B"
        documents, shards = (data / "documents").resolve(), data / "shards"
        before = folder_snapshot(shards)
        with folder_lock(documents):  # what a download rerun holds while it writes the documents
            rerun = tokenize(server, shard_size="4096")
            told = f"waiting for the lock: {documents} is being written by pid {os.getpid()}"
            state = state_once_logged(server, rerun, told)
            assert state == "RUNNING", f"the tokenize run did not wait for the documents' writer: {state}"
            assert folder_snapshot(shards) == before
        assert wait_for_final_state(server, rerun)["state"]["type"] == "COMPLETED"
        assert folder_snapshot(shards) != before  # 4096 tokens a shard, read once the writer was gone
    finally:
        server.stop_worker()  # the next test's worker has the suite's environment
        replica.stop()
