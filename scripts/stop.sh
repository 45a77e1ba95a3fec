#!/usr/bin/env bash
# Stop the Prefect server and worker that scripts/run.sh started (whichever run.sh started them; kept by
# KEEP_RUNNING=1 or still serving a run). Logs stay in .prefect/, and so does .prefect/env.sh: sourced
# afterwards, it says that no server answers and how to start one.
# A flow run still in progress ends with its worker (its training processes stop with it).
#
#   bash scripts/stop.sh
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac

export PREFECT_HOME="$PWD/.prefect"
# shellcheck source=scripts/kept.sh
source scripts/kept.sh
take_kept_lock stop
stop_all_kept
