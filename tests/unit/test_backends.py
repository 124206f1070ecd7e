"""Backends without a model repository: the numpy ops against their formulas, load-time checks, input
validation, error mapping, and ``create_backend``'s choices."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import safetensors.numpy
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper

from mcp_worker.backends import Backend, create_backend
from mcp_worker.backends.instances import Instances
from mcp_worker.backends.numpy_backend import NumpyBackend, dense, gelu, layernorm, relu, softmax
from mcp_worker.backends.onnx_backend import CPU_PROVIDER, CUDA_PROVIDER, OnnxBackend, choose_providers
from mcpcore.errors import DataLoss, FailedPrecondition, Internal, InvalidArgument, ResourceExhausted
from mcpcore.model_yaml import model_config_from_dict
from mcpcore.modelspec import ModelConfig

RNG = np.random.default_rng(0)


def _config(
    layers: list[dict[str, Any]], *, backend: str = "numpy", dims: tuple[int, int] = (4, 3), **more: Any
) -> ModelConfig:
    data = {
        **more,
        "backend": backend,
        "max_batch_size": 8,
        "inputs": [{"name": "X", "dtype": "FP32", "shape": [-1, dims[0]]}],
        "outputs": [{"name": "Y", "dtype": "FP32", "shape": [-1, dims[1]]}],
        "weights": "w.safetensors" if backend == "numpy" else "model.onnx",
    }
    if backend == "numpy":
        data["layers"] = layers
    return model_config_from_dict(data, model="m", version="1")


def _tensors() -> dict[str, np.ndarray]:
    return {
        "fc.weight": RNG.standard_normal((4, 3)).astype(np.float32),
        "fc.bias": RNG.standard_normal(3).astype(np.float32),
        "ln.weight": RNG.standard_normal(3).astype(np.float32),
        "ln.bias": RNG.standard_normal(3).astype(np.float32),
    }


DENSE = {"op": "dense", "in": 4, "out": 3, "weight": "fc.weight", "bias": "fc.bias"}


def _x(batch: int = 5, dim: int = 4) -> np.ndarray:
    return RNG.standard_normal((batch, dim)).astype(np.float32)


# --- ops ---------------------------------------------------------------------------------------------------


def test_dense_is_x_at_w_plus_b() -> None:
    x, w, b = _x(), _tensors()["fc.weight"], _tensors()["fc.bias"]
    np.testing.assert_allclose(dense(x, w, b), x @ w + b, rtol=1e-6)
    np.testing.assert_allclose(dense(x, w), x @ w, rtol=1e-6)


def test_relu_and_dtypes_stay_fp32() -> None:
    x = _x()
    np.testing.assert_array_equal(relu(x), np.where(x > 0, x, 0))
    for op in (relu, gelu, softmax, layernorm):
        assert op(x).dtype == np.float32, op.__name__


def test_gelu_is_the_tanh_approximation() -> None:
    x = np.linspace(-6, 6, 101, dtype=np.float32)
    want = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(gelu(x), want, rtol=1e-5, atol=1e-6)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.tolist()])
    np.testing.assert_allclose(gelu(x), exact, atol=1e-3)


def test_softmax_matches_formula_and_sums_to_one() -> None:
    x = _x()
    e = np.exp(x)
    np.testing.assert_allclose(softmax(x), e / e.sum(-1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(softmax(x).sum(-1), 1.0, rtol=1e-6)


def test_softmax_is_stable_for_large_values() -> None:
    big = np.array([[1000.0, 1001.0, 1002.0], [-1e30, 0.0, 1e30]], dtype=np.float32)
    out = softmax(big)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out[0], softmax(np.array([0.0, 1.0, 2.0], np.float32)), rtol=1e-6)
    np.testing.assert_allclose(out[1], [0.0, 0.0, 1.0])


@given(
    hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3), elements=st.floats(-100, 100, width=32)),
    st.floats(-100, 100, width=32),
)
def test_softmax_rows_sum_to_one_and_ignore_a_shift(x: np.ndarray, shift: float) -> None:
    out = softmax(x)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out.sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(softmax(x + np.float32(shift)), out, atol=1e-5)


def test_layernorm_normalises_the_last_axis() -> None:
    x = _x(6, 8) * 10 + 3
    y = layernorm(x)
    np.testing.assert_allclose(y.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(y.var(-1), 1.0, rtol=1e-3)
    w, b = RNG.standard_normal(8).astype(np.float32), RNG.standard_normal(8).astype(np.float32)
    want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-3) * w + b
    np.testing.assert_allclose(layernorm(x, w, b, eps=1e-3), want, rtol=1e-4, atol=1e-5)


def test_layernorm_of_a_constant_row_is_zero_thanks_to_eps() -> None:
    np.testing.assert_array_equal(layernorm(np.full((2, 5), 7.0, np.float32)), np.zeros((2, 5)))


# --- the numpy backend -------------------------------------------------------------------------------------


def _numpy_backend(layers: list[dict[str, Any]], tensors: dict[str, np.ndarray] | None = None) -> Backend:
    weights = safetensors.numpy.save(tensors if tensors is not None else _tensors())
    return create_backend(_config(layers), weights)


def test_a_full_layer_graph_matches_the_formulas() -> None:
    layers = [
        DENSE,
        {"op": "gelu"},
        {"op": "layernorm", "weight": "ln.weight", "bias": "ln.bias", "eps": 1e-3},
    ]
    layers += [{"op": "relu"}, {"op": "softmax"}, {"op": "sleep", "ms": 0}]
    t = _tensors()
    backend = _numpy_backend(layers, t)
    assert isinstance(backend, NumpyBackend)
    x = _x()
    want = softmax(
        relu(layernorm(gelu(x @ t["fc.weight"] + t["fc.bias"]), t["ln.weight"], t["ln.bias"], 1e-3))
    )
    out = backend.infer({"X": x})
    assert list(out) == ["Y"] and out["Y"].dtype == np.float32
    np.testing.assert_allclose(out["Y"], want, rtol=1e-5, atol=1e-6)
    assert backend.memory_bytes == sum(a.nbytes for a in t.values())
    backend.warmup()


def test_weights_are_converted_once_read_only_and_concurrent_calls_agree() -> None:
    t = {k: v.astype(np.float64) for k, v in _tensors().items()}
    backend = _numpy_backend([DENSE], t)
    x = _x(8)
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda _: backend.infer({"X": x})["Y"], range(32)))
    assert all(o.dtype == np.float32 for o in outs)
    for out in outs:
        np.testing.assert_array_equal(out, outs[0])


@pytest.mark.parametrize(
    ("tensors", "error", "words"),
    [
        ({"fc.bias": np.zeros(3, np.float32)}, InvalidArgument, ["'fc.weight'", "not in the weights"]),
        (
            {"fc.weight": np.zeros((3, 4), np.float32), "fc.bias": np.zeros(3, np.float32)},
            InvalidArgument,
            ["'fc.weight'", "[3, 4]", "expected [4, 3]", "[in, out]"],
        ),
        (
            {"fc.weight": np.zeros((4, 3), np.float32), "fc.bias": np.zeros(4, np.float32)},
            InvalidArgument,
            ["'fc.bias'", "[out]"],
        ),
        ({"fc.weight": np.zeros((4, 3), np.int32), "fc.bias": np.zeros(3)}, InvalidArgument, ["floating"]),
    ],
)
def test_bad_weights_name_the_tensor(tensors: dict[str, np.ndarray], error: type, words: list[str]) -> None:
    with pytest.raises(error) as info:
        _numpy_backend([DENSE], tensors)
    for word in words:
        assert word in info.value.message
    assert "m/1" in info.value.message and "layers[0] (dense)" in info.value.message


def test_unreadable_or_absent_weights() -> None:
    with pytest.raises(DataLoss, match="not a readable safetensors"):
        create_backend(_config([DENSE]), b"\x00garbage")
    with pytest.raises(InvalidArgument, match="no weights were given"):
        create_backend(_config([DENSE]), None)
    assert create_backend(_config([{"op": "relu"}], dims=(4, 4)), None).infer({"X": _x()})["Y"].shape == (
        5,
        4,
    )


# --- input validation and errors (on a fake subclass of the real interface) ---------------------------------


class _Fake(Backend):
    name = "fake"

    def __init__(self, config: ModelConfig, fail: Exception | None = None) -> None:
        super().__init__(config, None)
        self.fail, self.calls, self.released = fail, [], False
        self.memory_bytes = 1

    def _run(self, inputs: Mapping[str, np.ndarray], *, skip, parameters) -> dict[str, np.ndarray]:
        self.calls.append({k: v.shape for k, v in inputs.items()})
        if self.fail is not None:
            raise self.fail
        return {"Y": np.zeros((len(next(iter(inputs.values()))), 3), np.float32)}

    def _release(self) -> None:
        self.released = True


def _two_inputs() -> ModelConfig:
    data = {
        "backend": "onnx",
        "max_batch_size": 8,
        "inputs": [
            {"name": "A", "dtype": "FP32", "shape": [-1, 4]},
            {"name": "B", "dtype": "INT64", "shape": [-1, -1, 2]},
        ],
        "outputs": [{"name": "Y", "dtype": "FP32", "shape": [-1, 3]}],
        "weights": "model.onnx",
    }
    return model_config_from_dict(data, model="m", version="1")


def _ok() -> dict[str, Any]:
    return {"A": np.zeros((3, 4), np.float32), "B": np.zeros((3, 5, 2), np.int64)}


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"A": None}, ["expects inputs ['A', 'B']", "missing ['A']"]),
        ({"C": np.zeros(1)}, ["unexpected ['C']"]),
        ({"A": np.zeros((3, 4))}, ["input A", "expected dtype FP32, got FP64"]),
        ({"B": np.zeros((3, 2), np.int64)}, ["input B", "expected shape [-1, -1, 2], got [3, 2]"]),
        ({"A": np.zeros((3, 5), np.float32)}, ["input A", "expected shape [-1, 4], got [3, 5]"]),
        ({"A": [[0.0] * 4]}, ["input A", "expected a numpy array, got list"]),
        ({"A": np.zeros((9, 4), np.float32)}, ["batch size 9 is outside 1..8"]),
        ({"B": np.zeros((2, 5, 2), np.int64)}, ["input B has batch size 2 but A has 3"]),
        ({"A": np.zeros((3, 4), np.dtype(">f4"))}, ["expected dtype FP32, got numpy >f4"]),
    ],
)
def test_inputs_are_checked_before_running(change: dict[str, Any], words: list[str]) -> None:
    backend = _Fake(_two_inputs())
    inputs = {k: v for k, v in (_ok() | change).items() if v is not None}
    with pytest.raises(InvalidArgument) as info:
        backend.infer(inputs)
    for word in words:
        assert word in info.value.message
    assert backend.calls == []


def test_execution_errors_become_internal_with_a_short_message() -> None:
    backend = _Fake(_two_inputs(), fail=RuntimeError("kernel exploded\n  at frame 7\n  at frame 8"))
    with pytest.raises(Internal) as info:
        backend.infer(_ok())
    assert info.value.message == "model m/1 (fake backend): inference failed: RuntimeError: kernel exploded"
    backend.fail = InvalidArgument("passes through as is")
    with pytest.raises(InvalidArgument, match="passes through"):
        backend.infer(_ok())


def test_warmup_runs_zeros_of_batch_one_and_close_is_final() -> None:
    backend = _Fake(_two_inputs())
    backend.warmup()
    assert backend.calls == [{"A": (1, 4), "B": (1, 1, 2)}]
    backend.close()
    backend.close()
    assert backend.released and backend.memory_bytes == 0
    with pytest.raises(FailedPrecondition, match="closed"):
        backend.infer(_ok())


# --- create_backend and the onnx backend's load checks -----------------------------------------------------


def test_create_backend_rejects_unknown_and_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config([DENSE])
    with pytest.raises(InvalidArgument, match="unknown backend 'tpu'"):
        create_backend(dataclasses.replace(config, backend="tpu"), None)
    monkeypatch.setattr(NumpyBackend, "available", classmethod(lambda cls: (False, "no BLAS today")))
    with pytest.raises(FailedPrecondition, match="backend numpy is unavailable: no BLAS today"):
        create_backend(config, safetensors.numpy.save(_tensors()))


def _relu_onnx(name: str = "X", elem: int = TensorProto.FLOAT, dims: list[Any] | None = None) -> bytes:
    dims = dims or ["batch", 4]
    graph = helper.make_graph(
        [helper.make_node("Relu", [name], ["Y"])],
        "relu",
        [helper.make_tensor_value_info(name, elem, dims)],
        [helper.make_tensor_value_info("Y", elem, dims)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_onnx_backend_runs_from_bytes() -> None:
    backend = create_backend(_config([], backend="onnx", dims=(4, 4)), _relu_onnx())
    assert isinstance(backend, OnnxBackend) and backend.memory_bytes == len(_relu_onnx())
    x = _x()
    np.testing.assert_array_equal(backend.infer({"X": x})["Y"], relu(x))
    backend.close()
    with pytest.raises(FailedPrecondition):
        backend.infer({"X": x})


@pytest.mark.parametrize(
    ("model", "error", "words"),
    [
        (b"not a model", DataLoss, ["not an ONNX model"]),
        (_relu_onnx(name="INPUT"), InvalidArgument, ["inputs ['X'] differ", "['INPUT']"]),
        (_relu_onnx(elem=TensorProto.DOUBLE), InvalidArgument, ["input X", "FP32", "FP64"]),
        (_relu_onnx(dims=["batch", 5]), InvalidArgument, ["input X", "[-1, 4]", "[-1, 5]"]),
        (_relu_onnx(dims=[1, 4]), InvalidArgument, ["input X", "[1, 4]"]),
        (None, InvalidArgument, ["no model bytes"]),
    ],
)
def test_onnx_load_checks(model: bytes | None, error: type, words: list[str]) -> None:
    with pytest.raises(error) as info:
        create_backend(_config([], backend="onnx", dims=(4, 4)), model)
    for word in words:
        assert word in info.value.message


def test_onnx_is_importable_here() -> None:
    assert OnnxBackend.available() == (True, "")


# --- where a model runs: onnxruntime's providers, the CPU fallback, instance_count -------------------------


def test_choose_providers() -> None:
    cpu, gpu = (
        _config([], backend="onnx", dims=(4, 4)),
        _config([], backend="onnx", dims=(4, 4), device="gpu"),
    )
    fallback = _config([], backend="onnx", dims=(4, 4), device="gpu", cpu_fallback=True)
    both = [CUDA_PROVIDER, CPU_PROVIDER]
    assert choose_providers(cpu, both, 0, "m") == ([CPU_PROVIDER], "")
    assert choose_providers(gpu, both, 3, "m") == ([(CUDA_PROVIDER, {"device_id": 3}), CPU_PROVIDER], "")
    with pytest.raises(FailedPrecondition) as info:
        choose_providers(gpu, [CPU_PROVIDER], 0, "model m/1")
    for words in ("model m/1: device: gpu", f"no {CUDA_PROVIDER}", "onnxruntime-gpu", "cpu_fallback: true"):
        assert words in info.value.message
    providers, why = choose_providers(fallback, [CPU_PROVIDER], 0, "m")
    assert providers == [CPU_PROVIDER] and f"no {CUDA_PROVIDER}" in why


def test_an_onnx_model_asking_for_a_gpu_runs_on_the_cpu_only_when_allowed() -> None:
    """This machine's onnxruntime has no CUDA provider: the real load refuses, or falls back when asked."""
    with pytest.raises(
        FailedPrecondition, match="device: gpu, but this onnxruntime has no CUDAExecutionProvider"
    ):
        create_backend(_config([], backend="onnx", dims=(4, 4), device="gpu"), _relu_onnx())
    config = _config([], backend="onnx", dims=(4, 4), device="gpu", cpu_fallback=True)
    backend = create_backend(config, _relu_onnx(), device=1)
    assert (backend.device, backend.memory_bytes) == ("cpu", len(_relu_onnx()))
    assert CUDA_PROVIDER in backend.fallback
    x = _x()
    np.testing.assert_array_equal(backend.infer({"X": x})["Y"], relu(x))
    backend.close()


@pytest.mark.parametrize(
    ("backend", "more", "words"),
    [
        ("numpy", {"device": "gpu"}, "backend numpy runs on cpu only, not gpu; backend cuda"),
        ("onnx", {"device": "tpu"}, "device: one of cpu, gpu, got str 'tpu'"),
        ("onnx", {"cpu_fallback": True}, "cpu_fallback: only for backend onnx with device: gpu"),
        ("onnx", {"device": "gpu", "cpu_fallback": "yes"}, "cpu_fallback: expected true or false"),
    ],
)
def test_device_settings_are_checked(backend: str, more: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        _config([DENSE] if backend == "numpy" else [], backend=backend, dims=(4, 3), **more)


def test_instance_count_loads_that_many_and_spreads_runs_over_them() -> None:
    config = _config([DENSE], instance_count=3)
    weights = safetensors.numpy.save(_tensors())
    backend = create_backend(config, weights)
    assert isinstance(backend, Instances) and len(backend.instances) == 3
    assert backend.memory_bytes == 3 * backend.instances[0].memory_bytes > 0
    used: list[int] = []
    for instance in backend.instances:  # record which instance ran each call
        run = instance._run
        instance._run = lambda *a, _run=run, _i=instance, **k: (used.append(id(_i)), _run(*a, **k))[1]  # type: ignore[method-assign]
    x = _x()
    with ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(lambda _: backend.infer({"X": x})["Y"], range(60)))
    single = create_backend(_config([DENSE]), weights)
    for out in outs:
        np.testing.assert_allclose(out, single.infer({"X": x})["Y"], rtol=1e-6)
    assert len(set(used)) == 3 and backend.runs() == [0, 0, 0]
    backend.on_work = print  # what the worker sets after a load reaches every copy
    assert all(instance.on_work is print for instance in backend.instances) and backend.on_work is print
    backend.close()
    assert all(instance._closed for instance in backend.instances)


def test_a_failed_instance_closes_the_ones_already_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Backend] = []
    real_init = NumpyBackend.__init__

    def init(self: NumpyBackend, *args: Any, **kwargs: Any) -> None:
        if len(made) == 2:
            raise InvalidArgument("the third copy does not fit")
        real_init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(NumpyBackend, "__init__", init)
    with pytest.raises(InvalidArgument, match="third copy"):
        create_backend(_config([DENSE], instance_count=3), safetensors.numpy.save(_tensors()))
    assert len(made) == 2 and all(b._closed for b in made)


def test_all_copies_must_fit_before_the_second_is_made() -> None:
    asked: list[int] = []

    def fits(nbytes: int) -> None:
        asked.append(nbytes)
        raise ResourceExhausted(f"{nbytes} bytes do not fit")

    made: list[Backend] = []
    real_init = NumpyBackend.__init__

    def init(self: NumpyBackend, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        made.append(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(NumpyBackend, "__init__", init)
        with pytest.raises(ResourceExhausted, match="do not fit"):
            create_backend(_config([DENSE], instance_count=4), safetensors.numpy.save(_tensors()), fits=fits)
    one = create_backend(_config([DENSE]), safetensors.numpy.save(_tensors())).memory_bytes
    assert len(made) == 1 and made[0]._closed and asked == [4 * one] and one > 0
    with pytest.raises(InvalidArgument, match="instance_count: must be <= 64"):
        _config([DENSE], instance_count=65)
