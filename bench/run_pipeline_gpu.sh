#!/usr/bin/env bash
# The pipeline end to end on a GPU host, through Prefect, against gpt2.train alone, in one command:
#
#   bash bench/run_pipeline_gpu.sh
#
# 1. an offline corpus and HellaSwag-format file (bench/pipeline_gpu.py: a Markov chain over English
#    words, large enough for STEPS steps without repeating, plus a val shard);
# 2. a Prefect server, the work pool, every deployment, a worker; deployment runs gpt2-tokenize/gpu,
#    gpt2-hellaswag/gpu, gpt2-init/gpu, then gpt2-pretrain/gpu (all stages; the data ones from cache) with
#    gpt2-evaluate/scheduled every EVAL_INTERVAL seconds while it trains;
# 3. gpt2.train alone on the same host with the pipeline run's own training config;
# 4. $OUT/summary.json and summary.txt: tokens/s both ways, the scheduled evaluations' cost, losses, evals.
#
# The gpt2-pretrain/gpu deployment (prefect.yaml): d12, B=64, T=1024, 524,288 tokens per step, STEPS steps,
# torchrun on every visible GPU, val loss + HellaSwag + samples and a checkpoint every 100 steps, a final
# evaluation and samples. gpt2-evaluate/scheduled evaluates new checkpoints on the CPU (CUDA hidden): its
# cost to training is measured from the steps that ran during it. The project and Prefect must be
# installed in PYTHON's environment (docs/gpu-run.md: also on a host without a package registry).
#
# Environment: STEPS (default 300), ALONE_STEPS (gpt2.train alone runs only this many steps; default 60),
# SKIP (the first steps, compilation and warm-up, left out of tokens/s; default 10), EVAL_INTERVAL (default
# 60 s), MODE (gpu, or cpu-tiny: a tiny model on one CPU process and a tiny corpus,
# to check this script where no GPU is; defaults 40 steps, 20 alone, 15 s), PYTHON (default .venv/bin/python if present, else python3),
# OUT (default artifacts/gpu-run/out), PREFECT_PORT (default 4200). Logs: artifacts/gpu-run/logs.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    "") ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_pipeline_gpu.sh takes no arguments (settings come from the environment; see --help)" >&2; exit 2 ;;
esac
MODE=${MODE:-gpu}
WORK=artifacts/gpu-run  # prefect.yaml's gpu deployments read their corpus and HellaSwag file from here
OUT=${OUT:-$WORK/out}
PORT=${PREFECT_PORT:-4200}
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
python=$PYTHON
prefect=("$python" -m prefect)
rm -rf "$WORK/logs" "$WORK/alone" "$WORK/flow_runs.json"
mkdir -p "$WORK/logs" "$OUT"
export PREFECT_HOME="$PWD/$WORK/prefect" PREFECT_API_URL="http://127.0.0.1:$PORT/api"
export PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS=10
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1

if [ "$MODE" = gpu ]; then
    STEPS=${STEPS:-300} ALONE_STEPS=${ALONE_STEPS:-60} EVAL_INTERVAL=${EVAL_INTERVAL:-60}
    TOKENS_PER_STEP=524288 SHARD_SIZE=20000000 HELLASWAG_EXAMPLES=200
    RUN_NAME=gpu DATASET=synthetic
    PARAMS=(--param "max_steps=$STEPS")
else  # cpu-tiny: the same steps on a tiny model, one CPU process
    STEPS=${STEPS:-40} ALONE_STEPS=${ALONE_STEPS:-20} EVAL_INTERVAL=${EVAL_INTERVAL:-15}
    # large shards, so that the last train shard holds far more than one step: the loader refuses a shorter
    # one (8192-token shards left the 40-step corpus a last shard of 30 tokens)
    TOKENS_PER_STEP=128 SHARD_SIZE=65536 HELLASWAG_EXAMPLES=20
    RUN_NAME=gpu-tiny DATASET=synthetic-tiny
    every=$(( STEPS / 2 > 1 ? STEPS / 2 : 1 ))  # two evaluations and checkpoints in the run, whatever STEPS
    PARAMS=(--param "max_steps=$STEPS" --param "model=n_layer=2,n_head=2,n_embd=64,block_size=64"
            --param batch_size=4 --param seq_len=32 --param total_batch_size=128 --param warmup_steps=2
            --param "val_every=$every" --param val_steps=2 --param "hellaswag_every=$every"
            --param "sample_every=$every" --param sample_tokens=16 --param "checkpoint_every=$every"
            --param device=cpu --param nproc=1 --param 'eval={"device": "cpu"}' --param num_samples=2)
fi
PARAMS+=(--param "run_name=$RUN_NAME" --param "dataset=$DATASET" --param "shard_size=$SHARD_SIZE")
log() { echo "[gpu-run $(date -u +%H:%M:%S)] $*"; }

ngpu() { "$python" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"; }

make_inputs() {
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
    setsid "${prefect[@]}" server start --host 127.0.0.1 --port "$PORT" >>"$WORK/logs/server.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 120); do
        "$python" -c "import urllib.request; urllib.request.urlopen('$PREFECT_API_URL/health', timeout=2)" 2>/dev/null && break
        kill -0 "$server_pid" 2>/dev/null || { tail -20 "$WORK/logs/server.log"; exit 1; }
        sleep 1
    done
    "${prefect[@]}" work-pool create gpt2-local --type process --overwrite >/dev/null
    "${prefect[@]}" --no-prompt deploy --all >>"$WORK/logs/deploy.log" 2>&1 || { tail -30 "$WORK/logs/deploy.log"; exit 1; }
    setsid "${prefect[@]}" worker start --pool gpt2-local >>"$WORK/logs/worker.log" 2>&1 &
    worker_pid=$!
}
stop_prefect() {
    if [ -n "$worker_pid" ]; then kill -9 "$worker_pid" 2>/dev/null || true; wait "$worker_pid" 2>/dev/null || true; fi
    if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
    worker_pid= server_pid=
}
trap stop_prefect EXIT

deployment_run() {  # deployment_run NAME ARGS...: run it to the end, its output in logs/NAME.log
    local name=$1 logfile="$WORK/logs/${1//\//_}.log"
    shift
    log "prefect deployment run $name $*"
    if ! "${prefect[@]}" deployment run "$name" --watch "$@" >"$logfile" 2>&1; then
        grep -v prefect.artifact "$logfile" | tail -40
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
        client.set_flow_run_state(run.id, Cancelled(message="the pipeline run is over"), force=True)
    deadline = time.monotonic() + 60
    while runs(client, StateType.RUNNING) and time.monotonic() < deadline:
        time.sleep(2)
PY
}

run_pipeline() {
    start_prefect
    local stage
    for stage in tokenize hellaswag init; do
        deployment_run "gpt2-$stage/gpu" "${PARAMS[@]}"
    done
    # the scheduled evaluation every EVAL_INTERVAL seconds while training runs (prefect.yaml: every 600 s)
    "${prefect[@]}" deployment schedule clear gpt2-evaluate/scheduled --accept-yes >/dev/null
    "${prefect[@]}" deployment schedule create gpt2-evaluate/scheduled --interval "$EVAL_INTERVAL" >/dev/null
    log "GPUs visible: $(ngpu); gpt2-evaluate/scheduled every $EVAL_INTERVAL s"
    local status=0
    deployment_run gpt2-pretrain/gpu "${PARAMS[@]}" || status=$?
    "${prefect[@]}" deployment schedule clear gpt2-evaluate/scheduled --accept-yes >/dev/null
    finish_scheduled_evaluations
    save_flow_runs
    stop_prefect
    return $status
}

# The newest run directory of RUN_NAME (empty when there is none). Without `|| true`, ls's status 2 for
# a pattern that matched nothing would, under pipefail and set -e, end the script right here.
latest_run_dir() { ls -dt artifacts/runs/"$RUN_NAME"/*/ 2>/dev/null | head -1 || true; }

train_alone() {  # train_alone RUN_DIR
    local nproc
    nproc=$(ngpu); [ "$nproc" -ge 1 ] || nproc=1
    log "gpt2.train alone on $nproc process(es), the config of $1, $ALONE_STEPS steps"
    "$python" -m torch.distributed.run --standalone --nproc-per-node="$nproc" -m gpt2.train \
        --config "$1/launch_config.json" --out-dir "$WORK/alone" --no-resume \
        --max-steps "$ALONE_STEPS" --warmup-steps "$(( ALONE_STEPS / 4 ))" \
        >"$WORK/logs/train_alone.log" 2>&1 || { tail -40 "$WORK/logs/train_alone.log"; exit 1; }
    tail -3 "$WORK/logs/train_alone.log"
}

report() {  # report RUN_DIR
    "$python" -m bench.pipeline_gpu report --pipeline-run "$1" --alone-run "$WORK/alone" \
        --flow-runs "$WORK/flow_runs.json" --out "$OUT" --skip "${SKIP:-10}" | tee "$OUT/summary.txt"
    cp "$1/loss_curve.png" "$OUT/" 2>/dev/null || true
    if command -v nvidia-smi >/dev/null; then nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true; fi
    log "outputs in $OUT: $(ls "$OUT" | tr '\n' ' ')"
}

make_inputs
run_pipeline
run_dir=$(latest_run_dir)
[ -n "$run_dir" ] || { log "the pipeline left no run under artifacts/runs/$RUN_NAME"; exit 1; }
train_alone "$run_dir"
report "$run_dir"
