#!/usr/bin/env bash
# PYTHON for bench/run_llmc_gpu.sh in calls B and C (a copy of 2026-11-29 folder 8's): python3, except that a torchrun training run is stopped (SIGTERM
# to torchrun, which stops its workers) once its metrics.jsonl holds all --max-steps train records, so that the
# final checkpoint (30 GB at d48), no part of the timed steps, is not written; then waits for the GPUs to be free.
if [[ "${1:-}" != -m || "${2:-}" != torch.distributed.run ]]; then exec python3 "$@"; fi
args=("$@"); dir=; steps=
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[i]}" in --out-dir) dir=${args[i + 1]} ;; --max-steps) steps=${args[i + 1]} ;; esac
done
python3 "$@" & pid=$!
while kill -0 "$pid" 2>/dev/null; do
    n=$(grep -c '"kind": "train"' "$dir/metrics.jsonl" 2>/dev/null); n=${n:-0}
    if [[ -n "$steps" ]] && (( n >= steps )); then
        sleep 1; echo "stop_after_steps: $n train records in $dir/metrics.jsonl; stopping torchrun $pid ($(date -u +%T))"
        kill -TERM "$pid"; break
    fi
    sleep 1
done
wait "$pid"; rc=$?
for _ in $(seq 60); do [[ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)" ]] && break; sleep 1; done
exit $rc
