#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv.
# Idempotent: skips the install when pyproject.toml has not changed since the last one.
# On a machine without a GPU the CPU build of torch goes in first, so that the
# dependency resolver never pulls several GB of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_CPU_VERSION=${TORCH_CPU_VERSION:-2.13.0}

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating $VENV with $($PYTHON --version)"
    "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [ -f "$stamp" ]; then
    exit 0
fi
pip=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "[setup] no GPU: installing the CPU build of torch $TORCH_CPU_VERSION"
    "${pip[@]}" "torch==$TORCH_CPU_VERSION"
fi
echo "[setup] installing the project and its test dependencies"
"${pip[@]}" -e ".[test]"
rm -f "$VENV"/.installed-*
touch "$stamp"
