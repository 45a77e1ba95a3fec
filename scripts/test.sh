#!/usr/bin/env bash
# The test command (README, CI): set up the environment, then run the whole suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/test_model.py -k parity`.
set -euo pipefail
cd "$(dirname "$0")/.."
# The system packages (apt: mostly waiting on downloads, 30 s on a fresh machine) install while setup.sh
# installs the project (mostly the CPU); neither uses what the other installs.
{
    bash scripts/install_postgres.sh  # PostgreSQL for tests/test_pipeline_deployments.py (skips itself without)
    bash scripts/install_slurm.sh     # Slurm + munge for tests/test_pipeline_slurm.py (skips itself without)
} &
system_packages=$!
INSTALLER=${INSTALLER:-uv} bash scripts/setup.sh  # uv: half pip's time; INSTALLER=pip for your pip configuration
wait "$system_packages"
# Four processes, so that both cores stay busy while some tests wait (for a server, a worker, a subprocess).
# Each takes whole test files in the order tests/conftest.py puts them (the end-to-end ones first: started
# last, they would be the run's tail; xdist's own order puts the files with the most tests first) and starts
# the servers its tests share once; TEST_WORKERS=0 runs everything in this process. The 15 slowest tests are listed at the end. Exits non-zero
# when a test fails and when no test ran (exit code 5).
exec .venv/bin/python -m pytest -ra -n "${TEST_WORKERS:-4}" --dist loadfile --no-loadscope-reorder --durations=15 "$@"
