"""The GPU bench scripts, run here without a GPU.

`bench/run_train_gpu.sh` is run as is, with a `python` that answers "1 GPU" and records the torchrun
command instead of training, and an `nvidia-smi` stub; the recorded gpt2.train flags must pass
gpt2.train's own validation on the shards the script generated. `bench/run_pipeline_gpu.sh` runs for real
in its CPU mode (a tiny model), in a clone of the committed tree: one command, a real Prefect server and
worker, every deployment run, gpt2.train alone, the report.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.processes import free_port
from tests.test_pipeline_deployments import clone  # noqa: F401  (fixture: a clone sharing this .venv)

REPO = Path(__file__).resolve().parent.parent

STUB_PYTHON = f"""#!/usr/bin/env bash
# a GPU host's python for the bench script: 1 GPU; torchrun only records its arguments
if [ "$1" = -c ] && [[ "$2" == *device_count* ]]; then echo 1; exit 0; fi
if [ "$1" = -m ] && [ "$2" = torch.distributed.run ]; then
    printf '%s\\n' "$@" > "$RECORD"; exit 0
fi
exec {sys.executable} "$@"
"""


def test_run_train_gpu_defaults_pass_gpt2_train_validation(tmp_path):
    from gpt2.train_config import load_config, validate

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(STUB_PYTHON)
    (bin_dir / "nvidia-smi").write_text("#!/usr/bin/env bash\necho 'name, driver_version, memory.total'\n")
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    record, out = tmp_path / "torchrun_args", tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(bin_dir / "python"),
           "OUT": str(out), "RECORD": str(record)}
    subprocess.run(["bash", "bench/run_train_gpu.sh"], cwd=REPO, env=env, capture_output=True, text=True)
    args = record.read_text().splitlines()
    flags = args[args.index("gpt2.train") + 1:]
    config = load_config(flags)
    assert config.max_steps == 40 and config.total_batch_size == 524288  # the script's defaults
    validate(config, world_size=1)  # raises ConfigError naming what is wrong


@pytest.mark.slow
def test_run_pipeline_gpu_runs_end_to_end_in_one_command(clone):  # noqa: F811
    """The CPU form of the command the docs show: one command runs every step and exits 0 once all ran,
    its summary's figures are those of the run directories it names, and the server it started is gone."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_PORT"] = str(port)
    result = subprocess.run(["bash", "-c", "MODE=cpu-tiny bash bench/run_pipeline_gpu.sh"], cwd=clone, env=env,
                            capture_output=True, text=True, timeout=900)
    logs = clone / "artifacts/gpu-run/logs"
    worker_log = (logs / "worker.log").read_text()[-3000:] if (logs / "worker.log").exists() else ""
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}\nworker log:\n{worker_log}"

    summary = json.loads((clone / "artifacts/gpu-run/out/summary.json").read_text())
    runs = {(run["flow"], run["state"]) for run in summary["flow_runs"]}
    for flow in ("gpt2-tokenize", "gpt2-hellaswag", "gpt2-init", "gpt2-pretrain"):
        assert (flow, "Completed") in runs, summary["flow_runs"]
    pipeline_run = clone / summary["pipeline_run"]
    train = [r for r in map(json.loads, (pipeline_run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    assert len(train) == 40 and train[-1]["loss"] < train[0]["loss"]  # the CPU mode's default STEPS
    assert summary["loss_curve"][0] == [0, train[0]["loss"]] and summary["loss_curve"][-1] == [39, train[-1]["loss"]]
    alone = clone / "artifacts/gpu-run/alone"
    alone_train = [r for r in map(json.loads, (alone / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    assert len(alone_train) == 20 and summary["alone_tokens_per_s"] > 0 and summary["pipeline_tokens_per_s"] > 0
    pipeline_model = json.loads((pipeline_run / "config.json").read_text())["model"]
    assert json.loads((alone / "config.json").read_text())["model"] == pipeline_model  # the run's own config
    with socket.socket() as s:  # the script's server is stopped: its port is free again
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_train_memory_explains_itself_and_refuses_without_a_gpu():
    """`python -m bench.train_memory --help` prints what its report lines mean; on a machine without CUDA it
    stops with an error that says so instead of starting a CPU run it cannot measure."""
    shown = subprocess.run([sys.executable, "-m", "bench.train_memory", "--help"], cwd=REPO,
                           capture_output=True, text=True, check=True)
    assert "pool by pool" in shown.stdout and "python -m gpt2.train --help" in shown.stdout
    run = subprocess.run([sys.executable, "-m", "bench.train_memory", "--model", "d12"], cwd=REPO,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True)
    assert run.returncode != 0 and "needs a CUDA GPU" in run.stderr
