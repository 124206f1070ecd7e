"""The ONNX backend: an onnxruntime CPU session built from the model's bytes, in memory.

Invariants:
- The session is made from the (decrypted) bytes, never from a path: plaintext weights never touch disk.
- At load, the session's inputs must be exactly the config's inputs, and the config's outputs a subset of
  the session's, with equal element types and ranks; a dim the model fixes must be fixed to the same size
  in the config (a config ``-1`` where the model has a fixed size would only fail later, per request).
  Any mismatch is an ``InvalidArgument`` naming the tensor. Bytes that are not an ONNX model are
  ``DataLoss``.
- ``memory_bytes`` is the measured size of the model bytes: the weights the session holds. onnxruntime's
  arena for activations grows with batch size and is not counted.
- ``InferenceSession.run`` is thread-safe, so one session serves concurrent ``infer`` calls. Threads per
  run default to one: the worker runs several models and batches side by side, and each already has its
  own executor thread.
- onnxruntime runs every node of a graph whatever outputs are fetched (measured: fetching one output of
  two costs the same), so a model with ``qos.secondary_features`` gets a second session at load, built
  from the graph pruned to its primary outputs (``onnx.utils.Extractor``, in memory): breaker level 2
  then skips the secondary work for real. Its bytes count in ``memory_bytes``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from mcp_worker.backends.base import Backend, short_error
from mcpcore.errors import DataLoss, FailedPrecondition, InvalidArgument
from mcpcore.modelspec import ModelConfig, TensorSpec

try:
    import onnx
    import onnx.utils
    import onnxruntime as ort
except ImportError as _err:  # the worker still serves layer-graph models without it
    ort = None
    _IMPORT_ERROR = short_error(_err)

__all__ = ["ORT_TYPES", "OnnxBackend"]

_PROVIDER = "CPUExecutionProvider"
_WARNINGS_OFF = 3  # onnxruntime log severity: errors and fatal only

#: onnxruntime's element type names -> ours (mcpcore.dtypes).
ORT_TYPES: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(bfloat16)": "BF16",
}


class OnnxBackend(Backend):
    """One onnxruntime ``InferenceSession`` on the CPU execution provider."""

    name = "onnx"

    def __init__(self, config: ModelConfig, weights: bytes | None, *, intra_op_num_threads: int = 1) -> None:
        super().__init__(config, weights)
        ok, reason = self.available()
        if not ok:
            raise FailedPrecondition(f"{self._where}: unavailable: {reason}")
        if not weights:
            raise InvalidArgument(f"{self._where}: no model bytes given (the config's weights file)")
        self._session: Any = _session(bytes(weights), intra_op_num_threads, self._where)
        self._check_signature()
        self._outputs = [spec.name for spec in config.outputs]
        self.memory_bytes = len(weights)
        self._pruned: dict[frozenset[str], Any] = {}  # skipped outputs -> a session without their nodes
        self._threads = intra_op_num_threads
        self._bytes = bytes(weights) if config.qos.secondary_features else b""
        self._lock = threading.Lock()
        if config.qos.secondary_features:  # the one breaker level 2 uses with the default policy
            self._session_for(frozenset(config.qos.secondary_features))

    @classmethod
    def available(cls) -> tuple[bool, str]:
        if ort is None:
            return False, f"onnxruntime cannot be imported: {_IMPORT_ERROR}"
        if _PROVIDER not in ort.get_available_providers():
            return False, f"onnxruntime has no {_PROVIDER} (has {ort.get_available_providers()})"
        return True, ""

    def _run(
        self, inputs: Mapping[str, np.ndarray], *, skip: frozenset[str], parameters: Mapping[str, str]
    ) -> dict[str, np.ndarray]:
        session = self._session  # a local reference: a concurrent close cannot pull it away mid-run
        if session is None:
            raise FailedPrecondition(f"{self._where} is closed")
        feed = {name: np.ascontiguousarray(array) for name, array in inputs.items()}
        skip = skip & frozenset(self.config.qos.secondary_features)
        if skip:
            session = self._session_for(skip)
        wanted = [name for name in self._outputs if name not in skip]
        results = session.run(wanted, feed)
        return dict(zip(wanted, results, strict=True))

    def _session_for(self, skip: frozenset[str]) -> Any:
        """The session of the graph pruned to the outputs not in ``skip`` (built once per ``skip``)."""
        pruned = self._pruned.get(skip)
        if pruned is not None:
            return pruned
        with self._lock:
            pruned = self._pruned.get(skip)
            if pruned is None:
                keep = [name for name in self._outputs if name not in skip]
                model = onnx.load_model_from_string(self._bytes)
                inputs = [spec.name for spec in self.config.inputs]
                small = onnx.utils.Extractor(model).extract_model(inputs, keep).SerializeToString()
                pruned = self._pruned[skip] = _session(small, self._threads, self._where)
                self.memory_bytes += len(small)
        return pruned

    def _release(self) -> None:
        self._session = None
        self._pruned.clear()
        self._bytes = b""

    def _check_signature(self) -> None:
        model_in = {arg.name: arg for arg in self._session.get_inputs()}
        model_out = {arg.name: arg for arg in self._session.get_outputs()}
        want_in = [spec.name for spec in self.config.inputs]
        if sorted(model_in) != sorted(want_in):
            raise InvalidArgument(
                f"{self._where}: model.yaml inputs {sorted(want_in)} differ from the ONNX model's inputs "
                f"{sorted(model_in)}"
            )
        unknown = [spec.name for spec in self.config.outputs if spec.name not in model_out]
        if unknown:
            raise InvalidArgument(
                f"{self._where}: model.yaml outputs {unknown} are not outputs of the ONNX model "
                f"(it has {sorted(model_out)})"
            )
        for spec in self.config.inputs:
            self._check_arg("input", spec, model_in[spec.name])
        for spec in self.config.outputs:
            self._check_arg("output", spec, model_out[spec.name])

    def _check_arg(self, kind: str, spec: TensorSpec, arg: Any) -> None:
        what = f"{self._where}: {kind} {spec.name}"
        dtype = ORT_TYPES.get(arg.type, arg.type)
        if dtype != spec.dtype:
            raise InvalidArgument(f"{what}: model.yaml says {spec.dtype} but the ONNX model has {dtype}")
        model_shape = [d if isinstance(d, int) else -1 for d in arg.shape]
        mismatch = len(model_shape) != len(spec.shape) or any(
            m not in (-1, s) for m, s in zip(model_shape, spec.shape, strict=True)
        )
        if mismatch:
            raise InvalidArgument(
                f"{what}: model.yaml shape {list(spec.shape)} does not fit the ONNX model's {model_shape}"
                " (-1 = variable)"
            )


def _session(model: bytes, intra_op_num_threads: int, where: str) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_num_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = _WARNINGS_OFF
    try:
        return ort.InferenceSession(model, options, providers=[_PROVIDER])
    except Exception as err:
        if type(err).__name__ == "InvalidProtobuf":
            raise DataLoss(f"{where}: the model bytes are not an ONNX model: {short_error(err)}") from None
        raise InvalidArgument(f"{where}: onnxruntime cannot load the model: {short_error(err)}") from None
