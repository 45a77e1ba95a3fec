#!/usr/bin/env bash
# Ours against llm.c, one command: for each model size in MODELS, python -m gpt2.train and llm.c's train_gpt2cu
# (built from LLMC's source with its Makefile, bench/peer_llmc.py) at the same micro-batch, tokens a step and
# steps, first on 1 GPU, then on all visible GPUs (when there are more than one), on synthetic random-token
# shards in llm.c's format. Prints per size and GPU count the median step time, tokens/s, peak memory (PyTorch's
# and nvidia-smi's, the highest over the GPUs the run used), ours / llm.c, and each trainer's scaling from 1 to N GPUs (tokens/s on N over
# N times that on 1); writes them to $OUT/summary.json.
#
#   LLMC=path/to/llm.c MODELS="d12 d24 d48" bench/run_llmc_gpu.sh [extra gpt2.train flags]
#
# Sizes (micro-batch, tokens a step): d12 64, 524,288; d24 32, 131,072; d48 16, 131,072 (llm.c's 1.5B setting).
# Ours runs with the MLP budget (--keep-mlp-post-gb) of each size that keeps its nvidia-smi peak under llm.c's
# on an 80 GB H100 (docs/benchmarks.md): d24 6.5 (every MLP keeps post), d48 0; extra flags override it.
# Environment: LLMC (llm.c's source; unset: ours alone), MODELS (default d12), GPUS ("1 N" by default: 1 and all
# visible), STEPS (default 20), SKIP (untimed first steps, default 6), TRAINERS (default "llmc ours"),
# MEMORY_REPORT=1 (ours through bench.train_memory: the allocator's pools at the points where the peak forms,
# in ours' log, and the accounting in run_<model>_<n>gpu.memory.json), OUT (default artifacts/bench/llmc), SHARDS (the shards' folder, default $OUT/shards), PYTHON (default .venv/bin/python if present, else python3).
# Results already in $OUT (llmc_<model>_<n>gpu.json, run_<model>_<n>gpu/) from an earlier command are read too.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-artifacts/bench/llmc}
MODELS=${MODELS:-d12}
STEPS=${STEPS:-20}
SKIP=${SKIP:-6}
TRAINERS=${TRAINERS:-llmc ours}
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
sizes() {  # sizes MODEL: "micro-batch tokens-a-step MLP-budget-GB"
    case "$1" in
        d12) echo 64 524288 2.5 ;;
        d24) echo 32 131072 6.5 ;;
        d36) echo 16 131072 2.5 ;;
        d48) echo 16 131072 0 ;;
        *) echo "unknown model $1 (d12, d24, d36, d48)" >&2; exit 2 ;;
    esac
}
NGPU=$("$PYTHON" -c "import torch; print(torch.cuda.device_count())")
if [[ "$NGPU" -lt 1 ]]; then echo "no CUDA GPU visible; this benchmark needs one" >&2; exit 1; fi
# 1, then all visible GPUs when there are several (an if, not `&&`: under set -e a false test inside the
# assignment would end the script on a 1-GPU host)
if [[ -z "${GPUS:-}" ]]; then GPUS=1; if (( NGPU > 1 )); then GPUS="1 $NGPU"; fi; fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
source bench/smi_ids.sh  # smi_ids N: the GPUs a run on N GPUs uses, as nvidia-smi's -i names them

max_tokens=0
for model in $MODELS; do read -r _ tokens _ <<<"$(sizes "$model")"; (( tokens > max_tokens )) && max_tokens=$tokens; done
SHARDS=${SHARDS:-$OUT/shards}
"$PYTHON" - "$SHARDS" $(( (STEPS + 1) * max_tokens + 1 )) <<'EOF'
import sys
from pathlib import Path

import numpy as np

from data.shards import write_shard

out, ntrain = Path(sys.argv[1]), int(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)
for name, ntok in (("synthetic_val_000000.bin", 2**21 + 1), ("synthetic_train_000001.bin", ntrain)):
    if not (out / name).exists():
        write_shard(out / name, rng.integers(0, 50257, ntok, dtype=np.uint16))
EOF
TRAIN="$SHARDS/*_train_*.bin"
VAL="$SHARDS/*_val_*.bin"

llmc() {  # llmc MODEL B TOKENS NPROC
    [[ -n "${LLMC:-}" ]] || return 0
    echo "=== llm.c $1 on $4 GPU(s)"
    "$PYTHON" -m bench.peer_llmc --source "$LLMC" --model "$1" --batch-size "$2" --total-batch-size "$3" \
        --nproc "$4" --steps "$STEPS" --skip "$SKIP" --train-data "$TRAIN" --val-data "$VAL" \
        --out "$OUT/llmc_${1}_${4}gpu.json" 2>&1 | tee "$OUT/llmc_log_${1}_${4}gpu.txt" | grep -v "^step" || true
}

ours() {  # ours MODEL B TOKENS NPROC MLP-BUDGET-GB [gpt2.train flags]
    local model=$1 batch=$2 tokens=$3 nproc=$4 keep_post_gb=$5 dir="$OUT/run_${1}_${4}gpu"
    shift 5
    rm -rf "$dir"
    echo "=== gpt2.train $model on $nproc GPU(s) -> $dir"
    local entry=gpt2.train
    if [[ "${MEMORY_REPORT:-0}" == 1 ]]; then entry=bench.train_memory; export MEMORY_JSON="$dir.memory.json"; fi
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 -i "$(smi_ids "$nproc")" >"$dir.smi.txt" &
    local smi=$!
    "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node="$nproc" -m "$entry" \
        --model "$model" --batch-size "$batch" --seq-len 1024 --total-batch-size "$tokens" --max-steps "$STEPS" \
        --warmup-steps $(( STEPS / 4 )) --train-data "$TRAIN" --val-data "$VAL" --val-every 0 --hellaswag-every 0 \
        --sample-every 0 --checkpoint-every 0 --log-every 5 --out-dir "$dir" --no-resume \
        --keep-mlp-post-gb "$keep_post_gb" "$@" 2>&1 \
        | tee "$OUT/log_${model}_${nproc}gpu.txt" | grep -E "^\[memory|rror|^step +([0-9]*5|$STEPS)/" || true
    kill "$smi" 2>/dev/null || true
}

for model in $MODELS; do
    read -r batch tokens keep_post_gb <<<"$(sizes "$model")"
    for nproc in $GPUS; do
        for trainer in $TRAINERS; do
            if [[ $trainer == llmc ]]; then llmc "$model" "$batch" "$tokens" "$nproc"; fi
            if [[ $trainer == ours ]]; then ours "$model" "$batch" "$tokens" "$nproc" "$keep_post_gb" "$@"; fi
        done
    done
done

"$PYTHON" - "$OUT" "$SKIP" <<'EOF'
import datetime
import json
import statistics
import sys
from pathlib import Path

from common.files import write_json

out, skip = Path(sys.argv[1]), int(sys.argv[2])
rows, gpu, torch_version = [], None, None
for run_dir in sorted(out.glob("run_*_*gpu")):
    if not run_dir.is_dir() or not (run_dir / "metrics.jsonl").exists():
        continue
    settings = json.loads((run_dir / "config.json").read_text())
    resolved = settings["resolved"]
    gpu, torch_version = resolved.get("gpu"), resolved.get("torch")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "train"][skip:]
    if not steps:
        continue
    smi = Path(f"{run_dir}.smi.txt")
    readings = [int(x) for x in smi.read_text().split() if x.isdigit()] if smi.exists() else []
    ms = statistics.median(r["ms"] for r in steps)
    rows.append({"trainer": "gpt2.train", "model": settings["model"], "gpus": resolved["world_size"],
                 "step_ms": ms, "tokens_per_s": settings["total_batch_size"] / ms * 1e3,
                 "torch_peak_gib": max(r.get("peak_mem_gb", 0.0) for r in steps),
                 "nvidia_smi_peak_mib": max(readings, default=None), "timed_steps": len(steps)})
    if (accounting := Path(f"{run_dir}.memory.json")).exists():  # MEMORY_REPORT=1: the allocator's own peaks
        m = json.loads(accounting.read_text())
        rows[-1].update(torch_allocated_peak_mib=m["allocated_peak"] / 2**20,
                        torch_reserved_peak_mib=m["reserved_peak"] / 2**20)
for path in sorted(out.glob("llmc_*_*gpu.json")):
    p = json.loads(path.read_text())
    rows.append({"trainer": "llm.c", "model": p["model"], "gpus": p["gpus"], "step_ms": p["step_ms"],
                 "tokens_per_s": p["tokens_per_s"], "torch_peak_gib": None,
                 "nvidia_smi_peak_mib": round(p["nvidia_smi_peak_gb"] * 1e9 / 2**20), "timed_steps": p["timed_steps"]})
summary = {"gpu": gpu, "torch": torch_version,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "runs": rows}
print(f"\n{gpu} | torch {torch_version} | {summary['date']}")
print(f"{'model':<6} {'trainer':<11} {'GPUs':>4} {'ms/step':>9} {'tokens/s':>11} {'GiB torch':>9} {'MiB smi':>8}")
for r in sorted(rows, key=lambda r: (r["model"], r["gpus"], r["trainer"])):
    torch_gib = f"{r['torch_peak_gib']:.1f}" if r["torch_peak_gib"] is not None else ""
    print(f"{r['model']:<6} {r['trainer']:<11} {r['gpus']:>4} {r['step_ms']:>9.1f} {r['tokens_per_s']:>11,.0f} "
          f"{torch_gib:>9} {r['nvidia_smi_peak_mib'] or 0:>8}")
ratios = {}
for r in rows:
    peer = [p for p in rows if p["trainer"] == "llm.c" and (p["model"], p["gpus"]) == (r["model"], r["gpus"])]
    if r["trainer"] == "gpt2.train" and peer:
        key = f"{r['model']}_{r['gpus']}gpu"
        ratios[key] = peer[0]["step_ms"] / r["step_ms"]
        print(f"gpt2.train / llm.c, {r['model']} on {r['gpus']} GPU(s): {ratios[key]:.3f}x")
summary["vs_llmc"] = ratios
scaling = {}
for (trainer, model) in sorted({(r["trainer"], r["model"]) for r in rows}):
    by_gpus = {r["gpus"]: r for r in rows if (r["trainer"], r["model"]) == (trainer, model)}
    if 1 in by_gpus and (n := max(by_gpus)) > 1:  # tokens/s on n GPUs over n times that on 1
        per_gpu = by_gpus[n]["tokens_per_s"] / (n * by_gpus[1]["tokens_per_s"])
        scaling[f"{trainer}_{model}_{n}gpu"] = per_gpu
        print(f"scaling {n} GPUs / 1 GPU, {trainer} {model}: {n * per_gpu:.3f}x = {per_gpu:.3f} per GPU")
summary["scaling_per_gpu"] = scaling
write_json(out / "summary.json", summary)
print(f"written {out / 'summary.json'}")
EOF
