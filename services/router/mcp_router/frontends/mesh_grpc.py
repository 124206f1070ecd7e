"""The mesh's own gRPC services, ``mcpapi.v2.Inference`` and ``mcpapi.v1.Inference``: thin adapters over the
DataPlane (v1 serves the older contract: no candidates, priority, output selection or tracing).

With tracing on (``mcpcore.tracing``), a v2 Infer call's W3C ``traceparent``/``tracestate`` metadata is
the trace context its span is a child of.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from mcp_router.dataplane import DataPlane, InferResult, RouteDecision
from mcpapi.v1 import inference_pb2 as v1
from mcpapi.v1 import inference_pb2_grpc as v1_grpc
from mcpapi.v2 import inference_pb2 as v2
from mcpapi.v2 import inference_pb2_grpc as v2_grpc
from mcpcore import dtypes, tracing
from mcpcore.errors import InvalidArgument

__all__ = ["InferenceV1", "InferenceV2"]


def _arrays(tensors: Iterable[tuple[str, str, tuple[int, ...], bytes]]) -> dict[str, np.ndarray]:
    """(name, dtype name, shape, raw bytes) -> arrays viewing the bytes (no copy), sizes checked."""
    out: dict[str, np.ndarray] = {}
    for name, dtype_name, shape, data in tensors:
        dtype = dtypes.numpy_dtype(dtype_name)
        if any(d < 0 for d in shape):
            raise InvalidArgument(f"input {name}: shape {list(shape)} has a negative dimension")
        need = math.prod(shape) * dtype.itemsize
        if len(data) != need:
            raise InvalidArgument(
                f"input {name}: data is {len(data)} bytes but shape {list(shape)} of {dtype_name} "
                f"needs {need}"
            )
        if name in out:
            raise InvalidArgument(f"input {name} is given twice")
        out[name] = np.frombuffer(data, dtype=dtype).reshape(shape)
    return out


def _bytes(arr: np.ndarray) -> bytes:
    return np.ascontiguousarray(arr).tobytes()


def _route_response(d: RouteDecision) -> v2.RouteResponse:
    return v2.RouteResponse(
        worker_id=d.worker_id, data_endpoint=d.data_endpoint, version=d.version,
        breaker_level=d.breaker_level, header_flags=d.header_flags, curve_public_key=d.curve_public_key,
        features_off=d.features_off, zmq_features=d.zmq_features, incarnation=d.incarnation,
        idempotent=d.idempotent,
        alternatives=[_route_response(a) for a in d.alternatives],
        record_certificate=d.record_certificate, record_signature=d.record_signature,
        control_endpoint=d.control_endpoint, record_local_signature=d.record_local_signature,
    )  # fmt: skip


class InferenceV2(v2_grpc.InferenceServicer):
    def __init__(self, plane: DataPlane) -> None:
        self._p = plane
        self._tracing = tracing.enabled()

    async def Route(self, request, context):  # type: ignore[no-untyped-def]
        return _route_response(
            self._p.route(request.model, request.version, request.routing_key, max(1, request.candidates))
        )

    async def Infer(self, request, context):  # type: ignore[no-untyped-def]
        inputs = _arrays((t.name, dtypes.name_of(t.dtype), tuple(t.shape), t.data) for t in request.inputs)
        left = context.time_remaining()
        timeout = request.timeout_us / 1e6 if request.timeout_us else left
        caller = None
        if self._tracing:
            caller = tracing.attach(tracing.extract_metadata(context.invocation_metadata()))
        try:
            result = await self._p.infer(
                request.model,
                request.version,
                request.request_id,
                inputs,
                routing_key=request.routing_key,
                priority=request.priority,
                timeout_s=timeout,
                outputs=tuple(request.outputs),
            )
        finally:
            if caller is not None:
                tracing.detach(caller)
        return v2.InferResponse(
            model=result.model,
            version=result.version,
            request_id=request.request_id,
            worker_id=result.worker_id,
            outputs=[
                v2.Tensor(
                    name=n, dtype=dtypes.wire_value(dtypes.from_numpy(a.dtype)), shape=a.shape, data=_bytes(a)
                )
                for n, a in result.outputs.items()
            ],
        )


class InferenceV1(v1_grpc.InferenceServicer):
    def __init__(self, plane: DataPlane) -> None:
        self._p = plane

    async def Route(self, request, context):  # type: ignore[no-untyped-def]
        d = self._p.route(request.model, request.version, request.routing_key)
        return v1.RouteResponse(
            worker_id=d.worker_id,
            data_endpoint=d.data_endpoint,
            version=d.version,
            breaker_level=d.breaker_level,
        )

    async def Infer(self, request, context):  # type: ignore[no-untyped-def]
        inputs = _arrays((t.name, t.dtype, tuple(t.shape), t.data) for t in request.inputs)
        result: InferResult = await self._p.infer(
            request.model,
            request.version,
            request.request_id,
            inputs,
            routing_key=request.routing_key,
            timeout_s=context.time_remaining(),
        )
        return v1.InferResponse(
            model=result.model,
            version=result.version,
            request_id=request.request_id,
            outputs=[
                v1.Tensor(name=n, dtype=dtypes.from_numpy(a.dtype), shape=a.shape, data=_bytes(a))
                for n, a in result.outputs.items()
            ],
        )
