#!/usr/bin/env bash
# A Slurm cluster of this one host, to try the pipeline's Slurm launcher without a cluster: munged,
# slurmctld and slurmd started directly (no systemd, no cgroups, no accounting database), every state,
# spool, log and pid file under DIR, free ports, one partition (`debug`, the default) with this host's CPUs.
# Run as root (slurmd runs as root); Slurm and munge must be installed (bash scripts/install_slurm.sh).
#
#   bash scripts/slurm_single_host.sh start DIR    # prints the SLURM_CONF line to export
#   bash scripts/slurm_single_host.sh stop DIR
#
# Slurm's commands (sbatch, squeue, scontrol, scancel, sinfo) find this cluster through SLURM_CONF, so the
# worker that runs the train stage needs it in its environment: export it before scripts/run.sh starts the
# worker (a worker already running keeps the environment it started with: bash scripts/stop.sh first).
# Finished jobs stay in `scontrol show job` for an hour (MinJobAge); there is no `sacct`.
set -euo pipefail

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }
case "${1:-}" in -h|--help) usage; exit 0 ;; start|stop) ;; *) usage >&2; exit 2 ;; esac
[ $# -eq 2 ] || { usage >&2; exit 2; }
command=$1
mkdir -p "$2"
root=$(cd "$2" && pwd)

free_port() {
    python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"
}

# stop_pid_file FILE: SIGTERM to the daemon whose pid FILE holds, SIGKILL after 30 s
stop_pid_file() {
    local pid
    [ -f "$1" ] && pid=$(cat "$1") && kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
    kill -KILL "$pid" 2>/dev/null || true
}

if [ "$command" = stop ]; then
    stop_pid_file "$root/slurmd.pid"
    stop_pid_file "$root/slurmctld.pid"
    stop_pid_file "$root/munge/munged.pid"
    echo "[slurm] the cluster of $root is stopped"
    exit 0
fi

missing=$(for cmd in munged slurmctld slurmd sbatch sinfo; do command -v "$cmd" >/dev/null || printf ' %s' "$cmd"; done)
if [ -n "$missing" ]; then
    echo "[slurm] not installed (missing:$missing); bash scripts/install_slurm.sh installs it" >&2
    exit 1
fi
if [ "$(id -u)" != 0 ]; then
    echo "[slurm] a single-host cluster runs slurmd as root; run this as root" >&2
    exit 1
fi

mkdir -p "$root"/{state,spool,log,munge}
node=$(hostname -s)
socket="$root/munge/munge.socket"
key="$root/munge/munge.key"
[ -f "$key" ] || { head -c 128 /dev/urandom >"$key"; chmod 600 "$key"; }
export SLURM_CONF="$root/slurm.conf"
# the CPUs this host lets us use; not nproc alone, which returns OMP_NUM_THREADS when it is set (a caller running
# its processes on one thread each would get a one-CPU node, and every two-task job would be refused)
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
cat >"$SLURM_CONF" <<CONF
ClusterName=single
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
AuthInfo=socket=$socket
StateSaveLocation=$root/state
SlurmdSpoolDir=$root/spool
SlurmctldPidFile=$root/slurmctld.pid
SlurmdPidFile=$root/slurmd.pid
SlurmctldLogFile=$root/log/slurmctld.log
SlurmdLogFile=$root/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
MinJobAge=3600
SchedulerParameters=sched_interval=2
KillWait=5
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=1024 State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF

# each daemon in a session of its own, so that no terminal signal reaches it
setsid munged --force --socket="$socket" --key-file="$key" --pid-file="$root/munge/munged.pid" \
    --log-file="$root/munge/munged.log" --seed-file="$root/munge/munged.seed" </dev/null >/dev/null 2>&1
for _ in $(seq 100); do [ -S "$socket" ] && break; sleep 0.2; done
[ -S "$socket" ] || { echo "[slurm] munged did not start; its log: $root/munge/munged.log" >&2; exit 1; }
setsid slurmctld -i </dev/null >/dev/null 2>&1
setsid slurmd -N "$node" </dev/null >/dev/null 2>&1
for _ in $(seq 120); do
    if [ "$(sinfo --noheader --format=%T 2>/dev/null)" = idle ]; then
        echo "[slurm] one-host cluster up (node $node, partition debug); point Slurm's commands at it with:"
        echo "export SLURM_CONF=$SLURM_CONF"
        exit 0
    fi
    sleep 0.5
done
echo "[slurm] the node did not become idle in 60 s; logs: $root/log/slurmctld.log, $root/log/slurmd.log" >&2
tail -5 "$root/log/slurmctld.log" "$root/log/slurmd.log" >&2 || true
"$0" stop "$root" >/dev/null
exit 1
