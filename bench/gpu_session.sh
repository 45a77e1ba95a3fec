#!/usr/bin/env bash
# Everything the kernel work measures on a GPU host, in one go:
# GPU facts, the kernel tests on CUDA, the in-run peer (build-nanogpt's train_gpt2.py, when PEER names
# a folder holding it), then the training-step benchmark with its profiles and numerics check, with
# each variant's ratio to the peer. Logs and JSON go to ${OUT:-artifacts/bench}.
#   PEER=path/to/build-nanogpt bench/gpu_session.sh [extra bench_train.py arguments]
# Where the `gpu` extra is installed (the optional FA4 and quack kernels; docs/gpu-run.md installs it on a
# host without a package registry), the variants kernels-sdpa-bwd and kernels-inductor-gelu measure each
# of its kernels against its absence.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-artifacts/bench}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# a fresh Inductor cache: its on-disk graphs do not key on our custom ops' schemas, so graphs cached
# by an older version of gpt2_kernels/ on a reused host would index the ops' outputs wrongly
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$(mktemp -d)}
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
$PY -m pytest tests/test_kernels_cross_entropy.py tests/test_kernels_layernorm.py tests/test_kernels_attention.py \
    tests/test_kernels_mlp.py tests/test_kernels_model.py \
    -q -x -m "not slow" -p no:cacheprovider --durations=5 2>&1 | tail -20 | tee "$OUT/tests.txt"
PEER_ARGS=()
if [[ -n "${PEER:-}" ]]; then
    $PY -m bench.peer_nanogpt --source "$PEER" --steps 30 --skip 10 --out "$OUT/peer.json" 2>&1 \
        | tee "$OUT/peer_log.txt" | tail -1
    [[ -f "$OUT/peer.json" ]] && PEER_ARGS=(--peer "$OUT/peer.json")
fi
$PY -m bench.bench_train --out "$OUT" "${PEER_ARGS[@]}" "$@" 2>&1 | tee "$OUT/bench_log.txt"
