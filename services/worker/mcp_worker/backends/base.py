"""The backend interface: one loaded model version that turns input tensors into output tensors.

A backend is built from the version's ``ModelConfig`` and its weights bytes, already decrypted, in memory;
it never reads files. ``infer`` is blocking and runs on an executor thread, off the event loop (on the
loop itself only for a backend that says ``inline`` and batches that prove fast:
``mcp_worker.batching.inline``).

Invariants:
- ``infer`` checks its inputs against ``config.inputs`` before running anything: a wrong name, dtype, rank
  or fixed dim is an ``InvalidArgument`` naming the tensor, what was expected and what came.
- Every failure is an ``MCPError``: a fault inside execution becomes ``Internal`` with a short message (the
  traceback goes to the log), never a raw exception.
- A loaded backend is immutable, so concurrent ``infer`` calls are safe; after ``close`` it answers
  ``FailedPrecondition``.
- Backend modules are imported only when a model asks for them (``create_backend``), so a worker without
  onnxruntime still serves layer-graph models.
- ``parameters`` are the request's own (KServe request parameters, strings), for a backend that reads
  them. A decoupled model's ``_run`` yields its answers one by one: ``infer`` hands each to ``emit`` (on
  the executor thread, in order) and returns ``{}``; an error raised part way ends the stream with it.
"""

from __future__ import annotations

import abc
import importlib
import logging
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import ClassVar

import numpy as np

from mcpcore import dtypes, tensor_signature
from mcpcore.errors import FailedPrecondition, Internal, InvalidArgument, MCPError
from mcpcore.modelspec import ModelConfig, TensorSpec

__all__ = [
    "BACKEND_CLASSES",
    "NO_PARAMETERS",
    "Backend",
    "Emit",
    "backend_class",
    "create_backend",
    "short_error",
]

log = logging.getLogger(__name__)

#: ``config.backend`` -> ``module:Class``, imported on first use.
BACKEND_CLASSES: dict[str, str] = {
    "numpy": "mcp_worker.backends.numpy_backend:NumpyBackend",
    "onnx": "mcp_worker.backends.onnx_backend:OnnxBackend",
    "cuda": "mcp_worker.backends.cuda_backend:CudaBackend",
    "builtin": "mcp_worker.backends.builtin_backend:BuiltinBackend",
}
NO_PARAMETERS: Mapping[str, str] = MappingProxyType({})
#: Takes one answer of a decoupled model (called on the executor thread).
Emit = Callable[[dict[str, np.ndarray]], None]
Outputs = dict[str, np.ndarray]
_NOT_BUILT: dict[str, str] = {}  # backend -> why it cannot be used yet
_MAX_DETAIL = 300


class Backend(abc.ABC):
    """One model version, loaded and ready to run. Subclasses implement ``_run`` and ``_release``."""

    name: ClassVar[str]
    #: Whether the constructor takes ``device`` (the worker's GPU index).
    takes_device: ClassVar[bool] = False
    #: Whether runs of one instance may overlap (thread-safe ``_run``); if not, the worker runs at most
    #: ``instance_count`` batches of the model at once.
    concurrent: ClassVar[bool] = True
    #: Whether its batches may run on the worker's event loop once they prove fast (``Dispatcher``'s
    #: ``inline_s``): ``_run`` runs on any thread without waiting for another run, and nothing a request
    #: sends decides how long it takes.
    inline: ClassVar[bool] = False

    def __init__(self, config: ModelConfig, weights: bytes | None) -> None:
        self.config = config
        self.memory_bytes = 0  # measured bytes held once loaded; set by the subclass
        self.device = "cpu"  # where it runs: "cpu" or "gpu:<index>"
        self.fallback = ""  # why it runs on the CPU though model.yaml asks for a GPU
        self._closed = False
        self._where = f"model {config.name}/{config.version} ({self.name} backend)"
        self._dtypes = {spec.name: dtypes.numpy_dtype(spec.dtype) for spec in config.inputs}

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """Whether this backend can run here, and why not when it cannot."""
        return True, ""

    def infer(
        self,
        inputs: Mapping[str, np.ndarray],
        *,
        skip: frozenset[str] = frozenset(),
        parameters: Mapping[str, str] = NO_PARAMETERS,
        emit: Emit | None = None,
    ) -> dict[str, np.ndarray]:
        """Run one batch; ``skip`` names secondary outputs not to compute (breaker level 2 drops them,
        DESIGN.md 7): the result has every other output. A decoupled model's answers go to ``emit``
        (dropped when there is none, as at warm-up) and the result is empty."""
        if self._closed:
            raise FailedPrecondition(f"{self._where} is closed")
        self.check_inputs(inputs)
        try:
            result = self._run(inputs, skip=skip, parameters=parameters)
            if not self.config.decoupled:
                return result  # type: ignore[return-value]
            for answer in result:  # type: ignore[union-attr]
                if emit is not None:
                    emit(answer)
            return {}
        except MCPError:
            raise
        except Exception as err:
            log.exception("%s: inference failed", self._where)
            raise Internal(f"{self._where}: inference failed: {short_error(err)}") from None

    def warmup(self) -> None:
        """One run on zeros with batch 1 (every variable dim 1), so the first real request is not slow."""
        self.infer({s.name: _warmup_input(s, self._dtypes[s.name]) for s in self.config.inputs})

    def close(self) -> None:
        """Release everything; idempotent."""
        if not self._closed:
            self._closed = True
            self._release()
            self.memory_bytes = 0

    def check_inputs(self, inputs: Mapping[str, np.ndarray]) -> None:
        """Raise ``InvalidArgument`` unless ``inputs`` are exactly the configured tensors, well shaped."""
        tensor_signature.check_inputs(self._where, self.config.inputs, inputs, self.config.max_batch_size)

    @abc.abstractmethod
    def _run(
        self, inputs: Mapping[str, np.ndarray], *, skip: frozenset[str], parameters: Mapping[str, str]
    ) -> Outputs | Iterator[Outputs]:
        """Execute on checked inputs, leaving out the outputs in ``skip``: the outputs, or (a decoupled
        model) an iterator of answers. Must be safe to call from several threads at once."""

    @abc.abstractmethod
    def _release(self) -> None:
        """Drop the weights, sessions and buffers this backend holds."""


def backend_class(name: str) -> type[Backend]:
    """The class for ``config.backend`` (importing its module); errors say what to do instead."""
    if name in _NOT_BUILT:
        raise FailedPrecondition(_NOT_BUILT[name])
    target = BACKEND_CLASSES.get(name)
    if target is None:
        known = ", ".join(sorted([*BACKEND_CLASSES, *_NOT_BUILT]))
        raise InvalidArgument(f"unknown backend {name!r}; one of {known}")
    module, _, attr = target.partition(":")
    cls: type[Backend] = getattr(importlib.import_module(module), attr)
    return cls


def create_backend(
    config: ModelConfig, weights: bytes | None, *, device: int = 0, fits: Callable[[int], None] | None = None
) -> Backend:
    """Load ``config``'s model from its (decrypted) weights bytes with the backend it names, on GPU
    ``device`` where it runs on one; ``instance_count`` > 1 makes that many instances behind one
    (``instances.Instances``), asking ``fits`` for their bytes before making the second."""
    cls = backend_class(config.backend)
    ok, reason = cls.available()
    if not ok:
        raise FailedPrecondition(
            f"model {config.name}/{config.version}: backend {config.backend} is unavailable: {reason}"
        )

    def make() -> Backend:
        return cls(config, weights, device=device) if cls.takes_device else cls(config, weights)  # type: ignore[call-arg]

    if config.instance_count == 1:
        return make()
    from mcp_worker.backends.instances import Instances  # noqa: PLC0415  (it imports this module)

    return Instances(config, make, fits)


def _warmup_input(spec: TensorSpec, dtype: np.dtype) -> np.ndarray:
    shape = tuple(1 if d == -1 else d for d in spec.shape)
    return np.full(shape, b"", dtype) if dtype.kind == "O" else np.zeros(shape, dtype)


def short_error(err: BaseException) -> str:
    """One line of an exception for a caller: its type and first line, bounded."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    text = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return text if len(text) <= _MAX_DETAIL else text[: _MAX_DETAIL - 3] + "..."
