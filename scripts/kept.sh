# Sourced by scripts/run.sh and scripts/stop.sh: the Prefect server and worker run.sh started, found by the
# pid files it writes beside its logs (.prefect/server.pid, .prefect/worker.pid), whichever run.sh started
# them; the lock that lets one script at a time start, share or stop them; and stopping them.
#
# .prefect/run.lock   flock: held while a script starts, joins, leaves or stops the server and worker, and by
#                     run.sh from its submission until a worker started the flow run
# .prefect/users/PID  one file per run.sh using them; the last one to leave stops them, unless kept
# .prefect/keep       written by KEEP_RUNNING=1: they stay up until scripts/stop.sh

KEPT_HOME=${PREFECT_HOME:-$PWD/.prefect}

# kept_pid NAME: prints the pid of NAME (server or worker) when that process is still a live `prefect`
# process (not a zombie, not another program that got the pid since); fails otherwise.
kept_pid() {
    local file="$KEPT_HOME/$1.pid" pid
    [ -f "$file" ] || return 1
    pid=$(cat "$file")
    alive "$pid" || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q prefect || return 1
    echo "$pid"
}

# kept_running: "server (pid N) and worker (pid M)", naming only those that are still live prefect processes
# (kept_pid); empty when neither is
kept_running() {
    local name pid found=()
    for name in server worker; do
        if pid=$(kept_pid "$name"); then found+=("$name (pid $pid)"); fi
    done
    if [ ${#found[@]} = 2 ]; then echo "${found[0]} and ${found[1]}"; else echo "${found[*]}"; fi
}

# take_kept_lock WHO: holds .prefect/run.lock on file descriptor 9 (released when the script exits or by
# `flock -u 9`); says so when another script holds it. Background processes must not inherit it: start
# them with `9>&-`.
take_kept_lock() {
    mkdir -p "$KEPT_HOME"
    exec 9>>"$KEPT_HOME/run.lock"
    if ! flock -n 9; then
        echo "[$1] waiting for another scripts/run.sh or stop.sh of this folder to finish starting or stopping the Prefect server (or its worker to start the run it submitted)"
        flock 9
    fi
}

# kept_users: the pids of the run.sh processes still using the server and worker (stale entries removed)
kept_users() {
    local file pid
    mkdir -p "$KEPT_HOME/users"
    for file in "$KEPT_HOME"/users/*; do
        [ -e "$file" ] || continue
        pid=${file##*/}
        if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'scripts/run\.sh'; then
            echo "$pid"
        else
            rm -f "$file"
        fi
    done
}

# read_stat PID: the fields of /proc/PID/stat after the command name (which may hold spaces) into STAT, so
# ${STAT[0]} is the state (Z: a zombie) and ${STAT[1]} the parent's pid; fails when there is no such process
read_stat() {
    local line
    read -r line 2>/dev/null <"/proc/$1/stat" || return 1
    read -ra STAT <<<"${line##*) }"
}

# alive PID...: succeeds when one of them is a live process (not a zombie)
alive() {
    local pid
    for pid in "$@"; do
        if read_stat "$pid" && [ "${STAT[0]}" != Z ]; then return 0; fi
    done
    return 1
}

# wait_gone SECONDS PID...: waits until none of them is a live process (alive), asking five times a second;
# fails when one still is after SECONDS
wait_gone() {
    local polls=$(($1 * 5))
    shift
    while alive "$@"; do
        [ "$polls" -gt 0 ] || return 1
        polls=$((polls - 1))
        sleep 0.2
    done
}

# children_of PID: the pids of PID's child processes, one a line
children_of() {
    local stat pid
    for stat in /proc/[0-9]*/stat; do
        pid=${stat#/proc/}; pid=${pid%/stat}
        if read_stat "$pid" && [ "${STAT[1]}" = "$1" ]; then echo "$pid"; fi
    done
}

# stop_kept NAME GRACE_S: SIGTERM to NAME's process group (setsid made it its own), SIGKILL after GRACE_S
# seconds; then its children in groups of their own (the worker's flow-run processes): the worker's death
# signals them and they stop their training, but one still reporting to a server that does not answer would
# wait for it, so whatever is left after 20 s more is killed too (its training dies with it: common/lifetime.py).
# Says "stopped" once none of them is a live process: a killed process lives on while the kernel frees its
# memory (a Prefect server's, tenths of a second on a busy machine), and one exiting has no command line left to
# recognise it by (kept_pid), so the waits go by `alive`. Prints what it did.
stop_kept() {
    local pid children child
    if ! pid=$(kept_pid "$1"); then
        echo "[stop] no $1 running"
        rm -f "$KEPT_HOME/$1.pid"
        return 0
    fi
    children=$(children_of "$pid")  # now: once it is gone, they are someone else's
    kill -TERM -- "-$pid" 2>/dev/null || true
    wait_gone "$2" "$pid" || true
    kill -KILL -- "-$pid" 2>/dev/null || true  # and whatever else is left in its group
    # shellcheck disable=SC2086  # one pid a word
    wait_gone 20 "$pid" $children || true
    for child in $children; do
        if alive "$child"; then kill -KILL -- "-$child" 2>/dev/null || kill -KILL "$child" 2>/dev/null || true; fi
    done
    # shellcheck disable=SC2086
    wait_gone 10 "$pid" $children || echo "[stop] $1 (pid $pid): a process still exits after SIGKILL" >&2
    rm -f "$KEPT_HOME/$1.pid"
    echo "[stop] $1 (pid $pid) stopped"
}

# stop_all_kept: the worker first (it only needs the server while it shuts down; Prefect's worker answers
# SIGTERM by sending itself SIGINT, which may not stop it: a short grace, then SIGKILL), then the server
stop_all_kept() {
    rm -f "$KEPT_HOME/keep"
    stop_kept worker 3
    stop_kept server 20
}
