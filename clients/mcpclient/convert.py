"""Between the caller and the wire: ``infer``'s arguments checked into an ``InferCall``, tensors to and from
``mcpapi.v2``, and ``Route`` / ``ModelStatus`` answers into the SDK's values (``mcpclient.values``).

Invariants:
- Nothing leaves the process unchecked: a bad argument is ``InvalidArgument`` naming it, raised before
  any route is asked or any tensor is sent.
- An ``InferCall``'s deadline is absolute (``time.monotonic()``), fixed when the call is checked, so every
  path and every retry shares the caller's one budget of time.
- No I/O: pure conversions.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mcpapi.v2 import inference_pb2, model_pb2
from mcpclient.values import ModelInfo, ReplicaInfo, Route
from mcpcore import dtypes
from mcpcore.errors import InvalidArgument

__all__ = ["MAX_PRIORITY", "InferCall", "array_of", "checked_call", "model_info", "route_of", "tensor_of"]

MAX_PRIORITY = (1 << 32) - 1  # TensorHeader.priority is a uint32


@dataclass(frozen=True, slots=True)
class InferCall:
    """One infer call's arguments, as every path needs them."""

    model: str
    arrays: Mapping[str, np.ndarray]
    version: str
    key: str
    priority: int
    deadline: float  # time.monotonic()
    outputs: tuple[str, ...]

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def select(self, result: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [n for n in self.outputs if n not in result]
        if missing:
            raise InvalidArgument(f"model {self.model} has no output(s) {missing}; it has {sorted(result)}")
        return {n: result[n] for n in self.outputs} if self.outputs else result


def checked_call(
    model: Any,
    inputs: Any,
    *,
    version: Any,
    key: Any,
    priority: Any,
    timeout: Any,
    outputs: Any,
    default_s: float,
) -> InferCall:
    """The arguments of ``infer`` as an ``InferCall``, or ``InvalidArgument`` naming the bad one."""
    for name, value in (("model", model), ("version", version), ("key", key)):
        if value is not None and not isinstance(value, str):
            raise InvalidArgument(f"{name} must be a string, got {type(value).__name__}")
    if not model:
        raise InvalidArgument("model must be a model name, e.g. 'demo-mlp'")
    if not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= MAX_PRIORITY:
        raise InvalidArgument(
            f"priority must be an integer 0 (the model's default) .. {MAX_PRIORITY}, got {priority!r}"
        )
    if timeout is not None and (not isinstance(timeout, int | float) or not timeout > 0):
        raise InvalidArgument(f"timeout must be a number of seconds > 0, got {timeout!r}")
    if not isinstance(inputs, Mapping) or not inputs:
        raise InvalidArgument("inputs must be a non-empty mapping of tensor name to array")
    arrays = {}
    for name, value in inputs.items():
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"tensor names must be non-empty strings, got {name!r}")
        arr = np.asarray(value)
        if arr.dtype.kind in "OUSV":
            raise InvalidArgument(
                f"input {name}: dtype {arr.dtype} is not a tensor type (use a numeric array)"
            )
        arrays[name] = arr
    if isinstance(outputs, str) or not all(isinstance(o, str) for o in outputs or ()):
        raise InvalidArgument(f"outputs must be a list of output names, got {outputs!r}")
    return InferCall(
        model, arrays, version or "", key or "", priority, time.monotonic() + (timeout or default_s),
        tuple(outputs or ()),
    )  # fmt: skip


def tensor_of(name: str, array: Any) -> inference_pb2.Tensor:
    arr = np.asarray(array)
    dtype = dtypes.from_numpy(arr.dtype)
    return inference_pb2.Tensor(
        name=name, dtype=dtypes.wire_value(dtype), shape=arr.shape, data=bytes(dtypes.to_bytes(arr))
    )


def array_of(t: inference_pb2.Tensor) -> np.ndarray:
    return dtypes.from_bytes(dtypes.name_of(t.dtype), t.data, tuple(t.shape), f"output {t.name}")


def route_of(model: str, r: inference_pb2.RouteResponse) -> Route:
    return Route(
        model, r.version, r.worker_id, r.data_endpoint, r.breaker_level, r.header_flags, r.curve_public_key,
        tuple(r.features_off), frozenset(r.zmq_features), r.incarnation, r.idempotent,
        r.record_certificate, r.record_signature, r.control_endpoint, r.record_local_signature,
    )  # fmt: skip


def model_info(m: model_pb2.ModelStatus) -> ModelInfo:
    replicas = tuple(
        ReplicaInfo(r.version, r.worker_id, model_pb2.ModelState.Name(r.state), r.reason) for r in m.replicas
    )
    versions = tuple(dict.fromkeys([*m.spec.versions, *(r.version for r in replicas)]))
    return ModelInfo(
        m.model, versions, replicas, m.breaker.level, m.traffic.stable, m.traffic.canary,
        m.traffic.canary_percent, m.pending,
    )  # fmt: skip
