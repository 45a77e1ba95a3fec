#!/usr/bin/env bash
# Make Slurm (slurmctld, slurmd, sbatch, squeue, scancel, sacct) and munge available for
# tests/test_pipeline_slurm.py, which starts a one-host cluster of its own (tests/fixtures/slurm.py).
# Installs Debian's slurm-wlm and munge when they are missing and apt-get can be used; otherwise says
# why and exits 0, and the Slurm tests skip themselves.
set -euo pipefail
if command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 && command -v munged >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[slurm] installing slurm-wlm and munge (for the single-host Slurm cluster the tests start)"
    if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null 2>&1 || {
        apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null 2>&1
    }; then
        exit 0
    fi
fi
echo "[slurm] Slurm is not installed and cannot be installed here; its tests will be skipped"
