# Sourced by scripts/run.sh and scripts/stop.sh: the Prefect server and worker run.sh started, by the pid
# files it writes beside its logs (.prefect/server.pid, .prefect/worker.pid).

# kept_pid NAME: prints the pid of NAME (server or worker) when that process is still a live `prefect`
# process (not a zombie, not another program that got the pid since); fails otherwise.
kept_pid() {
    local file="${PREFECT_HOME:-$PWD/.prefect}/$1.pid" pid state
    [ -f "$file" ] || return 1
    pid=$(cat "$file")
    state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [ -n "$state" ] && [ "$state" != Z ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q prefect || return 1
    echo "$pid"
}
