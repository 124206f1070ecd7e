#!/usr/bin/env bash
# Pack, where pip can reach PyPI, what `make gpu-check` installs on a GPU machine that has no network:
#
#     tools/prepare_gpu_wheels.sh [DEST]          (DEST defaults to .whl/ at the repository root, git-ignored)
#
# - pycuda as its source distribution: it is built on the GPU machine against that machine's CUDA headers
#   and driver (tools/gpu_check.py runs configure.py and pip there, with --no-build-isolation, so its build
#   needs only the setuptools, wheel and numpy already installed there);
# - pycuda's own needs (pytools, platformdirs, mako and theirs) and the few project needs that the GPU image
#   lacks or has too old (pycryptodome for tools/make_models.py, protobuf >= the generated code's 7.35), as
#   wheels for CPython $GPU_PYTHON (3.12) on x86-64 Linux.
#
# One version of each, pinned here: two versions of a package in DEST stop the install there.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-$root/.whl}"
python="${PYTHON:-$root/.venv/bin/python}"
[[ -x "$python" ]] || python=python3
gpu_python="${GPU_PYTHON:-3.12}"

PYCUDA=2026.1
WHEELS=(
    pytools==2026.1.1
    platformdirs==4.14.5
    siphash24==1.9
    typing-extensions==4.16.0
    mako==1.4.3
    markupsafe==3.0.4
    pycryptodome==4.4.0
    protobuf==7.36.2
)

mkdir -p "$dest"
"$python" -m pip download -q --no-deps --no-binary pycuda -d "$dest" "pycuda==$PYCUDA"
"$python" -m pip download -q --no-deps --only-binary=:all: \
    --python-version "$gpu_python" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$dest" "${WHEELS[@]}"
echo "packed into $dest ($(du -sh "$dest" | cut -f1)):"
ls -1 "$dest"
