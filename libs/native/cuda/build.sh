#!/usr/bin/env bash
# Build the cuda backend's kernels ahead of time: libs/native/cuda/build.sh [OUT_DIR]
#
# Writes OUT_DIR/mcp_kernels.fatbin (SASS for sm_80 and sm_90, plus compute_90 PTX that newer GPUs JIT) and
# OUT_DIR/mcp_kernels.ptx (for reading, and for tests that look for every kernel). OUT_DIR defaults to
# libs/native/build. NVCC names the compiler; else nvcc on PATH, else /usr/local/cuda/bin/nvcc.
#
# Without a usable nvcc this prints why and exits 0: a CPU machine builds everything else, and the cuda
# backend then reports itself unavailable (CudaBackend.available()) instead of failing a build.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here/../build}"
src="$here/kernels.cu"

nvcc="${NVCC:-}"
if [[ -z "$nvcc" ]]; then
    if command -v nvcc >/dev/null 2>&1; then
        nvcc="$(command -v nvcc)"
    elif [[ -x /usr/local/cuda/bin/nvcc ]]; then
        nvcc=/usr/local/cuda/bin/nvcc
    fi
fi
if [[ -z "$nvcc" || ! -x "$(command -v "$nvcc" 2>/dev/null || true)" ]]; then
    echo "nvcc not found: the cuda backend will be unavailable (set NVCC or install the CUDA toolkit)"
    exit 0
fi
if ! "$nvcc" --list-gpu-arch 2>/dev/null | grep -qx compute_90; then
    echo "$nvcc cannot target compute_90 (CUDA >= 11.8 needed): the cuda backend will be unavailable"
    exit 0
fi

mkdir -p "$out"
fatbin="$out/mcp_kernels.fatbin"
ptx="$out/mcp_kernels.ptx"
if [[ "$fatbin" -nt "$src" && "$fatbin" -nt "$0" && "$ptx" -nt "$src" && "$ptx" -nt "$0" ]]; then
    echo "cuda kernels up to date: $fatbin"
    exit 0
fi

# No fast-math: outputs must match the numpy backend within 1e-4.
flags=(-O3 -std=c++17 --Werror all-warnings)
tmp="$(mktemp -d "$out/.mcp_kernels.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
"$nvcc" "${flags[@]}" --fatbin \
    -gencode arch=compute_80,code=sm_80 \
    -gencode arch=compute_90,code=sm_90 \
    -gencode arch=compute_90,code=compute_90 \
    -o "$tmp/mcp_kernels.fatbin" "$src"
"$nvcc" "${flags[@]}" --ptx -arch=compute_90 -o "$tmp/mcp_kernels.ptx" "$src"
mv -f "$tmp/mcp_kernels.fatbin" "$fatbin"  # rename: a reader never sees half a file
mv -f "$tmp/mcp_kernels.ptx" "$ptx"
echo "built $fatbin (sm_80, sm_90, compute_90 PTX) and $ptx with $("$nvcc" --version | tail -n 2 | head -n 1)"
