#!/usr/bin/env bash
# The main job in one command: a local Prefect server (its database under .prefect/), the process work
# pool, every deployment of prefect.yaml, a worker, then one deployment run, followed to the end.
#
#   bash scripts/run.sh                                   # gpt2-pretrain/smoke: offline, CPU, minutes
#   bash scripts/run.sh gpt2-pretrain/gpt2-124m           # llm.c's 124M run on FineWeb (GPU host, online)
#   bash scripts/run.sh gpt2-tokenize/smoke --param force=true     # rerun one stage
#   bash scripts/run.sh gpt2-pretrain/smoke --param max_steps=30   # one setting changed, the others kept
#
# DEPLOYMENT is FLOW/NAME (default gpt2-pretrain/smoke); a name the server does not hold is refused with the
# valid ones listed. Several run.sh of one folder at a time share one server and worker; the last to finish
# stops them.
# Environment: PREFECT_PORT (default 4200, else the first free port after it), KEEP_RUNNING=1 (leave server and
# worker up for the UI, the scheduled evaluation and more runs: a later run.sh uses them instead of starting its own,
# `source .prefect/env.sh` points a shell's `prefect` at them, `bash scripts/stop.sh` stops them),
# PREFECT_API_DATABASE_CONNECTION_URL (e.g. postgresql+asyncpg://user:pw@host/db: the same server on
# PostgreSQL instead of SQLite; docs/pipeline.md), RUN_START_WITHIN_S (default 120: a run no worker has started
# that many seconds after its start time is given up, NotStarted in one line, and cancelled).
# Shown: one line per state change of the run and its stages, a training progress line every 10 s; a run
# that completes ends with what it made (run folder, val loss, HellaSwag), one that fails with its error and id.
# Ctrl-C or SIGTERM cancels the flow run (its training processes stop with it), then leaves the server and
# worker as any end of run.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
    sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
    echo
    echo "usage: bash scripts/run.sh [DEPLOYMENT] [prefect deployment run options, e.g. --param key=value]"
}
case "${1:-}" in -h|--help) usage; exit 0 ;; esac
DEPLOYMENT=gpt2-pretrain/smoke
if [ $# -gt 0 ] && [[ $1 != -* ]]; then DEPLOYMENT=$1; shift; fi  # options alone: the default deployment

export PREFECT_HOME="$PWD/.prefect"  # SQLite database, result cache, logs: all inside the project
ENV_FILE="$PREFECT_HOME/env.sh"
# shellcheck source=scripts/kept.sh
source scripts/kept.sh  # the server and worker of this folder, shared by every run.sh, and their lock

# port_taken PORT: succeeds when something on this host accepts connections on PORT (bash alone: this runs
# before scripts/setup.sh has made .venv)
port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The port, before set-up (minutes on a fresh clone): a server of this folder already up is joined whatever its
# port; otherwise PREFECT_PORT, refused at once when taken, or 4200, or the first free port after it.
PORT=${PREFECT_PORT:-4200}
if ! { [ -f "$ENV_FILE" ] && kept_pid server >/dev/null; } && port_taken "$PORT"; then
    if [ -n "${PREFECT_PORT:-}" ]; then
        echo "error: PortTaken: PREFECT_PORT=$PORT is in use (another Prefect server?); set PREFECT_PORT to a free" \
             "port, or leave it unset to have one chosen" >&2
        exit 1
    fi
    while port_taken "$PORT"; do PORT=$((PORT + 1)); done
    echo "[run] port 4200 is taken: this run's Prefect server uses port $PORT (PREFECT_PORT chooses one)"
fi

bash scripts/setup.sh
.venv/bin/python -m flows.deployments "$DEPLOYMENT" || exit 2  # a misspelled name, before any server starts

export PREFECT_API_URL="http://127.0.0.1:$PORT/api"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
mkdir -p "$PREFECT_HOME"
prefect=(.venv/bin/prefect)
python=.venv/bin/python

# last_line LOG: its last line that is not blank (a traceback's: the error), for a one-line report naming the log
last_line() { grep -v '^[[:space:]]*$' "$1" | tail -1; }

# Logs are appended to, never truncated; each start adds a line naming it. Prints the log's path.
log_to() {
    echo "==== $(date -u +%Y-%m-%dT%H:%M:%SZ) scripts/run.sh $DEPLOYMENT ====" >>"$PREFECT_HOME/$1"
    echo "$PREFECT_HOME/$1"
}

server_pid= worker_pid= watch_pid= flow_run_id= started_server=0
# Leave the server and worker: the last run.sh using them stops them, unless they are kept (KEEP_RUNNING=1).
cleanup() {
    if [ -n "$watch_pid" ]; then kill "$watch_pid" 2>/dev/null || true; fi
    flock -u 9 2>/dev/null || true  # held until the run started; the watcher, which shares it, may still be exiting
    [ -n "$server_pid" ] || return 0
    take_kept_lock run
    rm -f "$PREFECT_HOME/users/$$"
    local others running
    others=$(kept_users | tr '\n' ' ')
    running=$(kept_running)  # what is alive now: the server may have died (or been restarted by someone else)
    if [ -z "$running" ] && { [ -f "$PREFECT_HOME/keep" ] || [ -n "$others" ]; }; then
        echo "[run] neither the server nor the worker is running any more"
    elif [ -f "$PREFECT_HOME/keep" ]; then
        echo "[run] left running: $running; stop them with: bash scripts/stop.sh"
        echo "[run] reach them from a shell with: source .prefect/env.sh"
    elif [ -n "$others" ]; then
        echo "[run] left running for the other scripts/run.sh using them (${others% }): $running"
    else
        # stderr too: bash reports a background job killed by a signal ("PID Killed ... worker start") there;
        # `wait` only waits for this script's own children, stopped by now
        { stop_all_kept >/dev/null; wait "$worker_pid" "$server_pid" || true; } 2>/dev/null
    fi
}
trap cleanup EXIT

# Ctrl-C / SIGTERM: cancel the flow run through the API, so the worker stops its process (and with it
# torchrun and the ranks: tasks/launch.py) and the run ends Cancelled; then cleanup stops worker and server.
# flows.cancel gives up after 90 s (a server that does not answer): cleanup's stop of the worker then takes
# the flow run's processes with it, so this script always ends and leaves nothing running.
interrupted() {
    trap - INT TERM
    if [ -n "$flow_run_id" ] && [ -n "$worker_pid" ]; then
        echo "[run] interrupted: cancelling flow run $flow_run_id" >&2
        "$python" -m flows.cancel "$flow_run_id" || true
    fi
    exit 130
}
trap interrupted INT TERM

healthy() {
    "$python" -c "import urllib.request; urllib.request.urlopen('$1/health', timeout=2)" 2>/dev/null
}

# One script at a time starts or joins the server and worker, deploys, and registers as their user.
take_kept_lock run
if [ -f "$ENV_FILE" ] && server_pid=$(kept_pid server) && healthy "$(sed -n 's/^export PREFECT_API_URL="\(.*\)"$/\1/p' "$ENV_FILE")"; then
    # shellcheck source=/dev/null
    source "$ENV_FILE"
    PORT=${PREFECT_API_URL##*:}; PORT=${PORT%%/*}
    echo "[run] using the server already running (pid $server_pid) at $PREFECT_API_URL"
else
    server_pid= started_server=1
    if [ -f "$PREFECT_HOME/keep" ]; then
        echo "[run] the Prefect server kept by KEEP_RUNNING=1 is no longer running; this run starts one, which" \
             "stops at its end unless KEEP_RUNNING=1 is set again"
        rm -f "$PREFECT_HOME/keep"
    fi
    if port_taken "$PORT"; then  # taken during set-up
        echo "error: PortTaken: port $PORT was taken while this script set up (another Prefect server?); set" \
             "PREFECT_PORT to a free port" >&2
        exit 1
    fi
    # Server and worker get sessions of their own (setsid): a terminal's Ctrl-C reaches only this script,
    # which cancels the flow run through them before stopping them.
    echo "[run] starting the Prefect server on port $PORT (log: .prefect/server.log)"
    server_log=$(log_to server.log)
    setsid "${prefect[@]}" server start --host 127.0.0.1 --port "$PORT" >>"$server_log" 2>&1 9>&- &
    server_pid=$!
    echo "$server_pid" >"$PREFECT_HOME/server.pid"
    for _ in $(seq 120); do
        if healthy "$PREFECT_API_URL"; then break; fi
        if ! kill -0 "$server_pid" 2>/dev/null; then break; fi
        sleep 1
    done
    if ! healthy "$PREFECT_API_URL"; then
        echo "error: ServerDidNotStart: the Prefect server did not come up on port $PORT: $(last_line "$server_log")" \
             "(its log: .prefect/server.log)" >&2
        exit 1
    fi
    # Kept after the server stops (scripts/stop.sh): sourced then, it changes nothing and says what to do.
    cat >"$ENV_FILE" <<EOF
# source .prefect/env.sh: this shell's \`prefect\` then reaches the Prefect server scripts/run.sh started
# (KEEP_RUNNING=1), with .venv/bin on PATH; when that server is gone it changes nothing and says so
if ! "$PWD/$python" -c "import urllib.request; urllib.request.urlopen('$PREFECT_API_URL/health', timeout=3)" 2>/dev/null; then
    echo "error: no Prefect server answers at $PREFECT_API_URL; start one with: KEEP_RUNNING=1 bash scripts/run.sh" >&2
    return 1 2>/dev/null || exit 1
fi
export PREFECT_HOME="$PREFECT_HOME"
export PREFECT_API_URL="$PREFECT_API_URL"
export PATH="$PWD/.venv/bin:\$PATH"
EOF
fi
if [ "${KEEP_RUNNING:-0}" = 1 ]; then touch "$PREFECT_HOME/keep"; fi

# A server of this run's own gets the pool and the deployments; a kept one only when prefect.yaml changed
# since it got them (the worker runs the flows' code from this folder as it is, so code needs no deploy).
DEPLOYED="$PREFECT_HOME/deployed.sha256"
if [ "$started_server" = 0 ] && sha256sum --quiet --check "$DEPLOYED" >/dev/null 2>&1; then
    echo "[run] deployments: as deployed to this server (prefect.yaml unchanged)"
else
    echo "[run] work pool gpt2-local (process) and deployments"
    rm -f "$DEPLOYED"
    deploy_log=$(log_to deploy.log)
    "${prefect[@]}" work-pool create gpt2-local --type process --overwrite >>"$deploy_log" 2>&1 || {
        echo "error: DeployFailed: prefect work-pool create gpt2-local failed: $(last_line "$deploy_log")" \
             "(its log: .prefect/deploy.log)" >&2
        exit 1
    }
    "${prefect[@]}" --no-prompt deploy --all >>"$deploy_log" 2>&1 || {
        echo "error: DeployFailed: prefect deploy --all failed: $(last_line "$deploy_log") (its log: .prefect/deploy.log)" >&2
        exit 1
    }
    sha256sum prefect.yaml >"$DEPLOYED"
fi

if worker_pid=$(kept_pid worker); then
    echo "[run] using the worker already running (pid $worker_pid)"
else
    echo "[run] starting a worker (log: .prefect/worker.log)"
    worker_log=$(log_to worker.log)
    # it asks the server for runs to start every 2 s (Prefect's default is 10 s: most of a short run's wait)
    PREFECT_WORKER_QUERY_SECONDS=${PREFECT_WORKER_QUERY_SECONDS:-2} \
        setsid "${prefect[@]}" worker start --pool gpt2-local >>"$worker_log" 2>&1 9>&- &
    worker_pid=$!
    echo "$worker_pid" >"$PREFECT_HOME/worker.pid"
fi
mkdir -p "$PREFECT_HOME/users"
touch "$PREFECT_HOME/users/$$"
# The lock stays held until a worker has started the flow run (flows.watch --release-fd releases it): a
# scripts/stop.sh meanwhile waits, rather than stopping the worker between the submission and the start, which
# left a run Pending that no worker ever picks up.

echo "[run] prefect deployment run $DEPLOYMENT $*"
submit_log=$(log_to submit.log)
created=$("${prefect[@]}" deployment run "$DEPLOYMENT" "$@" 2>&1) || {
    echo "$created" >>"$submit_log"
    echo "error: SubmitFailed: prefect deployment run $DEPLOYMENT failed: $(last_line "$submit_log")" \
         "(its whole output: .prefect/submit.log)" >&2
    exit 1
}
flow_run_id=$(grep -oE 'UUID: [0-9a-f-]{36}' <<<"$created" | head -1 | cut -d' ' -f2)
echo "[run] flow run $flow_run_id (UI while it runs: http://127.0.0.1:$PORT/runs/flow-run/$flow_run_id)"
status=0
# In the background, so that a SIGTERM is handled at once (bash runs a trap only after the foreground
# command ends). It outlives a server outage; it exits 0 or 1 only once it saw the run end (flows/watch.py).
"$python" -m flows.watch "$flow_run_id" --release-fd 9 ${RUN_START_WITHIN_S:+--start-within "$RUN_START_WITHIN_S"} &
watch_pid=$!
wait "$watch_pid" || status=$?
watch_pid=

if [ "$status" = 3 ]; then  # no worker started it: cancelled, so that nothing is left Scheduled or Pending
    "$python" -m flows.cancel "$flow_run_id" --timeout-s 30 || true
    exit 1
fi
echo
if [ "$status" -le 1 ]; then
    echo "[run] $DEPLOYMENT finished with exit code $status"
else
    echo "[run] $DEPLOYMENT: its end was not seen (the watcher stopped with exit code $status); it may still run"
fi
# Only what still works once this script has ended: the server answers then only when kept.
if [ -f "$PREFECT_HOME/keep" ]; then
    echo "  Prefect UI:   http://127.0.0.1:$PORT/runs/flow-run/$flow_run_id (kept: bash scripts/stop.sh stops it)"
    echo "  flow logs:    source .prefect/env.sh; prefect flow-run logs $flow_run_id"
else
    echo "  flow logs:    .prefect/worker.log (the server stops with this script; KEEP_RUNNING=1 keeps it and its UI)"
fi
exit "$status"
