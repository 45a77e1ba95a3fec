#!/usr/bin/env bash
# Stop the Prefect server and worker that `KEEP_RUNNING=1 bash scripts/run.sh` left running, and remove
# .prefect/env.sh, so that no shell is pointed at a server that is gone. Logs stay in .prefect/.
# A flow run still in progress ends with its worker (its training processes stop with it).
#
#   bash scripts/stop.sh
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac

export PREFECT_HOME="$PWD/.prefect"
# shellcheck source=scripts/kept.sh
source scripts/kept.sh

# stop NAME GRACE_S: SIGTERM to NAME's process group (setsid made it its own), SIGKILL after GRACE_S seconds
stop() {
    local pid
    if ! pid=$(kept_pid "$1"); then
        echo "[stop] no $1 running"
        rm -f "$PREFECT_HOME/$1.pid"
        return 0
    fi
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq "$2"); do
        kept_pid "$1" >/dev/null || break
        sleep 1
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$PREFECT_HOME/$1.pid"
    echo "[stop] $1 (pid $pid) stopped"
}

rm -f "$PREFECT_HOME/env.sh"
# The worker first: it only needs the server while it shuts down. Prefect 3.8's worker answers SIGTERM by
# sending itself SIGINT, which may not stop it: a short grace, then SIGKILL.
stop worker 3
stop server 20
