#!/usr/bin/env bash
# The test command (README, CI): set up the environment, then run the whole suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/test_model.py -k parity`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/install_postgres.sh  # PostgreSQL for tests/test_pipeline_deployments.py (skips itself without)
bash scripts/install_slurm.sh     # Slurm + munge for tests/test_pipeline_slurm.py (skips itself without)
# Two processes, each taking whole test files (a module's server or cluster is started once); TEST_WORKERS=0
# runs everything in this process. Exits non-zero when a test fails and when no test ran (pytest's exit code 5).
exec .venv/bin/python -m pytest -ra -n "${TEST_WORKERS:-2}" --dist loadfile "$@"
