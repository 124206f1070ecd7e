"""ONNX models on a real GPU through onnxruntime's CUDA execution provider: outputs equal the CPU
provider's within 1e-4, the session really runs on CUDA (``device`` ``gpu:0``, no fallback), device memory
is measured at load and given back by ``close``, and ``instance_count`` copies all serve.

Marked ``gpu`` and skipped, with the reason, where this onnxruntime has no CUDA provider or no GPU is
visible: on a CPU machine these are skipped, never passed (tests/unit/test_backends.py and
tests/integration/test_devices.py cover the provider choice and the CPU fallback there).
"""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path

import numpy as np
import pytest

from mcp_worker.backends import create_backend
from mcp_worker.backends.instances import Instances
from mcp_worker.backends.onnx_backend import CUDA_PROVIDER, _device_used_bytes, ort
from mcpcore.model_yaml import load_model_yaml

_WHY = ""
if ort is None or CUDA_PROVIDER not in ort.get_available_providers():
    _WHY = "this onnxruntime has no CUDAExecutionProvider (onnxruntime-gpu is not installed)"
elif _device_used_bytes(0) is None:
    _WHY = "NVML sees no GPU"
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(bool(_WHY), reason=f"needs a GPU and onnxruntime-gpu: {_WHY}"),
]

TOL = 1e-4


@pytest.fixture(scope="module")
def onnx_model(demo_repo: Path) -> tuple[Path, bytes]:
    vdir = demo_repo / "demo-onnx" / "1"
    return vdir, (vdir / "model.onnx").read_bytes()


@pytest.mark.parametrize("batch", [1, 7, 64])
def test_cuda_provider_matches_the_cpu(onnx_model: tuple[Path, bytes], batch: int) -> None:
    vdir, weights = onnx_model
    cpu_config = load_model_yaml(vdir)
    gpu = create_backend(dataclasses.replace(cpu_config, device="gpu"), weights, device=0)
    cpu = create_backend(cpu_config, weights)
    assert (gpu.device, gpu.fallback) == ("gpu:0", "")
    x = np.random.default_rng(batch).standard_normal((batch, 64)).astype(np.float32)
    for name, want in cpu.infer({"INPUT0": x}).items():
        assert np.max(np.abs(gpu.infer({"INPUT0": x})[name] - want)) < TOL
    gpu.close()
    cpu.close()


def test_device_memory_is_measured_and_given_back(onnx_model: tuple[Path, bytes]) -> None:
    vdir, weights = onnx_model
    config = dataclasses.replace(load_model_yaml(vdir), device="gpu", instance_count=2)
    create_backend(dataclasses.replace(config, instance_count=1), weights, device=0).close()  # the context
    gc.collect()
    before = _device_used_bytes(0)
    backend = create_backend(config, weights, device=0)
    assert isinstance(backend, Instances)
    assert backend.instances[1].measured_device_bytes > 0  # the second copy: no CUDA context in its figure
    backend.warmup()
    backend.close()
    del backend
    gc.collect()
    after = _device_used_bytes(0)
    assert before is not None and after is not None and after - before < 64 << 20  # the CUDA context stays
