#!/usr/bin/env bash
# The optional `gpu` extra (pyproject.toml: flash-attn-4, quack-kernels, nvidia-cutlass-dsl) for a GPU host
# without a package registry. Its CUDA 13 library wheel (nvidia-cutlass-dsl-libs-cu13, 88 MB) is larger
# than one transfer to such a host may be (64 MiB), so `download` splits every wheel set into two
# folders, each under the limit, to send one after the other; `install` on the GPU host joins the parts
# and unpacks everything into one directory and prints the PYTHONPATH that makes it importable.
#
#   bash bench/gpu_extra.sh download [DEST]     # here: DEST/a and DEST/b (default artifacts/gpu-extra)
#   eval "$(bash bench/gpu_extra.sh install A B [SITE])"   # GPU host, after A and B arrived; SITE default /tmp/gpu-extra
#
# Pip's --target cannot install these wheels (several of them unpack into one package directory, and
# the last replaces the others), hence the plain unpacking. Environment: PY_VERSION (default 3.12),
# PYTHON (the pip to download with; default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }
PARTS_OF=nvidia_cutlass_dsl_libs_cu13  # the one wheel over the limit
case "${1:-}" in
download)
    DEST=${2:-artifacts/gpu-extra}
    PYTHON=${PYTHON:-.venv/bin/python}
    rm -rf "$DEST" && mkdir -p "$DEST/a" "$DEST/b" "$DEST/all"
    # the pins of pyproject.toml's gpu extra, and what they need beyond the GPU image (torch, cuda-bindings,
    # protobuf and numpy are on it)
    "$PYTHON" -m pip download --disable-pip-version-check -q --no-deps --dest "$DEST/all" \
        --python-version "${PY_VERSION:-3.12}" --only-binary=:all: --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_28_x86_64 \
        flash-attn-4==4.0.0b36 quack-kernels==0.6.5 nvidia-cutlass-dsl==4.7.1 nvidia-cutlass-dsl-libs-base==4.7.1 \
        nvidia-cutlass-dsl-libs-core==4.7.1 nvidia-cutlass-dsl-libs-cu13==4.7.1 einops "apache-tvm-ffi<0.2,>=0.1.11" \
        torch-c-dlpack-ext 2>&1 | grep -v "^WARNING: Location" || true
    big=$(ls "$DEST"/all/$PARTS_OF-*.whl)
    split -b 44000000 "$big" "$DEST/b/$(basename "$big").part."  # two parts, each under the limit
    mv "$DEST/b/$(basename "$big").part.aa" "$DEST/a/"
    rm "$big" && mv "$DEST"/all/*.whl "$DEST/a/" && rmdir "$DEST/all"
    du -sh "$DEST/a" "$DEST/b"
    ;;
install)
    [[ $# -ge 3 ]] || { usage >&2; exit 2; }
    SITE=${4:-/tmp/gpu-extra}
    rm -rf "$SITE" && mkdir -p "$SITE"
    # .part.aa, .part.ab, ... in the order of their names, wherever each folder is
    parts=$(for part in "$2"/*.part.* "$3"/*.part.*; do echo "$(basename "$part") $part"; done | sort | cut -d' ' -f2)
    whole="$SITE/$(basename "${parts%%.part.*}")"
    cat $parts > "$whole"
    for wheel in "$2"/*.whl "$3"/*.whl "$whole"; do
        [[ -f "$wheel" ]] && python3 -m zipfile -e "$wheel" "$SITE" >&2
    done
    rm "$whole"
    # nvidia-cutlass-dsl's .pth puts its dsl_packages folder on sys.path; unpacked wheels run no .pth
    echo "export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages\${PYTHONPATH:+:\$PYTHONPATH}"
    ;;
-h|--help) usage ;;
*) usage >&2; exit 2 ;;
esac
