"""The CUDA kernels without a GPU: ``libs/native/cuda/build.sh`` builds the fatbin (SASS sm_80 and sm_90, PTX
compute_90) and the PTX with every kernel where nvcc is installed, and says why it built nothing where it is
not; and every kernel, compiled for the CPU by ``host_check.cpp`` (a thread per CUDA thread, a barrier per
``__syncthreads``), computes what the numpy backend computes."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from mcp_worker.backends.cuda_backend import KERNELS
from mcp_worker.backends.numpy_backend import dense, gelu, layernorm, relu, softmax

CUDA_DIR = Path(__file__).resolve().parents[2] / "libs" / "native" / "cuda"
BUILD_SH = CUDA_DIR / "build.sh"
RNG = np.random.default_rng(11)


def _nvcc() -> str | None:
    for candidate in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def _fatbin_entries(data: bytes) -> set[tuple[str, int]]:
    """``{(kind, sm)}`` of a fatbin (nvcc's container): kind ELF (SASS) or PTX, sm 90 for sm_90."""
    magic, _, header_size, size = struct.unpack_from("<IHHQ", data, 0)
    assert magic == 0xBA55ED50, "not a fatbin"
    entries, offset = set(), header_size
    while offset < header_size + size:
        kind, _, entry_header, payload = struct.unpack_from("<HHII", data, offset)
        sm = struct.unpack_from("<I", data, offset + 28)[0]
        entries.add(({1: "PTX", 2: "ELF"}.get(kind, str(kind)), sm))
        offset += entry_header + payload
    return entries


# --- build.sh -----------------------------------------------------------------------------------------------


@pytest.mark.skipif(_nvcc() is None, reason="nvcc is not installed here: build.sh builds nothing without it")
def test_build_writes_fatbin_and_ptx_with_every_kernel(tmp_path: Path) -> None:
    out = tmp_path / "build"
    done = subprocess.run(
        ["bash", str(BUILD_SH), str(out)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    fatbin, ptx = out / "mcp_kernels.fatbin", out / "mcp_kernels.ptx"
    assert fatbin.is_file() and ptx.is_file(), done.stdout
    text = ptx.read_text()
    for name in KERNELS:
        assert f".visible .entry {name}(" in text, name
    assert {("ELF", 80), ("ELF", 90), ("PTX", 90)} <= _fatbin_entries(fatbin.read_bytes())
    again = subprocess.run(
        ["bash", str(BUILD_SH), str(out)], capture_output=True, text=True, timeout=60, check=True
    )
    assert "up to date" in again.stdout


def test_build_without_nvcc_says_so_and_succeeds(tmp_path: Path) -> None:
    out = tmp_path / "build"
    env = {**os.environ, "NVCC": str(tmp_path / "no-such-nvcc")}
    done = subprocess.run(
        ["bash", str(BUILD_SH), str(out)], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 0
    assert "nvcc not found: the cuda backend will be unavailable" in done.stdout
    assert not (out / "mcp_kernels.fatbin").exists()


# --- the kernels, run on the CPU ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def host_check(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler here to build host_check.cpp")
    exe = tmp_path_factory.mktemp("host_check") / "host_check"
    cmd = [cxx, "-std=c++20", "-O1", "-pthread", "-Wall", "-Wno-unknown-pragmas", f"-I{CUDA_DIR}"]
    subprocess.run([*cmd, str(CUDA_DIR / "host_check.cpp"), "-o", str(exe)], check=True, timeout=180)
    return exe


def _run(
    exe: Path, tmp: Path, args: list[object], tensors: dict[str, np.ndarray | None], shape: tuple[int, ...]
) -> np.ndarray:
    """Write ``tensors`` as raw float32 files, run ``host_check`` with ``args`` (a name stands for its file,
    None for "-"), and read the output ``y`` back in ``shape``."""
    argv = [str(exe)]
    for arg in args:
        if isinstance(arg, str) and arg in tensors:
            array = tensors[arg]
            if array is None:
                argv.append("-")
                continue
            path = tmp / f"{arg}.bin"
            np.ascontiguousarray(array, dtype=np.float32).tofile(path)
            argv.append(str(path))
        elif arg == "y":
            argv.append(str(tmp / "y.bin"))
        else:
            argv.append(str(arg))
    subprocess.run(argv, check=True, timeout=120)
    return np.fromfile(tmp / "y.bin", dtype=np.float32).reshape(shape)


@pytest.mark.parametrize(
    ("m", "k", "n", "with_bias"),
    [(1, 64, 256, True), (7, 256, 16, True), (37, 70, 45, True), (20, 5, 3, False), (16, 16, 16, True)],
)
def test_dense(host_check: Path, tmp_path: Path, m: int, k: int, n: int, with_bias: bool) -> None:
    x = RNG.standard_normal((m, k)).astype(np.float32)
    w = RNG.standard_normal((k, n)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32) if with_bias else None
    got = _run(host_check, tmp_path, ["dense", m, k, n, "x", "w", "b", "y"], {"x": x, "w": w, "b": b}, (m, n))
    np.testing.assert_allclose(got, dense(x, w, b), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize(("name", "op"), [("relu", relu), ("gelu", gelu)])
def test_elementwise(
    host_check: Path, tmp_path: Path, name: str, op: Callable[[np.ndarray], np.ndarray]
) -> None:
    x = (RNG.standard_normal(1000) * 4).astype(np.float32)  # more elements than the 2 x 64 threads launched
    x[:3] = [0.0, -0.0, np.nan]
    got = _run(host_check, tmp_path, [name, x.size, "x", "y"], {"x": x}, x.shape)
    np.testing.assert_allclose(got, op(x), atol=1e-5, rtol=1e-5)  # NaN where numpy has NaN


@pytest.mark.parametrize(("rows", "cols", "scale"), [(1, 16, 1.0), (5, 300, 1.0), (4, 7, 1000.0)])
def test_softmax(host_check: Path, tmp_path: Path, rows: int, cols: int, scale: float) -> None:
    x = (RNG.standard_normal((rows, cols)) * scale).astype(np.float32)  # large: the row max keeps exp finite
    got = _run(host_check, tmp_path, ["softmax", rows, cols, "x", "y"], {"x": x}, x.shape)
    np.testing.assert_allclose(got, softmax(x.copy()), atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize(
    ("rows", "cols", "affine"), [(5, 300, True), (4, 3, False), (1, 256, True), (7, 40, False)]
)
def test_layernorm(host_check: Path, tmp_path: Path, rows: int, cols: int, affine: bool) -> None:
    x = (RNG.standard_normal((rows, cols)) * 3 + 5).astype(np.float32)
    g = RNG.standard_normal(cols).astype(np.float32) if affine else None
    b = RNG.standard_normal(cols).astype(np.float32) if affine else None
    eps = 1e-5
    args = ["layernorm", rows, cols, eps, "x", "g", "b", "y"]
    got = _run(host_check, tmp_path, args, {"x": x, "g": g, "b": b}, x.shape)
    np.testing.assert_allclose(got, layernorm(x, g, b, eps), atol=1e-4, rtol=1e-4)
