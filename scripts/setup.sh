#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv.
# Idempotent: skips the install when pyproject.toml (and the GPU found) have not changed since the last one.
# On a machine without a GPU the CPU build of torch goes in first, so that the
# dependency resolver never pulls several GB of CUDA wheels. Where an NVIDIA Hopper GPU (H100, H200:
# compute capability 9.x) is present, the `gpu` extra goes in too: FlashAttention-4's backward and
# quack-kernels' GEMM epilogues, the fast path of `gpt2.train` (docs/kernels.md).
# INSTALLER=uv installs the project with uv (put into the venv first) instead of pip: the same versions in half
# the time (62.5 s against 124.8 on two cores, cold caches, most of pip's being its resolver and its one-core bytecode compile),
# but uv reads no pip configuration (index, mirror, certificates), so pip is the default, and where uv fails
# pip installs after all. torch's CPU build always comes through pip, which finds it wherever pip is configured to.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_CPU_VERSION=${TORCH_CPU_VERSION:-2.13.0}
INSTALLER=${INSTALLER:-pip}
case "$INSTALLER" in pip|uv) ;; *) echo "[setup] INSTALLER=$INSTALLER: must be pip or uv" >&2; exit 2;; esac

has_gpu() { command -v nvidia-smi >/dev/null 2>&1; }
has_hopper_gpu() { has_gpu && nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | grep -q '^9\.'; }

extras=test
if has_hopper_gpu; then
    extras=test,gpu
fi
if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating $VENV with $($PYTHON --version)"
    "$PYTHON" -m venv "$VENV"
fi
# the stamp names what was installed: pyproject.toml's content, and the gpu extra where it went in
stamp="$VENV/.installed-$({ cat pyproject.toml; [ "$extras" = test ] || echo "$extras"; } | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then
    exit 0
fi
pip=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
if ! has_gpu; then
    echo "[setup] no GPU: installing the CPU build of torch $TORCH_CPU_VERSION"
    "${pip[@]}" "torch==$TORCH_CPU_VERSION"
fi
if [ "$extras" = test,gpu ]; then
    echo "[setup] NVIDIA Hopper GPU found: installing the gpu extra too (flash-attn-4, quack-kernels: the fast path)"
fi
# the project with uv: the bytecode compiled as pip does, so that no process compiles a module on import
install_with_uv() {
    "${pip[@]}" uv && "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" --compile-bytecode -e ".[$extras]"
}
echo "[setup] installing the project and its test dependencies with $INSTALLER"
if [ "$INSTALLER" = uv ] && ! install_with_uv; then
    echo "[setup] uv could not install the project: installing it with pip" >&2
    INSTALLER=pip
fi
if [ "$INSTALLER" = pip ]; then
    "${pip[@]}" -e ".[$extras]"
fi
rm -f "$VENV"/.installed-*
touch "$stamp"
