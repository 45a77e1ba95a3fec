#!/usr/bin/env bash
# Make Slurm (slurmctld, slurmd, sbatch, squeue, scancel, sinfo) and munge available: for
# scripts/slurm_single_host.sh, the one-host cluster that tests/test_pipeline_slurm.py starts too.
# Installs Debian's slurm-wlm and munge when they are missing and apt-get can be used; says what it found
# or installed, or why it cannot install them (then exits 0, and the Slurm tests skip themselves).
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac

# found: "Slurm <version> and munge <version>" when every command is there, else fails
found() {
    local cmd
    for cmd in slurmctld slurmd sbatch munged; do command -v "$cmd" >/dev/null 2>&1 || return 1; done
    echo "Slurm $(slurmctld -V | cut -d' ' -f2) and munge $(munged --version | cut -d' ' -f1 | sed 's/^munge-//')"
}

if what=$(found); then
    echo "[slurm] found $what: nothing to install"
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[slurm] installing slurm-wlm and munge (Debian packages)"
    if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null 2>&1 || {
        apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null 2>&1
    }; then
        echo "[slurm] installed $(found)"
        exit 0
    fi
fi
echo "[slurm] Slurm is not installed and cannot be installed here (needs root and apt-get); its tests will be skipped"
