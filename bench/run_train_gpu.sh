#!/usr/bin/env bash
# Training throughput of the real training program (python -m gpt2.train) on this host's GPUs:
# d12, B=64, T=1024, total batch 524,288 tokens, on synthetic random-token shards; first on 1 GPU,
# then on all visible GPUs (when there are more than one). Prints tokens/s, MFU, peak memory (PyTorch's
# and nvidia-smi's, the highest over the GPUs the run used) per run, and the multi-GPU scaling, from each run's metrics.jsonl; with
# PEER, the same for build-nanogpt's train_gpt2.py on 1 and on all GPUs (under torchrun) in the same call,
# its scaling, and ours against it per GPU. Writes them to $OUT/summary.json.
#
#   bench/run_train_gpu.sh [extra gpt2.train flags, e.g. --no-kernels or --no-compile]
#   PEER=path/to/build-nanogpt bench/run_train_gpu.sh
#   bench/run_train_gpu.sh --print-train-flags     # the gpt2.train flags it would use, nothing else
#
# Environment: OUT (default artifacts/bench/train), STEPS (default 40), SKIP (untimed first steps:
# compilation and warm-up, default 10), WARMUP (learning-rate warmup steps, default STEPS/4: the
# recipe's 700 would exceed STEPS), PEER (a folder holding build-nanogpt's train_gpt2.py; its results
# $OUT/peer_<N>gpu.json are also read when an earlier command wrote them), PYTHON (default
# .venv/bin/python if present, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-artifacts/bench/train}
STEPS=${STEPS:-40}
SKIP=${SKIP:-10}
WARMUP=${WARMUP:-$(( STEPS / 4 ))}
train_flags() {  # train_flags OUT_DIR: gpt2.train's flags of one benchmark run
    echo --model d12 --batch-size 64 --seq-len 1024 --total-batch-size 524288 --max-steps "$STEPS" \
        --warmup-steps "$WARMUP" --train-data "$OUT/shards/*_train_*.bin" --val-data "$OUT/shards/*_val_*.bin" \
        --val-every 0 --hellaswag-every 0 --sample-every 0 --checkpoint-every 0 --log-every 5 \
        --out-dir "$1" --no-resume
}
if [[ "${1:-}" == --print-train-flags ]]; then
    train_flags "$OUT/run_1gpu"
    exit 0
fi
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"

NGPU=$("$PYTHON" -c "import torch; print(torch.cuda.device_count())")
if [[ "$NGPU" -lt 1 ]]; then
    echo "no CUDA GPU visible; this benchmark needs one" >&2
    exit 1
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
source bench/smi_ids.sh  # smi_ids N: the GPUs a run on N GPUs uses, as nvidia-smi's -i names them

# synthetic shards: enough train tokens for STEPS steps without wrapping, one val shard
"$PYTHON" - "$OUT/shards" "$STEPS" <<'EOF'
import sys
from pathlib import Path

import numpy as np

from data.shards import write_shard

out, steps = Path(sys.argv[1]), int(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)
for name, ntok in (("synthetic_val_000000.bin", 2**21 + 1), ("synthetic_train_000001.bin", steps * 524288 + 1)):
    if not (out / name).exists():
        write_shard(out / name, rng.integers(0, 50257, ntok, dtype=np.uint16))
print(f"shards in {out}")
EOF

run() {  # run NPROC: one training run of STEPS steps on NPROC GPUs, nvidia-smi read every 0.2 s meanwhile
    local nproc=$1 dir="$OUT/run_${1}gpu"
    rm -rf "$dir"
    echo "=== d12 on $nproc GPU(s) -> $dir"
    local flags
    read -ra flags <<<"$(train_flags "$dir")"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 -i "$(smi_ids "$nproc")" \
        >"$OUT/smi_${nproc}gpu.txt" &
    local smi=$!
    "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node="$nproc" -m gpt2.train \
        "${flags[@]}" "${@:2}" 2>&1 | tee "$OUT/log_${nproc}gpu.txt"
    kill "$smi" 2>/dev/null || true  # it reads until stopped
}

peer() {  # peer NPROC: build-nanogpt's train_gpt2.py on NPROC GPUs, STEPS steps, the median past SKIP
    echo "=== build-nanogpt on $1 GPU(s)"
    "$PYTHON" -m bench.peer_nanogpt --source "$PEER" --steps "$STEPS" --skip "$SKIP" --nproc "$1" \
        --out "$OUT/peer_${1}gpu.json" 2>&1 | tee "$OUT/peer_log_${1}gpu.txt" | tail -1
}

for nproc in 1 $( (( NGPU > 1 )) && echo "$NGPU"); do
    if [[ -n "${PEER:-}" ]]; then peer "$nproc"; fi
    run "$nproc" "$@"
done

"$PYTHON" - "$OUT" "$SKIP" <<'EOF'
import datetime
import json
import statistics
import sys
from pathlib import Path

from common.files import write_json
from gpt2.run_dir import RunDir

out, skip = Path(sys.argv[1]), int(sys.argv[2])


def nvidia_smi_peak(path: Path) -> int | None:
    readings = [int(line) for line in path.read_text().split() if line.isdigit()] if path.exists() else []
    return max(readings, default=None)


runs, settings, resolved = {}, {}, {}
for run_dir in map(RunDir, sorted(out.glob("run_*gpu"))):
    settings = json.loads(run_dir.config.read_text())
    resolved = settings["resolved"]
    records = [json.loads(line) for line in run_dir.metrics.read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "train"][skip:]
    if not steps:
        sys.exit(f"{run_dir.root}: no train steps after the first {skip}; raise STEPS")
    runs[resolved["world_size"]] = {
        "gpus": resolved["world_size"],
        "grad_accum_steps": resolved["grad_accum_steps"],
        "tokens_per_s": statistics.median(r["tok_s"] for r in steps),
        "mfu": statistics.median(r["mfu"] for r in steps) if steps[0]["mfu"] is not None else None,
        "peak_mem_gb": max(r.get("peak_mem_gb", 0.0) for r in steps),
        "nvidia_smi_peak_mib": nvidia_smi_peak(out / f"smi_{resolved['world_size']}gpu.txt"),
        "ms_per_step": statistics.median(r["ms"] for r in steps),
        "timed_steps": len(steps),
        "kernels": resolved["kernels"],
        "compile": resolved["compile"],
        "cuda_graphs": resolved.get("cuda_graphs"),
        "sdpa_backend": resolved["sdpa_backend"],
    }
summary = {
    "gpu": resolved.get("gpu"),
    "torch": resolved.get("torch"),
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    **{key: settings.get(key) for key in ("model", "batch_size", "seq_len", "total_batch_size")},
    "runs": list(runs.values()),
}
peers = {n: json.loads((out / f"peer_{n}gpu.json").read_text()) for n in runs if (out / f"peer_{n}gpu.json").exists()}
summary["peer"] = list(peers.values())
print(f"\n{summary['gpu']} | torch {summary['torch']} | {summary['date']}")
print(f"{'trainer':<14} {'GPUs':>4} {'tokens/s':>12} {'MFU':>7} {'GiB torch':>10} {'MiB smi':>8} {'ms/step':>9}")
for r in runs.values():
    mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
    print(f"{'gpt2.train':<14} {r['gpus']:>4} {r['tokens_per_s']:>12,.0f} {mfu:>7} {r['peak_mem_gb']:>10.1f} "
          f"{r['nvidia_smi_peak_mib'] or 0:>8} {r['ms_per_step']:>9.1f}")
for n, p in peers.items():
    print(f"{'build-nanogpt':<14} {n:>4} {p['tokens_per_s']:>12,.0f} {'':>7} {'':>10} "
          f"{round(p['nvidia_smi_peak_gb'] * 1e9 / 2**20):>8} {p['step_ms']:>9.1f}")
for n in runs:
    if n in peers:
        summary[f"vs_peer_{n}gpu"] = runs[n]["tokens_per_s"] / peers[n]["tokens_per_s"]
        print(f"gpt2.train / build-nanogpt on {n} GPU(s): {summary[f'vs_peer_{n}gpu']:.3f}x")
if len(runs) > 1:
    n = max(runs)
    summary["scaling"] = runs[n]["tokens_per_s"] / runs[1]["tokens_per_s"]
    print(f"scaling {n} GPUs / 1 GPU, gpt2.train: {summary['scaling']:.3f}x = {summary['scaling'] / n:.3f} per GPU")
    if {1, n} <= peers.keys():
        summary["peer_scaling"] = peers[n]["tokens_per_s"] / peers[1]["tokens_per_s"]
        print(f"scaling {n} GPUs / 1 GPU, build-nanogpt: {summary['peer_scaling']:.3f}x = "
              f"{summary['peer_scaling'] / n:.3f} per GPU")
write_json(out / "summary.json", summary)
print(f"written {out / 'summary.json'}")
EOF
