#!/usr/bin/env bash
# The long cross-check against llm.c's own trainer, on one GPU: the same real text, shards, bf16 init and
# recipe (d12, B=16, T=1024, 65,536 tokens/step, lr 6e-4, 100 warmup steps, cosine to 0, wd 0.1, clip 1.0,
# val every 250 steps over 20 batches) through llm.c's train_gpt2cu (bf16, no cuDNN) and through
# python -m gpt2.train at its defaults (so in llm.c's training order); then per-step train losses side by side.
# Two noise runs measure how far equally valid bf16 arithmetic moves the same run: ours with --no-kernels
# (PyTorch's own kernels instead of gpt2_kernels/) and llm.c with -ge 2 (GELU fused into its matmuls).
#
#   LLMC=path/to/llm.c bench/crosscheck_llmc.sh [PHASE ...]
#
# Phases, in order (default: all): build (train_gpt2cu from $LLMC, in the background while prepare runs),
# prepare, llmc, ours, noise-ours, noise-llmc, noise-llmc-seed, compare. Each phase skips work whose output exists, so
# the phases can be split over several sessions sharing WORK.
# Environment: LLMC (llm.c's source tree; build only), WORK (shards, init, builds, runs; default
# /tmp/crosscheck-llmc), OUT (logs and the comparison; default artifacts/bench/crosscheck-llmc), STEPS
# (default 1000), NOISE_STEPS (default STEPS), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
WORK=${WORK:-/tmp/crosscheck-llmc}
OUT=${OUT:-artifacts/bench/crosscheck-llmc}
STEPS=${STEPS:-1000}
NOISE_STEPS=${NOISE_STEPS:-$STEPS}
PY=${PYTHON:-python3}
PHASES=${*:-build prepare llmc ours noise-ours noise-llmc noise-llmc-seed compare}
mkdir -p "$WORK" "$OUT"
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$WORK/inductor}
TRAIN="$WORK/shards/*_train_*.bin"
VAL="$WORK/shards/*_val_*.bin"
has() { [[ " $PHASES " == *" $1 "* ]]; }

build_llmc() {  # build_llmc DIR [ROUNDING_SEED]: llm.c's train_gpt2cu, bf16, one GPU, in $WORK/DIR.
    # CUDA 13 changed cudaMemAdvise, which only its out-of-memory fallback to managed memory uses: that
    # fallback becomes an error exit. ROUNDING_SEED replaces the seed of its stochastic rounding (13371337),
    # for a noise run that differs from llm.c's own in the rounding's random bits alone.
    local dir=$WORK/$1 seed=${2:-}
    [[ -x "$dir/train_gpt2cu" ]] && return
    rm -rf "$dir" && cp -r "$LLMC" "$dir"
    "$PY" - "$dir" "$seed" <<'EOF'
import re, sys
tree, seed = sys.argv[1], sys.argv[2]
path = f"{tree}/llmc/cuda_utils.cuh"
text = open(path).read()
fallback = re.compile(r"cudaCheck_\(cudaMallocManaged\(.*?return 1;", re.S)
assert fallback.search(text), f"{path}: the managed-memory fallback was not found"
open(path, "w").write(fallback.sub('fprintf(stderr, "out of GPU memory\\\\n"); exit(EXIT_FAILURE);', text))
if seed:
    path = f"{tree}/train_gpt2.cu"
    text = open(path).read()
    assert "model->rng_state = 13371337 +" in text, f"{path}: the stochastic rounding's seed was not found"
    open(path, "w").write(text.replace("model->rng_state = 13371337 +", f"model->rng_state = {seed} +", 1))
EOF
    make -C "$dir" train_gpt2cu PRECISION=BF16 USE_CUDNN=0 NO_MULTI_GPU=1 NO_USE_MPI=1 \
        GPU_COMPUTE_CAPABILITY=90 > "$OUT/$1_build.log" 2>&1
}

run_llmc() {  # run_llmc BUILD NAME STEPS [extra flags]: llm.c's flags for the recipe above
    local build=$1 name=$2 steps=$3; shift 3
    [[ -s "$OUT/$name.log" ]] && grep -q "^step *$steps/$steps " "$OUT/$name.log" && return
    "$WORK/$build/train_gpt2cu" -i "$TRAIN" -j "$VAL" -e "$WORK/init_bf16.bin" -o "$WORK/$name" \
        -b 16 -t 1024 -d 65536 -l 0.0006 -u 100 -q 0.0 -c 0.1 -x "$steps" -v 250 -m 20 -s 0 -h 0 -n 0 -y 0 \
        "$@" > "$OUT/$name.log" 2>&1
}

run_ours() {  # run_ours NAME STEPS [extra flags]: gpt2.train's defaults but for this recipe's length and batch
    local name=$1 steps=$2; shift 2
    [[ -f "$WORK/$name/metrics.jsonl" ]] && [[ $(grep -c '"kind": "train"' "$WORK/$name/metrics.jsonl") -ge $steps ]] \
        && return
    "$PY" -m gpt2.train --model d12 --batch-size 16 --seq-len 1024 --total-batch-size 65536 --max-steps "$steps" \
        --warmup-steps 100 --train-data "$TRAIN" --val-data "$VAL" --val-every 250 --val-steps 20 \
        --hellaswag-every 0 --sample-every 0 --checkpoint-every 0 --log-every 50 \
        --init-from "$WORK/init_bf16.bin" --out-dir "$WORK/$name" --no-resume "$@" > "$OUT/$name.log" 2>&1
    cp "$WORK/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl"
}

phase() { echo "[crosscheck] $(date -u +%H:%M:%S) $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
if has build; then
    phase "build llm.c (background)"
    { build_llmc llmc && if has noise-llmc-seed; then build_llmc llmc_seed 13371338; fi; } & BUILD=$!
fi
if has prepare; then
    phase "prepare"
    [[ -f "$WORK/init_bf16.bin" ]] || "$PY" -m bench.crosscheck_llmc prepare --work "$WORK" | tee "$OUT/prepare.log"
fi
if has build; then wait "$BUILD" || { tail -30 "$OUT/llmc_build.log"; exit 1; }; phase "llm.c built"; fi
has llmc && { phase "llm.c, $STEPS steps"; run_llmc llmc llmc "$STEPS"; }
has ours && { phase "ours, $STEPS steps"; run_ours ours "$STEPS"; }
has noise-ours && { phase "ours --no-kernels, $NOISE_STEPS steps"; run_ours ours_nokernels "$NOISE_STEPS" --no-kernels; }
has noise-llmc && { phase "llm.c -ge 2, $NOISE_STEPS steps"; run_llmc llmc llmc_ge2 "$NOISE_STEPS" -ge 2 || true; }
has noise-llmc-seed && { phase "llm.c, another rounding seed, $NOISE_STEPS steps"; run_llmc llmc_seed llmc_seed "$NOISE_STEPS"; }
if has compare; then
    phase "compare"
    noise=()
    [[ -f "$OUT/ours_nokernels.metrics.jsonl" ]] && noise+=(--noise "ours_nokernels=$OUT/ours_nokernels.metrics.jsonl")
    for run in llmc_ge2 llmc_seed; do
        [[ -f "$OUT/$run.log" ]] && grep -q "^step " "$OUT/$run.log" && noise+=(--noise "$run=$OUT/$run.log")
    done
    "$PY" -m bench.crosscheck_llmc compare --llmc "$OUT/llmc.log" --ours "$OUT/ours.metrics.jsonl" "${noise[@]}" --out "$OUT" \
        | tee "$OUT/compare.txt"
fi
phase done
