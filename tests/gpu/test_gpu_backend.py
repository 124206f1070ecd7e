"""The cuda backend on a real GPU: outputs equal the numpy backend's within 1e-4 (the demo MLP at batches 1, 7
and 64, and every op), ``close`` gives the device memory back, two models run on two streams at once, and
inputs in registered caller memory skip the staging copy.

Marked ``gpu`` and skipped, with the reason, where ``CudaBackend.available()`` says no (no pycuda, no built
kernels, no device): on a CPU machine these tests are skipped, never passed. ``make gpu-check`` runs them.
"""

from __future__ import annotations

import dataclasses
import mmap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy

from mcp_worker.backends import cuda_device
from mcp_worker.backends.cuda_backend import CudaBackend
from mcp_worker.backends.numpy_backend import NumpyBackend
from mcpcore.errors import FailedPrecondition
from mcpcore.model_yaml import load_model_yaml, model_config_from_dict
from mcpcore.modelspec import ModelConfig

_OK, _WHY = CudaBackend.available()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _OK, reason=f"needs a CUDA GPU, pycuda and the built kernels: {_WHY}"),
]

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-4
MIB = 1 << 20
RNG = np.random.default_rng(3)


@pytest.fixture(scope="module")
def demo(demo_repo: Path) -> dict[str, tuple[ModelConfig, bytes]]:
    """demo-mlp versions 1 and 2 (numpy configs) and their weights, from tools/make_models.py."""
    repo = demo_repo
    out = {}
    for version in ("1", "2"):
        vdir = repo / "demo-mlp" / version
        out[version] = (load_model_yaml(vdir), (vdir / "weights.safetensors").read_bytes())
    return out


def _pair(config: ModelConfig, weights: bytes) -> tuple[CudaBackend, NumpyBackend]:
    return CudaBackend(dataclasses.replace(config, backend="cuda"), weights), NumpyBackend(config, weights)


@pytest.fixture(scope="module")
def mlp(demo: dict[str, tuple[ModelConfig, bytes]]) -> Iterator[tuple[CudaBackend, NumpyBackend]]:
    cuda, ref = _pair(*demo["1"])
    cuda.warmup()
    yield cuda, ref
    cuda.close()


def _x(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _max_err(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    (name,) = b
    assert a[name].shape == b[name].shape and a[name].dtype == np.float32
    return float(np.abs(a[name] - b[name]).max())


@pytest.mark.parametrize("batch", [1, 7, 64])
def test_demo_mlp_matches_numpy(mlp: tuple[CudaBackend, NumpyBackend], batch: int) -> None:
    cuda, ref = mlp
    x = {"INPUT0": _x(batch, 64)}
    assert _max_err(cuda.infer(x), ref.infer(x)) < TOL


def test_every_op_matches_numpy() -> None:
    """Dims that are not multiples of the tile, leading dims, gelu, layernorm with and without its scale and
    shift, softmax, a dense layer without bias, and a batch larger than the buffers first allocated."""
    tensors = {
        "w1": RNG.standard_normal((40, 70)).astype(np.float32) / 6,
        "b1": RNG.standard_normal(70).astype(np.float32),
        "g": RNG.standard_normal(70).astype(np.float32),
        "b": RNG.standard_normal(70).astype(np.float32),
        "w2": RNG.standard_normal((70, 300)).astype(np.float32) / 8,
        "w3": RNG.standard_normal((300, 33)).astype(np.float32) / 17,
    }
    layers = [
        {"op": "dense", "in": 40, "out": 70, "weight": "w1", "bias": "b1"},
        {"op": "gelu"},
        {"op": "layernorm", "weight": "g", "bias": "b"},
        {"op": "dense", "in": 70, "out": 300, "weight": "w2"},
        {"op": "relu"},
        {"op": "layernorm", "eps": 0.001},
        {"op": "dense", "in": 300, "out": 33, "weight": "w3"},
        {"op": "softmax"},
    ]
    data: dict[str, Any] = {
        "backend": "numpy",
        "inputs": [{"name": "X", "dtype": "FP32", "shape": [-1, 3, 40]}],
        "outputs": [{"name": "Y", "dtype": "FP32", "shape": [-1, 3, 33]}],
        "weights": "w.safetensors",
        "layers": layers,
    }
    config = model_config_from_dict(data, model="ops", version="1")
    cuda, ref = _pair(config, safetensors.numpy.save(tensors))
    try:
        first = cuda.memory_bytes
        for batch in (1, 5, 200):  # max_batch_size 0: buffers for 3 rows first, then grown
            x = {"X": _x(batch, 3, 40)}
            assert _max_err(cuda.infer(x), ref.infer(x)) < TOL, batch
        assert cuda.memory_bytes > first
    finally:
        cuda.close()


def test_memory_is_counted(mlp: tuple[CudaBackend, NumpyBackend]) -> None:
    weights = (64 * 256 + 256 + 256 * 16 + 16) * 4
    activations = 2 * 64 * 256 * 4  # two buffers of max_batch_size rows x the widest dim
    assert mlp[0].memory_bytes == weights + activations


def test_close_gives_the_device_memory_back() -> None:
    """A 64 MiB weight matrix, so the load shows in mem_get_info beyond the allocator's 2 MiB pages."""
    tensors = {"w": RNG.standard_normal((4096, 4096)).astype(np.float32), "b": np.zeros(4096, np.float32)}
    data: dict[str, Any] = {
        "backend": "cuda",
        "max_batch_size": 64,
        "inputs": [{"name": "X", "dtype": "FP32", "shape": [-1, 4096]}],
        "outputs": [{"name": "Y", "dtype": "FP32", "shape": [-1, 4096]}],
        "weights": "w.safetensors",
        "layers": [{"op": "dense", "in": 4096, "out": 4096, "weight": "w", "bias": "b"}],
    }
    config = model_config_from_dict(data, model="big", version="1")
    free_before, total = cuda_device.device_memory_info()
    cuda = CudaBackend(config, safetensors.numpy.save(tensors))
    free_loaded, _ = cuda_device.device_memory_info()
    assert cuda.memory_bytes == (4096 * 4096 + 4096) * 4 + 2 * 64 * 4096 * 4
    assert free_before - free_loaded >= cuda.memory_bytes
    assert cuda.measured_device_bytes >= cuda.memory_bytes
    cuda.infer({"X": _x(64, 4096)})
    cuda.close()
    free_after, _ = cuda_device.device_memory_info()
    assert abs(free_after - free_before) <= 4 * MIB, (free_before, free_loaded, free_after, total)
    assert cuda.memory_bytes == 0
    with pytest.raises(FailedPrecondition, match="closed"):
        cuda.infer({"X": _x(1, 4096)})


def test_two_models_on_two_streams_at_once(demo: dict[str, tuple[ModelConfig, bytes]]) -> None:
    pairs = [_pair(*demo["1"]), _pair(*demo["2"])]
    try:
        assert pairs[0][0].stream is not pairs[1][0].stream
        errors: list[float] = []
        failures: list[BaseException] = []

        def drive(cuda: CudaBackend, ref: NumpyBackend, seed: int) -> None:
            rng = np.random.default_rng(seed)
            try:
                for _ in range(50):
                    x = {"INPUT0": rng.standard_normal((16, 64)).astype(np.float32)}
                    errors.append(_max_err(cuda.infer(x), ref.infer(x)))
            except BaseException as err:  # reported by the main thread
                failures.append(err)

        threads = [threading.Thread(target=drive, args=(*pair, i)) for i, pair in enumerate(pairs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not failures, failures
        assert len(errors) == 100 and max(errors) < TOL
    finally:
        for cuda, _ in pairs:
            cuda.close()


def test_inputs_in_registered_caller_memory(demo: dict[str, tuple[ModelConfig, bytes]]) -> None:
    cuda, ref = _pair(*demo["1"])
    pool = mmap.mmap(-1, 4 * mmap.PAGESIZE)  # page-aligned, as the native pool's buffers are
    try:
        pinned = cuda.pin_host_memory(np.frombuffer(pool, dtype=np.float32))
        x = pinned[: 32 * 64].reshape(32, 64)
        x[...] = _x(32, 64)
        want = ref.infer({"INPUT0": x.copy()})
        assert _max_err(cuda.infer({"INPUT0": x}), want) < TOL
        del x, pinned
    finally:
        cuda.close()  # unregisters the memory before the mapping goes
    pool.close()
