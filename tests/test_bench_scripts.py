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

from tests.fixtures.deployed import seeded_home
from tests.fixtures.processes import environ_without_prefect_settings, free_port
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


def run_train_gpu(tmp_path: Path, python_stub: str, nvidia_smi_stub: str, **env: str) -> subprocess.CompletedProcess:
    """bench/run_train_gpu.sh with stand-ins for the host's python and nvidia-smi first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(python_stub)
    (bin_dir / "nvidia-smi").write_text(nvidia_smi_stub)
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(bin_dir / "python"),
           "OUT": str(tmp_path / "out"), **env}
    return subprocess.run(["bash", "bench/run_train_gpu.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)


def test_run_train_gpu_defaults_pass_gpt2_train_validation(tmp_path):
    from gpt2.train_config import load_config, validate

    record = tmp_path / "torchrun_args"
    run_train_gpu(tmp_path, STUB_PYTHON, "#!/usr/bin/env bash\necho 'name, driver_version, memory.total'\n",
                  RECORD=str(record))
    args = record.read_text().splitlines()
    flags = args[args.index("gpt2.train") + 1:]
    config = load_config(flags)
    assert config.max_steps == 40 and config.total_batch_size == 524288  # the script's defaults
    validate(config, world_size=1)  # raises ConfigError naming what is wrong


STEPS, ALONE_STEPS = 8, 4  # of the pipeline's run and of gpt2.train alone


@pytest.mark.slow
def test_run_pipeline_gpu_runs_end_to_end_in_one_command(clone):  # noqa: F811
    """The CPU form of the command the docs show: one command runs every step and exits 0 once all ran,
    its summary's figures are those of the run directories it names, and the server it started is gone. A
    handful of steps: the script, not the numbers, is under test."""
    port = free_port()
    seeded_home(clone / "artifacts/gpu-run/prefect")  # the script's PREFECT_HOME, its database already made
    env = environ_without_prefect_settings()
    # scheduled scans every 60 s, not the CPU mode's 15: two or three while the pipeline trains, not seven flow runs
    env.update(PREFECT_PORT=str(port), PREFECT_WORKER_QUERY_SECONDS="1", STEPS=str(STEPS), ALONE_STEPS=str(ALONE_STEPS),
               SKIP="1", EVAL_INTERVAL="60")
    result = subprocess.run(["bash", "-c", "MODE=cpu-tiny bash bench/run_pipeline_gpu.sh"], cwd=clone, env=env,
                            capture_output=True, text=True, timeout=540)
    logs = clone / "artifacts/gpu-run/logs"
    worker_log = (logs / "worker.log").read_text()[-3000:] if (logs / "worker.log").exists() else ""
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}\nworker log:\n{worker_log}"

    summary = json.loads((clone / "artifacts/gpu-run/out/summary.json").read_text())
    runs = {(run["flow"], run["state"]) for run in summary["flow_runs"]}
    for flow in ("gpt2-tokenize", "gpt2-hellaswag", "gpt2-init", "gpt2-pretrain"):
        assert (flow, "Completed") in runs, summary["flow_runs"]
    pipeline_run = clone / summary["pipeline_run"]
    train = [r for r in map(json.loads, (pipeline_run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    assert len(train) == STEPS and train[-1]["loss"] < train[0]["loss"]
    assert summary["loss_curve"][0] == [0, train[0]["loss"]] and summary["loss_curve"][-1] == [STEPS - 1, train[-1]["loss"]]
    alone = clone / "artifacts/gpu-run/alone"
    alone_train = [r for r in map(json.loads, (alone / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    assert len(alone_train) == ALONE_STEPS and summary["alone_tokens_per_s"] > 0 and summary["pipeline_tokens_per_s"] > 0
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


def test_profile_train_explains_itself_and_refuses_without_a_gpu():
    """`python -m bench.profile_train --help` says what it reports; without CUDA it stops before training."""
    shown = subprocess.run([sys.executable, "-m", "bench.profile_train", "--help"], cwd=REPO,
                           capture_output=True, text=True, check=True)
    assert "sat idle" in shown.stdout and "--profile-steps" in shown.stdout
    run = subprocess.run([sys.executable, "-m", "bench.profile_train", "--out", "p.json", "--", "--model", "d12"],
                         cwd=REPO, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True)
    assert run.returncode != 0 and "needs a CUDA GPU" in run.stderr


def test_gemm_ceiling_explains_itself_and_refuses_without_a_gpu():
    """`python -m bench.gemm_ceiling --help` says what it replays and reports; without CUDA it stops with an error
    that says so, and a step that is no whole number of micro-batches is refused by name."""
    shown = subprocess.run([sys.executable, "-m", "bench.gemm_ceiling", "--help"], cwd=REPO,
                           capture_output=True, text=True, check=True)
    assert "sustained" in shown.stdout and "--streams" in shown.stdout and "bench.profile_train" in shown.stdout
    no_gpu = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([sys.executable, "-m", "bench.gemm_ceiling", "--model", "d12"], cwd=REPO, env=no_gpu,
                         capture_output=True, text=True)
    assert run.returncode != 0 and "needs a CUDA GPU" in run.stderr


def test_gemm_ceiling_counts_every_matmul_of_a_step():
    """The FLOPs the ceiling divides by are 6 × the weights of every matmul × the tokens of a step: the blocks'
    twelve C² matrices and the padded classifier, forward and both gradients; checked at d12 and d48's widths."""
    from bench.gemm_ceiling import step_flops
    from gpt2.config import GPTConfig

    for descriptor, rows, micro_steps in (("d12", 65536, 8), ("d48", 16384, 8)):
        config = GPTConfig.from_descriptor(descriptor)
        matmul_weights = config.n_layer * 12 * config.n_embd**2 + config.padded_vocab_size * config.n_embd
        assert step_flops(config, rows, micro_steps) == 6 * matmul_weights * rows * micro_steps
    assert step_flops(GPTConfig.from_descriptor("d48"), 16384, 8) / 1e15 == pytest.approx(1.223, abs=1e-3)


def test_profile_train_counts_overlapping_kernels_once():
    """Busy time is the union of the kernels' intervals: overlapping kernels (streams) count once, gaps not."""
    from bench.profile_train import union_ms

    assert union_ms([(0, 1000), (500, 1500), (3000, 4000), (3100, 3200)]) == 2.5
    assert union_ms([]) == 0.0


def _stub_torchrun(ms_one: float, ms_many: float, config: str, record: str) -> str:
    """The `python -m torch.distributed.run -m gpt2.train` branch of a stand-in host's python: the run's config.json
    (`config`'s fields and `resolved`'s, the world size added) and a metrics.jsonl of `record`'s fields at `ms_one`
    ms a step on 1 GPU, `ms_many` on more."""
    return f"""if [ "$1" = -m ] && [ "$2" = torch.distributed.run ]; then
    exec {sys.executable} -c '
import json, sys
from pathlib import Path
args = sys.argv[1:]
world = int(next(a for a in args if a.startswith("--nproc_per_node=")).split("=")[1])
out = Path(args[args.index("--out-dir") + 1])
out.mkdir(parents=True)
ms = {ms_one} if world == 1 else {ms_many}
config = {config}
config["resolved"]["world_size"] = world
(out / "config.json").write_text(json.dumps(config))
records = [{{"kind": "train", "step": s, "ms": ms, {record}}} for s in range(int(args[args.index("--max-steps") + 1]))]
(out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in records))
' "$@"
fi"""


def _stub_peer(module: str, ms_one: float, ms_many: float, fields: str) -> str:
    """The `python -m MODULE` branch of a stand-in host's python for a peer's runner: its JSON result (`fields`, the
    GPU count and step time added) at `ms_one` ms a step on 1 GPU, `ms_many` on more."""
    return f"""if [ "$1" = -m ] && [ "$2" = {module} ]; then
    exec {sys.executable} -c '
import json, sys
args = sys.argv[1:]
n = int(args[args.index("--nproc") + 1])
ms = {ms_one} if n == 1 else {ms_many}
json.dump({{"gpus": n, "step_ms": ms, {fields}}}, open(args[args.index("--out") + 1], "w"))
' "$@"
fi"""


STUB_TRAINERS = f"""#!/usr/bin/env bash
# a 4-GPU host's python for the bench script: gpt2.train writes the records of a run of 1 GPU at 800 ms a step
# and of N GPUs at 205 ms; build-nanogpt reads 1000 ms on 1 GPU and 260 on N
if [ "$1" = -c ] && [[ "$2" == *device_count* ]]; then echo 4; exit 0; fi
{_stub_torchrun(800.0, 205.0,
                '{"model": "d12", "batch_size": 64, "seq_len": 1024, "total_batch_size": 524288, "resolved": {'
                '"grad_accum_steps": 8 // world, "kernels": True, "compile": True, "cuda_graphs": True, '
                '"sdpa_backend": "cudnn", "gpu": "stub", "torch": "stub"}}',
                '"tok_s": 524288 / ms * 1e3, "mfu": 0.5, "peak_mem_gb": 19.0')}
{_stub_peer("bench.peer_nanogpt", 1000.0, 260.0, '"tokens_per_s": 524288 / ms * 1e3, "nvidia_smi_peak_gb": 50.0')}
exec {sys.executable} "$@"
"""


def test_run_train_gpu_prints_our_scaling_and_the_peers_from_one_command(tmp_path):
    """`PEER=... bench/run_train_gpu.sh` on a 4-GPU host (stand-ins for the trainers and nvidia-smi) runs both
    trainers on 1 and 4 GPUs and prints each one's scaling and ours against the peer per GPU count."""
    smi = "#!/usr/bin/env bash\n[[ \"$*\" == *memory.used* ]] && printf '21000\\n22000\\n'; true\n"
    result = run_train_gpu(tmp_path, STUB_TRAINERS, smi, PEER=str(tmp_path / "build-nanogpt"), STEPS="12", SKIP="2")
    assert result.returncode == 0, result.stdout + result.stderr
    # ours: 800 / 205 = 3.902x; the peer: 1000 / 260 = 3.846x; per GPU count: 1000 / 800 and 260 / 205
    assert "scaling 4 GPUs / 1 GPU, gpt2.train: 3.902x = 0.976 per GPU" in result.stdout, result.stdout
    assert "scaling 4 GPUs / 1 GPU, build-nanogpt: 3.846x = 0.962 per GPU" in result.stdout, result.stdout
    assert "gpt2.train / build-nanogpt on 1 GPU(s): 1.250x" in result.stdout
    assert "gpt2.train / build-nanogpt on 4 GPU(s): 1.268x" in result.stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [r["nvidia_smi_peak_mib"] for r in summary["runs"]] == [22000, 22000]
    assert summary["peer_scaling"] == pytest.approx(1000 / 260)


STUB_LLMC_HOST = f"""#!/usr/bin/env bash
# a host of $STUB_GPUS GPUs for bench/run_llmc_gpu.sh: gpt2.train writes the records of a d48 run at 2,600 ms a
# step on 1 GPU and 680 on N; llm.c's runner answers 2,800 ms on 1 GPU and 720 on N
if [ "$1" = -c ] && [[ "$2" == *device_count* ]]; then echo "$STUB_GPUS"; exit 0; fi
{_stub_torchrun(2600.0, 680.0, '{"model": "d48", "total_batch_size": 131072, "resolved": {"gpu": "stub", "torch": "stub"}}',
                '"peak_mem_gb": 60.0')}
{_stub_peer("bench.peer_llmc", 2800.0, 720.0,
            '"model": "d48", "tokens_per_s": 131072 / ms * 1e3, "nvidia_smi_peak_gb": 70.0, "timed_steps": 6')}
exec {sys.executable} "$@"
"""


SMI_61000 = "#!/usr/bin/env bash\n[[ \"$*\" == *memory.used* ]] && echo 61000; true\n"
# nvidia-smi on a host whose GPU 2 reads 30,000 MiB, GPU 3 31,000 and the others 61,000; each call's -i recorded
SMI_PER_GPU = """#!/usr/bin/env bash
[[ "$*" == *memory.used* ]] || exit 0
while [ $# -gt 0 ]; do [ "$1" = -i ] && ids=$2; shift; done
echo "$ids" >> "$SMI_RECORD"
IFS=, read -ra list <<<"$ids"
for id in "${list[@]}"; do case $id in 2) echo 30000 ;; 3) echo 31000 ;; *) echo 61000 ;; esac; done
"""


def run_llmc_gpu(tmp_path: Path, gpus: int, smi: str = SMI_61000, **env: str) -> subprocess.CompletedProcess:
    """bench/run_llmc_gpu.sh at d48 on a stand-in host of `gpus` GPUs (LLMC set: both trainers)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(STUB_LLMC_HOST)
    (bin_dir / "nvidia-smi").write_text(smi)
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(bin_dir / "python"),
           "OUT": str(tmp_path / "out"), "STUB_GPUS": str(gpus), "LLMC": str(tmp_path / "llm.c"), "MODELS": "d48",
           "STEPS": "8", "SKIP": "2", **env}
    return subprocess.run(["bash", "bench/run_llmc_gpu.sh", "--zero1"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def test_run_llmc_gpu_prints_ratio_per_gpu_count_and_each_trainers_scaling(tmp_path):
    """`GPUS="1 4"` runs both trainers on 1 and 4 GPUs and prints ours / llm.c per GPU count and each trainer's
    scaling as tokens/s on 4 over 4 times that on 1."""
    result = run_llmc_gpu(tmp_path, 4, GPUS="1 4")
    assert result.returncode == 0, result.stdout + result.stderr
    # ours / llm.c: 2800 / 2600 and 720 / 680; scaling: 2600 / 680 and 2800 / 720
    assert "gpt2.train / llm.c, d48 on 1 GPU(s): 1.077x" in result.stdout, result.stdout
    assert "gpt2.train / llm.c, d48 on 4 GPU(s): 1.059x" in result.stdout
    assert "scaling 4 GPUs / 1 GPU, gpt2.train d48: 3.824x = 0.956 per GPU" in result.stdout
    assert "scaling 4 GPUs / 1 GPU, llm.c d48: 3.889x = 0.972 per GPU" in result.stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["scaling_per_gpu"]["gpt2.train_d48_4gpu"] == pytest.approx(2600 / 680 / 4)


def test_run_llmc_gpu_runs_on_one_gpu_without_gpus_set(tmp_path):
    """With GPUS unset on a 1-GPU host both trainers run on that GPU (the default's test once ended the script
    under set -e, silently, before any run)."""
    result = run_llmc_gpu(tmp_path, 1)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "gpt2.train / llm.c, d48 on 1 GPU(s): 1.077x" in result.stdout, result.stdout
    assert "scaling" not in result.stdout


def test_run_llmc_gpu_reads_the_memory_of_the_gpus_the_run_used(tmp_path):
    """Ours on GPU 2 alone (CUDA_VISIBLE_DEVICES=2,3) gets GPU 2's nvidia-smi peak, not GPU 0's; on both, the
    higher of GPUs 2 and 3 (the script once read GPU 0 whatever GPU the run had)."""
    record = tmp_path / "smi_ids"
    result = run_llmc_gpu(tmp_path, 2, smi=SMI_PER_GPU, GPUS="1 2", CUDA_VISIBLE_DEVICES="2,3",
                          SMI_RECORD=str(record))
    assert result.returncode == 0, result.stdout + result.stderr
    assert record.read_text().split() == ["2", "2,3"]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    ours = {r["gpus"]: r["nvidia_smi_peak_mib"] for r in summary["runs"] if r["trainer"] == "gpt2.train"}
    assert ours == {1: 30000, 2: 31000}


def test_run_train_gpu_reads_the_memory_of_the_gpu_the_run_used(tmp_path):
    record = tmp_path / "smi_ids"
    result = run_train_gpu(tmp_path, STUB_TRAINERS.replace("echo 4; exit 0", "echo 1; exit 0"), SMI_PER_GPU,
                           CUDA_VISIBLE_DEVICES="3", SMI_RECORD=str(record), STEPS="12", SKIP="2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert record.read_text().split() == ["3"]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [r["nvidia_smi_peak_mib"] for r in summary["runs"]] == [31000]


def test_peers_read_the_gpus_cuda_shows_them(monkeypatch):
    from bench.peer_nanogpt import visible_gpu_ids

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_gpu_ids(2) == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,GPU-abc, 1")
    assert visible_gpu_ids(1) == ["3"] and visible_gpu_ids(3) == ["3", "GPU-abc", "1"]


def test_peer_llmc_builds_without_data_and_refuses_a_run_without_it(tmp_path):
    """`bench.peer_llmc --build-only` needs no shards (it goes on to the build: here a folder without llm.c's
    source, named in its error); a run without them is refused before any build."""
    build = subprocess.run([sys.executable, "-m", "bench.peer_llmc", "--source", str(tmp_path), "--build",
                            str(tmp_path / "build"), "--build-only"], cwd=REPO, capture_output=True, text=True)
    assert build.returncode != 0 and "no train_gpt2.cu and Makefile" in build.stderr, build.stderr
    run = subprocess.run([sys.executable, "-m", "bench.peer_llmc", "--source", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True)
    assert run.returncode == 2 and "--train-data and --val-data are needed" in run.stderr, run.stderr
