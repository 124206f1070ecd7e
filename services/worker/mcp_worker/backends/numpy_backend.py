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
- ``count``: the stateful op of the non-idempotent demo model: row ``i`` of a batch gets
  ``counter + i + 1`` and the counter grows by the batch's rows (one counter per loaded model, so per
  worker); the last dim becomes 1.
- ``fail``: fault injection, as Envoy's fault filter aborts a share of requests: passes ``x`` through, but
  fails a fraction of the batches with ``Unavailable`` "injected fault ..." (``INJECTED_FAULT``). The
  fraction is the number in the layer's ``ratio_file``, a file of the model's version directory that the
  operator writes (absent, empty or unreadable: 0), read again whenever it changes, so a drill can start
  and heal the fault without a reload. Failures are spread evenly (every batch adds the ratio to a
  balance; a batch fails when the balance reaches 1), so a run of N batches fails ``round(N * ratio)``.
  Nothing in a request can reach it; the warm-up never fails (the directory is bound after it). It is
  ``UNAVAILABLE``, a server-side class: the routers count it for the breakers, and it is not a backend
  crash that makes the health service stop the worker (the model fails, not the worker).

Invariants:
- Everything is checked at load: every tensor a layer names exists, is floating point and has the shape
  the layer needs (``InvalidArgument`` naming the layer and tensor); unreadable bytes are ``DataLoss``.
- Weights are converted once at load to contiguous, read-only arrays of the input's dtype, copied out of
  the file's buffer, and computation stays in that dtype (FP32 for the demo models). Nothing mutates
  after load but the ``count`` op's counter (under a lock), so concurrent ``infer`` calls are safe.
- A run computes only the layers the wanted outputs need: outputs in ``skip`` (breaker level 2 drops the
  model's secondary features) cost nothing. ``on_work`` (if set) gets the multiply-accumulates each run's
  dense layers did, so the work a breaker saves is measured.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial

import numpy as np
import safetensors.numpy
import threadpoolctl

from mcp_worker.backends.base import Backend, short_error
from mcpcore import dtypes
from mcpcore.errors import DataLoss, FailedPrecondition, InvalidArgument, Unavailable
from mcpcore.modelspec import Layer, ModelConfig, layer_reads

__all__ = [
    "INJECTED_FAULT", "LAYERNORM_EPS", "Counter", "FaultInjector", "NumpyBackend", "dense", "gelu",
    "layernorm", "limit_blas_threads", "relu", "softmax",
]  # fmt: skip

log = logging.getLogger(__name__)

LAYERNORM_EPS = 1e-5
#: The start of every injected failure's message: clients tell the drill's errors from real ones by it.
INJECTED_FAULT = "injected fault"
_GELU_C = math.sqrt(2.0 / math.pi)

Step = Callable[[np.ndarray], np.ndarray]


def limit_blas_threads(threads: int) -> int:
    """Cap the threads of every BLAS this process loaded (``dense``'s matrix products) at ``threads``, for
    the whole process (0: leave them); returns how many the BLAS libraries now use at most (0: none
    loaded), as they report it."""
    if threads:
        threadpoolctl.threadpool_limits(limits=threads, user_api="blas")
    return max(
        (lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"),
        default=0,
    )


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


class Counter:
    """The ``count`` op: numbers the rows it sees, across batches (the demo's non-idempotent state)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        rows = x.shape[0] if x.ndim else 1
        with self._lock:
            first, self.value = self.value, self.value + rows
        out = np.arange(first + 1, first + rows + 1, dtype=x.dtype)
        return out.reshape((*x.shape[:-1], 1)) if x.ndim else out


class FaultInjector:
    """The ``fail`` op: fails the share of batches its ratio file asks for (module docstring)."""

    def __init__(self, ratio_file: str, where: str) -> None:
        self._name, self._where = ratio_file, where
        self.directory: os.PathLike[str] | str | None = None  # bound after the warm-up
        self._lock = threading.Lock()
        self._seen: tuple[float, int] | None = None  # (mtime, size) of the file as last read
        self.ratio = 0.0
        self._balance = 0.0

    def _refresh(self) -> None:
        path = os.path.join(self.directory, self._name)  # type: ignore[arg-type]
        try:
            st = os.stat(path)
        except OSError:
            self._seen, self.ratio = None, 0.0
            return
        if self._seen == (st.st_mtime, st.st_size):
            return
        self._seen = (st.st_mtime, st.st_size)
        try:
            with open(path) as f:
                ratio = float(f.read().strip() or 0)
        except (OSError, ValueError) as err:
            log.warning("%s: fault ratio file %s unreadable (%s): no faults", self._where, path, err)
            ratio = 0.0
        self.ratio = min(1.0, max(0.0, ratio)) if math.isfinite(ratio) else 0.0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.directory is None:
            return x
        with self._lock:
            self._refresh()
            self._balance += self.ratio
            fail = self._balance >= 1.0 - 1e-9
            if fail:
                self._balance -= 1.0
        if fail:
            raise Unavailable(f"{INJECTED_FAULT} ({self.ratio:g} of batches fail): {self._where}, fail layer")
        return x


_PLAIN: dict[str, Step] = {"relu": relu, "gelu": gelu, "softmax": softmax}


# --- loading ------------------------------------------------------------------------------------------------


class NumpyBackend(Backend):
    """A layer graph (one input, one or more outputs) run op by op with numpy."""

    name = "numpy"
    inline = True  # pure numpy, any thread; a ``sleep`` layer makes every batch slow: never inline then

    def __init__(self, config: ModelConfig, weights: bytes | None) -> None:
        super().__init__(config, weights)
        if not config.layers or len(config.inputs) != 1:
            raise InvalidArgument(f"{self._where}: needs a layer graph with one input")
        src = config.inputs[0]
        self._input = src.name
        self._out_dtypes = {o.name: dtypes.numpy_dtype(o.dtype) for o in config.outputs}
        tensors = _Tensors(weights, self._dtypes[src.name], self._where, config.layers)
        self._reads = layer_reads(config.layers, src.name)
        self._steps = tuple(_compile(config.layers, tensors, src.shape[-1], self._reads))
        self._plans: dict[frozenset[str], tuple[int, ...]] = {}
        self._faults = [step for step in self._steps if isinstance(step, FaultInjector)]
        self.memory_bytes = tensors.held_bytes
        self.on_work: Callable[[int], None] | None = None

    def _run(
        self, inputs: Mapping[str, np.ndarray], *, skip: frozenset[str], parameters: Mapping[str, str]
    ) -> dict[str, np.ndarray]:
        steps = self._steps  # one read: a concurrent close leaves this run its steps, or none at all
        if not steps:
            raise FailedPrecondition(f"{self._where} is closed")
        x = inputs[self._input]
        results: dict[int, np.ndarray] = {}
        outputs: dict[str, np.ndarray] = {}
        macs = 0
        for i in self._plan(skip):
            layer, step = self.config.layers[i], steps[i]
            arg = x if self._reads[i] < 0 else results[self._reads[i]]
            y = step(arg)
            if layer.op == "dense":
                macs += (arg.size // max(1, arg.shape[-1])) * (layer.in_dim or 0) * (layer.out_dim or 0)
            results[i] = y
            if layer.output is not None:
                if y is x:  # a graph of sleeps only: never hand the caller's buffer back as the output
                    y = x.copy()
                outputs[layer.output] = y.astype(self._out_dtypes[layer.output], copy=False)
        if self.on_work is not None and macs:
            self.on_work(macs)
        return outputs

    @property
    def fault_directory(self) -> os.PathLike[str] | str | None:
        """Where ``fail`` layers find their ratio files (the version directory; the worker binds it)."""
        return self._faults[0].directory if self._faults else None

    @fault_directory.setter
    def fault_directory(self, directory: os.PathLike[str] | str | None) -> None:
        for fault in self._faults:
            fault.directory = directory

    def _plan(self, skip: frozenset[str]) -> tuple[int, ...]:
        """The layers the outputs not in ``skip`` need, in order (cached per ``skip``)."""
        plan = self._plans.get(skip)
        if plan is None:
            need = {
                i for i, layer in enumerate(self.config.layers) if layer.output and layer.output not in skip
            }
            for i in range(len(self.config.layers) - 1, -1, -1):
                if i in need and self._reads[i] >= 0:
                    need.add(self._reads[i])
            plan = self._plans[skip] = tuple(sorted(need))
        return plan

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


def _compile(layers: Sequence[Layer], tensors: _Tensors, input_dim: int, reads: Sequence[int]) -> list[Step]:
    """One step per layer with its weights bound; ``input_dim`` is the model input's last dim, ``reads``
    what each layer reads (``modelspec.layer_reads``)."""
    steps: list[Step] = []
    dims: list[int] = []
    for i, layer in enumerate(layers):
        at = f"layers[{i}] ({layer.op})"
        dim = input_dim if reads[i] < 0 else dims[reads[i]]
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
        elif layer.op == "count":
            steps.append(Counter())
            dim = 1
        elif layer.op == "fail":
            assert layer.ratio_file is not None  # required by modelspec
            steps.append(FaultInjector(layer.ratio_file, tensors.where))
        elif layer.op in _PLAIN:
            steps.append(_PLAIN[layer.op])
        else:
            raise InvalidArgument(f"{tensors.where}: {at}: the numpy backend has no op {layer.op!r}")
        dims.append(dim)
    return steps
