#!/usr/bin/env bash
# The main job in one command: a local Prefect server (its database under .prefect/), the process work
# pool, every deployment of prefect.yaml, a worker, then one deployment run, watched to the end.
#
#   bash scripts/run.sh                                   # gpt2-pretrain/smoke: offline, CPU, minutes
#   bash scripts/run.sh gpt2-pretrain/gpt2-124m           # llm.c's 124M run on FineWeb (GPU host, online)
#   bash scripts/run.sh gpt2-tokenize/smoke --param force=true
#
#   bash scripts/run.sh gpt2-pretrain/smoke --param max_steps=30    # one setting changed, the others kept
#
# Environment: PREFECT_PORT (default 4200), KEEP_RUNNING=1 (leave server and worker up for the UI, the
# scheduled evaluation and `prefect deployment run`: `source .prefect/env.sh` points a shell at them),
# PREFECT_API_DATABASE_CONNECTION_URL (e.g. postgresql+asyncpg://user:pw@host/db: the same server on
# PostgreSQL instead of SQLite; docs/pipeline.md).
# Ctrl-C or SIGTERM cancels the flow run (its training processes stop with it), then stops server and worker.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
    echo
    echo "usage: bash scripts/run.sh [DEPLOYMENT] [prefect deployment run options, e.g. --param key=value]"
}
case "${1:-}" in -h|--help) usage; exit 0 ;; esac
DEPLOYMENT=${1:-gpt2-pretrain/smoke}
shift $(( $# > 0 ? 1 : 0 ))

bash scripts/setup.sh

export PREFECT_HOME="$PWD/.prefect"  # SQLite database, result cache, logs: all inside the project
PORT=${PREFECT_PORT:-4200}
export PREFECT_API_URL="http://127.0.0.1:$PORT/api"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
mkdir -p "$PREFECT_HOME"
prefect=(.venv/bin/prefect)
python=.venv/bin/python

if "$python" -c "import socket,sys; s=socket.socket(); sys.exit(s.connect_ex(('127.0.0.1', $PORT)) != 0)"; then
    echo "[run] port $PORT is taken (another Prefect server?); set PREFECT_PORT to a free port" >&2
    exit 1
fi

# stop PID GRACE_S: SIGTERM, SIGKILL after GRACE_S seconds, then reap it. Callers send stop's stderr to
# /dev/null: bash reports a background job killed by a signal ("PID Killed ... worker start") on that stream.
stop() {
    kill "$1" 2>/dev/null || return 0
    for _ in $(seq "$2"); do
        kill -0 "$1" 2>/dev/null || break
        sleep 1
    done
    kill -9 "$1" 2>/dev/null || true
    wait "$1" || true
}

server_pid= worker_pid= watch_pid=
ENV_FILE="$PREFECT_HOME/env.sh"
cleanup() {
    if [ -n "$watch_pid" ]; then kill "$watch_pid" 2>/dev/null || true; fi
    if [ "${KEEP_RUNNING:-0}" = 1 ]; then
        echo "[run] left running: server (pid $server_pid) and worker (pid $worker_pid);" \
             "stop them with: kill -9 $worker_pid; kill $server_pid"
        echo "[run] reach them from a shell with: source .prefect/env.sh"
        return
    fi
    rm -f "$ENV_FILE"
    # The worker first: it only needs the server while it shuts down. Prefect 3.8's worker answers SIGTERM
    # by sending itself SIGINT, which does not stop it (a background job of a script even ignores SIGINT),
    # and a second SIGTERM makes it SIGKILL itself: so it gets a short grace, then SIGKILL. Once the watched
    # flow run has finished, the worker has nothing left to do.
    if [ -n "$worker_pid" ]; then stop "$worker_pid" 3 2>/dev/null; fi
    if [ -n "$server_pid" ]; then stop "$server_pid" 20 2>/dev/null; fi
}
trap cleanup EXIT

# the flow run's state type once it is final (COMPLETED, FAILED, CANCELLED, CRASHED), else nothing
final_state() {
    "$python" - "$1" <<'PY' 2>/dev/null || true
import json, os, sys, urllib.request
with urllib.request.urlopen(f"{os.environ['PREFECT_API_URL']}/flow_runs/{sys.argv[1]}", timeout=5) as r:
    state = json.load(r)["state"]["type"]
if state in ("COMPLETED", "FAILED", "CANCELLED", "CRASHED"):
    print(state)
PY
}

# Ctrl-C / SIGTERM: cancel the flow run through the API, so the worker stops its process (and with it
# torchrun and the ranks: tasks/launch.py) and the run ends Cancelled; then cleanup stops worker and server.
interrupted() {
    trap - INT TERM
    local flow_run_id
    flow_run_id=$(grep -oE 'UUID: [0-9a-f-]{36}' "$PREFECT_HOME/watch.log" 2>/dev/null | head -1 | cut -d' ' -f2 || true)
    if [ -n "$flow_run_id" ] && [ -n "$worker_pid" ]; then
        echo "[run] interrupted: cancelling flow run $flow_run_id" >&2
        "${prefect[@]}" flow-run cancel "$flow_run_id" >/dev/null 2>&1 || true
        for _ in $(seq 60); do
            state=$(final_state "$flow_run_id")
            if [ -n "$state" ]; then echo "[run] flow run $flow_run_id: $state" >&2; break; fi
            sleep 1
        done
    fi
    exit 130
}
trap interrupted INT TERM

# Server and worker get sessions of their own (setsid): a terminal's Ctrl-C reaches only this script,
# which cancels the flow run through them before stopping them.
echo "[run] starting the Prefect server on port $PORT (log: .prefect/server.log)"
setsid "${prefect[@]}" server start --host 127.0.0.1 --port "$PORT" >"$PREFECT_HOME/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 120); do
    if "$python" -c "import urllib.request; urllib.request.urlopen('$PREFECT_API_URL/health', timeout=2)" 2>/dev/null; then
        break
    fi
    if ! kill -0 "$server_pid" 2>/dev/null; then
        echo "[run] the server exited; see .prefect/server.log" >&2
        tail -20 "$PREFECT_HOME/server.log" >&2
        exit 1
    fi
    sleep 1
done

cat >"$ENV_FILE" <<EOF
# source .prefect/env.sh: this shell then reaches the Prefect server scripts/run.sh started (KEEP_RUNNING=1)
export PREFECT_HOME="$PREFECT_HOME"
export PREFECT_API_URL="$PREFECT_API_URL"
export PATH="$PWD/.venv/bin:\$PATH"
EOF

echo "[run] work pool gpt2-local (process) and deployments"
"${prefect[@]}" work-pool create gpt2-local --type process --overwrite >/dev/null
"${prefect[@]}" --no-prompt deploy --all >"$PREFECT_HOME/deploy.log" 2>&1 || {
    cat "$PREFECT_HOME/deploy.log" >&2
    exit 1
}

echo "[run] starting a worker (log: .prefect/worker.log)"
setsid "${prefect[@]}" worker start --pool gpt2-local >"$PREFECT_HOME/worker.log" 2>&1 &
worker_pid=$!

echo "[run] prefect deployment run $DEPLOYMENT --watch $*"
status=0
# In the background, so that a SIGTERM is handled at once (bash runs a trap only after the foreground
# command ends); its output goes to a file (the flow run id is read from it) and is shown from there.
rm -f "$PREFECT_HOME/watch.log"
"${prefect[@]}" deployment run "$DEPLOYMENT" --watch "$@" >"$PREFECT_HOME/watch.log" 2>&1 &
watch_pid=$!
# --watch also prints every event; the progress artifact's updates would drown the rest
tail -n +1 -F --pid="$watch_pid" "$PREFECT_HOME/watch.log" 2>/dev/null | grep --line-buffered -v prefect.artifact &
show_pid=$!
wait "$watch_pid" || status=$?
watch_pid=
wait "$show_pid" || true

cat <<EOF

[run] $DEPLOYMENT finished with exit code $status
  outputs:      $PWD/artifacts/  (data/ shards, eval/ HellaSwag, init/ step-0 weights, runs/ training runs)
  TensorBoard:  .venv/bin/tensorboard --logdir $PWD/artifacts/runs
  loss curves:  artifacts/runs/<run_name>/<run id>/loss_curve.png
  Prefect UI:   http://127.0.0.1:$PORT  (flow runs, logs, artifacts; up while this script runs or with KEEP_RUNNING=1)
  flow logs:    .prefect/worker.log
EOF
exit "$status"
