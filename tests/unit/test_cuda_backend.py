"""The cuda backend without a GPU: it imports without pycuda, says why it is unavailable, refuses to load
through ``create_backend`` with that reason, plans a layer graph exactly as the numpy backend checks it, and
agrees with kernels.cu on kernel names, argument formats and launch constants.

The runs themselves are in tests/gpu (skipped where there is no GPU)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy

from mcp_worker.backends import create_backend, cuda_device
from mcp_worker.backends.cuda_backend import KERNELS, ROW_THREADS, TILE, CudaBackend, plan_layers
from mcp_worker.backends.numpy_backend import LAYERNORM_EPS
from mcpcore.errors import FailedPrecondition, InvalidArgument
from mcpcore.model_yaml import model_config_from_dict
from mcpcore.modelspec import ModelConfig

KERNELS_CU = Path(__file__).resolve().parents[2] / "libs" / "native" / "cuda" / "kernels.cu"
RNG = np.random.default_rng(7)
WHERE = "model m/1 (cuda backend)"


def _config(
    layers: list[dict[str, Any]], *, dims: tuple[int, int] = (64, 16), dtype: str = "FP32"
) -> ModelConfig:
    data = {
        "backend": "cuda",
        "max_batch_size": 64,
        "inputs": [{"name": "INPUT0", "dtype": dtype, "shape": [-1, dims[0]]}],
        "outputs": [{"name": "OUTPUT0", "dtype": dtype, "shape": [-1, dims[1]]}],
        "weights": "weights.safetensors",
        "layers": layers,
    }
    return model_config_from_dict(data, model="m", version="1")


MLP = [
    {"op": "dense", "in": 64, "out": 256, "weight": "fc1.weight", "bias": "fc1.bias"},
    {"op": "relu"},
    {"op": "dense", "in": 256, "out": 16, "weight": "fc2.weight", "bias": "fc2.bias"},
]


def _mlp_weights() -> dict[str, np.ndarray]:
    shapes = {"fc1.weight": (64, 256), "fc1.bias": (256,), "fc2.weight": (256, 16), "fc2.bias": (16,)}
    return {name: RNG.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


@pytest.fixture
def no_pycuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import pycuda`` fail here, whether or not this machine has it."""
    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)


def _fake_driver(monkeypatch: pytest.MonkeyPatch, *, devices: int) -> None:
    """A stand-in for ``pycuda.driver`` with only what ``available()`` asks of the driver."""
    driver = types.ModuleType("pycuda.driver")
    driver.init = lambda flags=0: None  # type: ignore[attr-defined]
    driver.Device = types.SimpleNamespace(count=lambda: devices)  # type: ignore[attr-defined]
    package = types.ModuleType("pycuda")
    package.driver = driver  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pycuda", package)
    monkeypatch.setitem(sys.modules, "pycuda.driver", driver)


# --- without pycuda ----------------------------------------------------------------------------------------


def test_modules_import_without_pycuda() -> None:
    code = (
        "import sys; sys.modules['pycuda'] = None\n"
        "import mcp_worker.backends.cuda_backend, mcp_worker.backends.cuda_device\n"
        "assert 'pycuda.driver' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.skipif(importlib.util.find_spec("pycuda") is not None, reason="pycuda is installed here")
def test_unavailable_here_because_pycuda_is_missing() -> None:
    ok, reason = CudaBackend.available()
    assert not ok
    assert reason.startswith("pycuda is not importable")


@pytest.mark.usefixtures("no_pycuda")
def test_unavailable_without_pycuda_says_what_to_do() -> None:
    ok, reason = CudaBackend.available()
    assert not ok
    assert "pycuda is not importable" in reason and "tools/prepare_gpu_wheels.sh" in reason


@pytest.mark.usefixtures("no_pycuda")
def test_create_backend_refuses_with_the_reason() -> None:
    weights = safetensors.numpy.save(_mlp_weights())
    why = r"m/1: backend cuda is unavailable: pycuda is not importable"
    with pytest.raises(FailedPrecondition, match=why):
        create_backend(_config(MLP), weights)


def test_unavailable_without_kernels(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_driver(monkeypatch, devices=1)
    monkeypatch.setenv(cuda_device.FATBIN_ENV, str(tmp_path / "missing.fatbin"))
    ok, reason = CudaBackend.available()
    assert not ok
    assert f"the CUDA kernels are not built: {tmp_path / 'missing.fatbin'} is missing" in reason
    assert "libs/native/cuda/build.sh" in reason


@pytest.mark.parametrize(
    ("devices", "index", "why"),
    [
        (0, "0", "no CUDA device is visible"),
        (1, "2", "MCP_CUDA_DEVICE=2 but only 1 CUDA device(s) are visible"),
        (1, "first", "MCP_CUDA_DEVICE must be a device index"),
    ],
)
def test_unavailable_without_the_device(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, devices: int, index: str, why: str
) -> None:
    _fake_driver(monkeypatch, devices=devices)
    fatbin = tmp_path / "k.fatbin"
    fatbin.write_bytes(b"\0")
    monkeypatch.setenv(cuda_device.FATBIN_ENV, str(fatbin))
    monkeypatch.setenv(cuda_device.DEVICE_ENV, index)
    ok, reason = CudaBackend.available()
    assert not ok and why in reason


def test_available_with_driver_device_and_kernels(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_driver(monkeypatch, devices=2)
    fatbin = tmp_path / "k.fatbin"
    fatbin.write_bytes(b"\0")
    monkeypatch.setenv(cuda_device.FATBIN_ENV, str(fatbin))
    monkeypatch.setenv(cuda_device.DEVICE_ENV, "1")
    assert CudaBackend.available() == (True, "")


def test_default_kernels_path_is_the_native_build_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cuda_device.FATBIN_ENV, raising=False)
    assert cuda_device.kernels_path().parts[-4:] == ("libs", "native", "build", "mcp_kernels.fatbin")


# --- the plan: the numpy backend's checks, FP32 launches --------------------------------------------------


def test_plan_of_the_demo_mlp() -> None:
    tensors = _mlp_weights()
    ops = plan_layers(_config(MLP), safetensors.numpy.save(tensors), WHERE)
    assert [(op.kind, op.dim_in, op.dim_out) for op in ops] == [
        ("dense", 64, 256),
        ("relu", 256, 256),
        ("dense", 256, 16),
    ]
    assert ops[0].weight is not None and ops[0].bias is not None
    np.testing.assert_array_equal(ops[0].weight, tensors["fc1.weight"])
    np.testing.assert_array_equal(ops[2].bias, tensors["fc2.bias"])
    assert ops[0].weight.dtype == np.float32 and ops[0].weight.flags.c_contiguous


def test_plan_of_every_op() -> None:
    layers = [
        {"op": "sleep", "ms": 5},
        {"op": "dense", "in": 8, "out": 6, "weight": "w"},
        {"op": "gelu"},
        {"op": "layernorm", "weight": "g", "bias": "b", "eps": 0.001},
        {"op": "layernorm"},
        {"op": "softmax"},
    ]
    tensors = {"w": RNG.standard_normal((8, 6)), "g": np.ones(6), "b": np.zeros(6)}  # float64 in the file
    ops = plan_layers(_config(layers, dims=(8, 6)), safetensors.numpy.save(tensors), WHERE)
    assert [op.kind for op in ops] == ["sleep", "dense", "gelu", "layernorm", "layernorm", "softmax"]
    assert ops[0].seconds == pytest.approx(0.005)
    assert ops[1].bias is None and ops[1].weight is not None and ops[1].weight.dtype == np.float32
    assert (ops[3].eps, ops[4].eps) == (0.001, LAYERNORM_EPS)
    assert ops[4].weight is None and ops[4].bias is None


@pytest.mark.parametrize("dtype", ["FP16", "FP64"])
def test_plan_refuses_other_dtypes(dtype: str) -> None:
    with pytest.raises(InvalidArgument, match=f"computes in FP32 but input INPUT0 is {dtype}"):
        plan_layers(_config(MLP, dtype=dtype), safetensors.numpy.save(_mlp_weights()), WHERE)


def test_plan_reports_weight_errors_as_the_numpy_backend_does() -> None:
    tensors = _mlp_weights()
    tensors["fc1.weight"] = tensors["fc1.weight"].T.copy()  # PyTorch's [out, in]
    why = r"layers\[0\] \(dense\): tensor 'fc1.weight' has shape \[256, 64\]"
    with pytest.raises(InvalidArgument, match=why):
        plan_layers(_config(MLP), safetensors.numpy.save(tensors), WHERE)
    with pytest.raises(InvalidArgument, match="no weights were given"):
        plan_layers(_config(MLP), None, WHERE)


# --- agreement with kernels.cu ---------------------------------------------------------------------------


def _kernel_signatures() -> dict[str, list[str]]:
    text = KERNELS_CU.read_text()
    found = re.findall(r'extern "C" __global__ void (\w+)\(([^)]*)\)', text)
    return {name: [p.strip() for p in params.split(",")] for name, params in found}


def _struct_char(param: str) -> str:
    if "*" in param:
        return "P"
    for ctype, char in (("long long", "q"), ("int", "i"), ("float", "f")):
        if param.startswith(ctype + " "):
            return char
    raise AssertionError(f"no struct character for kernel parameter {param!r}")


def test_kernel_names_and_argument_formats_match_kernels_cu() -> None:
    signatures = _kernel_signatures()
    assert set(signatures) == set(KERNELS)
    for name, fmt in KERNELS.items():
        assert "".join(_struct_char(p) for p in signatures[name]) == fmt, name


def test_launch_constants_match_kernels_cu() -> None:
    text = KERNELS_CU.read_text()
    assert re.search(rf"#define MCP_TILE {TILE}\b", text)
    assert re.search(rf"#define MCP_ROW_THREADS {ROW_THREADS}\b", text)


class _FakeRegistered(np.ndarray):
    """What pycuda's register_host_memory returns: an array whose ``base`` can be unregistered."""

    @property
    def base(self):  # type: ignore[override]
        return self._holder


def test_staging_buffers_come_from_a_page_aligned_pinned_pool_block(built_library):
    """The one boundary here without a GPU: which host memory gets registered, and that it is let go."""
    calls: list[str] = []

    class Holder:
        def unregister(self) -> None:
            calls.append("unregister")

    class FakeCuda:
        @staticmethod
        def register_host_memory(array: np.ndarray) -> np.ndarray:
            calls.append(f"register {array.__array_interface__['data'][0] % 4096} {array.nbytes % 4096}")
            view = array.view(_FakeRegistered)
            view._holder = Holder()
            return view

    from mcp_worker.backends import cuda_backend  # noqa: PLC0415

    h_in, h_out, release = cuda_backend._pinned_io(FakeCuda, 64 * 64, 64 * 16)
    assert calls == ["register 0 0"]  # page-aligned start and length, as cuMemHostRegister needs
    assert h_in.dtype == np.float32 and h_in.size == 64 * 64 and h_out.size == 64 * 16
    assert h_out.__array_interface__["data"][0] % 4096 == 0
    h_in[:] = 1.0
    h_out[:] = 2.0
    assert h_in.sum() == 64 * 64 and h_out.sum() == 2 * 64 * 16  # the two views do not overlap
    release()
    assert calls[-1] == "unregister"
