"""The reference backend: runs a model.yaml layer graph with numpy, weights from a safetensors file.

Layouts and formulas (the cuda backend must match them):

- ``dense``: ``y = x @ W + b`` with ``W`` stored ``[in, out]`` (not PyTorch's ``[out, in]``) and the
  optional ``b`` ``[out]``; leading dims pass through.
- ``relu``: ``max(x, 0)``.
- ``gelu``: the tanh approximation ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (as in GPT-2 and
  PyTorch's ``approximate="tanh"``), not the erf form; the two differ by < 1e-3.
- ``softmax``: over the last axis, after subtracting the row maximum so that large inputs do not overflow.
- ``layernorm``: over the last axis, ``(x - mean) / sqrt(var + eps) * weight + bias`` with the population
  variance, ``eps`` 1e-5 unless the layer sets it, ``weight``/``bias`` ``[dim]`` and both optional.
- ``sleep``: waits ``ms`` milliseconds and passes ``x`` through (the deliberately slow demo model).

Invariants:
- Everything is checked at load: every tensor a layer names exists, is floating point and has the shape
  the layer needs (``InvalidArgument`` naming the layer and tensor); unreadable bytes are ``DataLoss``.
- Weights are converted once at load to contiguous, read-only arrays of the input's dtype, copied out of
  the file's buffer, and computation stays in that dtype (FP32 for the demo models). Nothing mutates
  after load, so concurrent ``infer`` calls are safe.
- The layer graph has no optional parts: ``secondary_features`` changes nothing here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial

import numpy as np
import safetensors.numpy

from mcp_worker.backends.base import Backend, short_error
from mcpcore import dtypes
from mcpcore.errors import DataLoss, FailedPrecondition, InvalidArgument
from mcpcore.modelspec import Layer, ModelConfig

__all__ = ["LAYERNORM_EPS", "NumpyBackend", "dense", "gelu", "layernorm", "relu", "softmax"]

LAYERNORM_EPS = 1e-5
_GELU_C = math.sqrt(2.0 / math.pi)

Step = Callable[[np.ndarray], np.ndarray]


# --- the ops: pure functions of arrays, in the input's dtype (Python floats are weak scalars in numpy 2) ---


def dense(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    y = x @ weight
    if bias is not None:
        y += bias
    return y


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(_GELU_C * (x + 0.044715 * (x * x * x))))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    e /= e.sum(axis=-1, keepdims=True)
    return e


def layernorm(
    x: np.ndarray,
    weight: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    eps: float = LAYERNORM_EPS,
) -> np.ndarray:
    centred = x - x.mean(axis=-1, keepdims=True)
    var = (centred * centred).mean(axis=-1, keepdims=True)
    y = centred / np.sqrt(var + eps)
    if weight is not None:
        y *= weight
    if bias is not None:
        y += bias
    return y


def _sleep(x: np.ndarray, seconds: float) -> np.ndarray:
    time.sleep(seconds)
    return x


_PLAIN: dict[str, Step] = {"relu": relu, "gelu": gelu, "softmax": softmax}


# --- loading ------------------------------------------------------------------------------------------------


class NumpyBackend(Backend):
    """A layer graph (one input, one output) run op by op with numpy."""

    name = "numpy"

    def __init__(self, config: ModelConfig, weights: bytes | None) -> None:
        super().__init__(config, weights)
        if not config.layers or len(config.inputs) != 1 or len(config.outputs) != 1:
            raise InvalidArgument(f"{self._where}: needs a layer graph with one input and one output")
        src, dst = config.inputs[0], config.outputs[0]
        self._input, self._output = src.name, dst.name
        self._out_dtype = dtypes.numpy_dtype(dst.dtype)
        tensors = _Tensors(weights, self._dtypes[src.name], self._where, config.layers)
        self._steps = tuple(_compile(config.layers, tensors, src.shape[-1]))
        self.memory_bytes = tensors.held_bytes

    def _run(self, inputs: Mapping[str, np.ndarray], *, secondary_features: bool) -> dict[str, np.ndarray]:
        steps = self._steps  # one read: a concurrent close leaves this run its steps, or none at all
        if not steps:
            raise FailedPrecondition(f"{self._where} is closed")
        x = inputs[self._input]
        y = x
        for step in steps:
            y = step(y)
        if y is x:  # a graph of sleeps only: never hand the caller's buffer back as the output
            y = x.copy()
        return {self._output: y.astype(self._out_dtype, copy=False)}

    def _release(self) -> None:
        self._steps = ()


class _Tensors:
    """The weights file's tensors, checked and converted on first use; counts the bytes it hands out."""

    def __init__(self, weights: bytes | None, dtype: np.dtype, where: str, layers: Sequence[Layer]) -> None:
        self._dtype = dtype
        self.where = where
        self._converted: dict[str, np.ndarray] = {}
        self.held_bytes = 0
        needed = [n for layer in layers for n in (layer.weight, layer.bias) if n]
        self._raw: dict[str, np.ndarray] = {}
        if not needed:
            return
        if weights is None:
            raise InvalidArgument(f"{where}: layers name tensors {needed} but no weights were given")
        try:
            self._raw = safetensors.numpy.load(bytes(weights))
        except Exception as err:
            detail = short_error(err)
            raise DataLoss(f"{where}: the weights are not a readable safetensors file: {detail}") from None

    def get(self, name: str, shape: tuple[int, ...], at: str, layout: str) -> np.ndarray:
        """Tensor ``name`` with exactly ``shape``, as a read-only contiguous array of the compute dtype."""
        if name in self._converted:
            array = self._converted[name]
        else:
            raw = self._raw.get(name)
            if raw is None:
                held = ", ".join(sorted(self._raw)) or "nothing"
                raise InvalidArgument(
                    f"{self.where}: {at}: tensor {name!r} is not in the weights file (it has {held})"
                )
            if raw.dtype.kind != "f":
                raise InvalidArgument(
                    f"{self.where}: {at}: tensor {name!r} must be floating point, got {raw.dtype}"
                )
            array = np.array(raw, dtype=self._dtype, order="C", copy=True)  # owned: the file can go
            array.flags.writeable = False
            self._converted[name] = array
            self.held_bytes += array.nbytes
        if array.shape != shape:
            raise InvalidArgument(
                f"{self.where}: {at}: tensor {name!r} has shape {list(array.shape)}, expected {list(shape)}"
                f" ({layout})"
            )
        return array


def _compile(layers: Sequence[Layer], tensors: _Tensors, dim: int) -> list[Step]:
    """One step per layer with its weights bound; ``dim`` is the incoming last dim."""
    steps: list[Step] = []
    for i, layer in enumerate(layers):
        at = f"layers[{i}] ({layer.op})"
        if layer.op == "dense":
            assert layer.weight is not None and layer.in_dim is not None and layer.out_dim is not None
            layout = "dense weights are [in, out]: y = x @ W + b"
            w = tensors.get(layer.weight, (layer.in_dim, layer.out_dim), at, layout)
            b = tensors.get(layer.bias, (layer.out_dim,), at, "a dense bias is [out]") if layer.bias else None
            steps.append(partial(dense, weight=w, bias=b))
            dim = layer.out_dim
        elif layer.op == "layernorm":
            layout = f"layernorm weight and bias are [{dim}], the incoming last dim"
            w = tensors.get(layer.weight, (dim,), at, layout) if layer.weight else None
            b = tensors.get(layer.bias, (dim,), at, layout) if layer.bias else None
            eps = LAYERNORM_EPS if layer.eps is None else layer.eps
            steps.append(partial(layernorm, weight=w, bias=b, eps=eps))
        elif layer.op == "sleep":
            steps.append(partial(_sleep, seconds=(layer.ms or 0.0) / 1000.0))
        elif layer.op in _PLAIN:
            steps.append(_PLAIN[layer.op])
        else:
            raise InvalidArgument(f"{tensors.where}: {at}: the numpy backend has no op {layer.op!r}")
    return steps
