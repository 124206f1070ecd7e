"""What the KServe V2 gRPC and REST doors share: request parameters, shapes, shared memory references,
server metadata, repository and trace settings, and the one call into the DataPlane.

Both adapters (``kserve_grpc``, ``kserve_rest``) decode their transport's tensors and parameters into the
values here and nothing else: neither imports the other.

Invariants:
- Request parameters are Triton's: "priority" (int64 or uint64), "timeout" (microseconds in 0..2^63-1, 0 =
  none), "routing_key" (string; else "sequence_id" keys the route), "sequence_id" (an integer in
  0..2^64-1 or a string of at most 256 characters; 0 or "" = none) with "sequence_start"/"sequence_end"
  (bools). Every other parameter (scalars only, at most
  ``MAX_PARAMETERS`` and ``MAX_PARAMETER_BYTES``) goes on to the worker's backend as a string, but the
  transports' own (triton_enable_empty_final_response, binary_data_output). A caller's deadline, when
  shorter than "timeout", bounds the request.
- Bad input is ``InvalidArgument`` naming the tensor or parameter; nothing here knows a status code. A
  tensor has at most ``MAX_DIMS`` dimensions and its shape spans at most the door's byte bound (the
  router's ``max_message_bytes``), so numpy never refuses it later; a request id has at most
  ``MAX_REQUEST_ID_CHARS``.
- ``infer`` is the one request path of both doors: the Triton trace (TraceSetting) around the DataPlane
  call, under the caller's OpenTelemetry context when tracing is on.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from mcp_router import trace
from mcp_router.dataplane import DataPlane, InferResult, SequenceFlags
from mcpcore import tracing
from mcpcore.errors import InvalidArgument, NotFound

__all__ = [
    "BYTES_ELEMENT",
    "DEFAULT_MAX_TENSOR_BYTES",
    "EMPTY_FINAL",
    "EXTENSIONS",
    "MAX_DIMS",
    "MAX_PARAMETERS",
    "MAX_PARAMETER_BYTES",
    "MAX_REQUEST_ID_CHARS",
    "SERVER_NAME",
    "InferOptions",
    "Request",
    "check_request_id",
    "check_shape",
    "cuda_shm_register",
    "cuda_shm_status",
    "infer",
    "infer_options",
    "load_version",
    "shm_reference",
    "trace_settings",
]

SERVER_NAME = "mcpmesh"
#: Protocol extensions served (ServerMetadata): Triton's model repository (index, load, unload), model
#: configuration (ModelConfig), statistics (ModelStatistics), system shared memory, binary tensor data
#: (REST), request parameters (to the backends), sequences (sequence_id/start/end, sticky), trace
#: (TraceSetting: Triton's JSON trace file) and logging (LogSettings: the router's own log level).
EXTENSIONS = (
    "model_repository",
    "model_configuration",
    "statistics",
    "system_shared_memory",
    "binary_tensor_data",
    "parameters",
    "sequence",
    "trace",
    "logging",
)


def cuda_shm_status(system_regions: Collection[str], name: str) -> list[Any]:
    """CUDA shared memory status, as Triton built without GPUs answers it (the router runs no CUDA, so
    none is ever registered): every region, none; a named one, NOT_FOUND in Triton's words."""
    if not name:
        return []
    if name in system_regions:
        raise NotFound(
            f"The region named '{name}' is registered as system shared memory, not CUDA shared memory"
        )
    raise NotFound(f"Unable to find cuda shared memory region: '{name}'")


def cuda_shm_register(name: str) -> InvalidArgument:
    """The refusal of a CUDA region (Triton's words first, then what to do instead); unregistering one
    succeeds, as in Triton, since none is registered."""
    return InvalidArgument(
        f"failed to register CUDA shared memory region: '{name}', GPUs not supported: the router runs no "
        "CUDA; register system shared memory (SystemSharedMemoryRegister) or send the tensors"
    )


#: A stream's flag (Triton's): each answer says whether it is the last, and a decoupled model's empty
#: last one is sent.
EMPTY_FINAL = "triton_enable_empty_final_response"
#: Parameters the front doors act on; every other one goes on to the backend.
_CONSUMED_PARAMETERS = frozenset(
    {"routing_key", "priority", "timeout", EMPTY_FINAL, "sequence_id", "sequence_start",
     "sequence_end", "binary_data_output"}
)  # fmt: skip
MAX_PARAMETERS = 64  # passed on to the backend, per request
MAX_REQUEST_ID_CHARS = 1024  # a client's request id (Triton sets none; ours is echoed and logged)
INT64_MAX, UINT64_MAX = (1 << 63) - 1, (1 << 64) - 1
MAX_PARAMETER_BYTES = 16 << 10  # their keys and values in all (the ZeroMQ header holds them)


@dataclass(frozen=True)
class Request:
    """One inference as either door decoded it. ``request_id`` is the client's, only echoed (the wire id
    is the router's); ``outputs``: the names asked for (empty: all)."""

    model: str
    version: str
    request_id: str
    inputs: Mapping[str, np.ndarray]
    options: InferOptions
    outputs: tuple[str, ...] = ()


def infer(
    dataplane: DataPlane,
    tracer: trace.Tracer,
    request: Request,
    *,
    caller: Any = None,
    on_partial: Callable[[InferResult], None] | None = None,
) -> Awaitable[InferResult]:
    """Run one request through the DataPlane, traced (TraceSetting) when sampled. ``caller``: the trace
    context the request's span is a child of (None: tracing off). Neither: the DataPlane's own call,
    awaited by the door (no extra frame on the request path)."""
    traced = trace.begin(tracer, request.model, request.version, request.request_id, request.inputs)
    options = request.options
    run = dataplane.infer(
        request.model,
        request.version,
        request.request_id,
        request.inputs,
        routing_key=options.routing_key,
        priority=options.priority,
        timeout_s=options.timeout_s,
        outputs=request.outputs,
        parameters=options.parameters,
        sequence=options.sequence,
        on_partial=on_partial,
        trace=traced,
    )
    if traced is None and caller is None:
        return run
    return _traced(run, traced, caller)


async def _traced(run: Awaitable[InferResult], traced: trace.Trace | None, caller: Any) -> InferResult:
    """``run`` under the caller's trace context, its Triton trace ended with the outcome."""
    token = tracing.attach(caller) if caller is not None else None
    try:
        result = await run
    except BaseException:
        trace.end(traced)
        raise
    finally:
        if token is not None:
            tracing.detach(token)
    trace.end(traced, result.outputs)
    return result


def trace_settings(
    tracer: trace.Tracer, dataplane: DataPlane, model: str, changes: Mapping[str, Any]
) -> dict[str, list[str]]:
    """A client's TraceSetting (either door): the settings in force (global, or ``model``'s) after
    ``changes``, which may be none; a model must be one the cluster has."""
    if model and not any(e.name == model for e in dataplane.index()):
        raise NotFound(f"model {model} is not loaded; its trace settings can be set once it is")
    return trace.client_update(tracer, changes, model) if changes else tracer.settings(model)


def load_version(values: Mapping[str, Any]) -> str:
    """The version a repository load asks for ("" = the model's default) from its parameters (gRPC's
    InferParameter values or REST's JSON): only "version", a string, is taken."""
    version = ""
    for key, value in values.items():
        if key == "version":
            if not isinstance(value, str):
                raise InvalidArgument("load parameter 'version' must be a string (string_param)")
            version = value
        elif key == "config" or key.startswith("file:"):
            raise InvalidArgument(
                f"load parameter {key!r} is not supported: models come from the cluster's repository "
                "(model.yaml); pass only an optional 'version' string"
            )
        else:
            raise InvalidArgument(f"unknown load parameter {key!r}; the only one is 'version' (a string)")
    return version


MAX_DIMS = 64  # dimensions of a tensor (numpy's own limit)
#: The most bytes a tensor's shape may span unless a door is given its own bound (the router gives its
#: ``max_message_bytes``: no larger tensor can reach a worker).
DEFAULT_MAX_TENSOR_BYTES = 64 << 20
BYTES_ELEMENT = 4  # the least a BYTES element takes on the wire (its 4-byte length)


def check_shape(
    what: str, shape: tuple[int, ...], datatype: str, itemsize: int, max_bytes: int
) -> tuple[int, ...]:
    """A tensor's shape from a client: at most ``MAX_DIMS`` non-negative dimensions spanning at most
    ``max_bytes`` of ``datatype`` (``itemsize`` bytes an element). An empty dimension does not make the
    others free: numpy refuses a shape whose other dimensions it cannot index."""
    if len(shape) > MAX_DIMS:
        raise InvalidArgument(f"{what}: shape has {len(shape)} dimensions; at most {MAX_DIMS}")
    if not shape:
        return shape
    if min(shape) < 0:
        raise InvalidArgument(f"{what}: shape {list(shape)} has a negative dimension")
    count = math.prod(shape)
    span = count if count else math.prod(d or 1 for d in shape)
    if span * itemsize > max_bytes:
        raise InvalidArgument(
            f"{what}: shape {list(shape)} of {datatype} spans {span * itemsize} bytes; the router takes "
            f"tensors of at most {max_bytes} bytes (max_message_bytes): send a smaller batch"
        )
    return shape


def shm_reference(values: Mapping[str, Any], what: str) -> tuple[str, int, int]:
    """(region, offset, byte size) from a tensor's shared memory parameters (Triton's names)."""
    region, size, offset = (
        values.get("shared_memory_region"),
        values.get("shared_memory_byte_size"),
        values.get("shared_memory_offset", 0),
    )
    if not isinstance(region, str) or not region:
        raise InvalidArgument(f"{what}: shared_memory_region must name a registered region")
    for key, value in (("shared_memory_byte_size", size), ("shared_memory_offset", offset)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgument(f"{what}: {key} must be an integer >= 0, got {value!r}")
    return region, int(offset), int(size)  # type: ignore[arg-type]


# --- parameters --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InferOptions:
    routing_key: str = ""
    priority: int = 0
    timeout_s: float | None = None
    parameters: Mapping[str, str] = field(default_factory=dict)
    sequence: SequenceFlags | None = None


_NO_PARAMETERS: Mapping[str, str] = MappingProxyType({})


def infer_options(values: Mapping[str, Any], deadline_s: float | None = None) -> InferOptions:
    """Triton's request parameters (their values: from gRPC's InferParameter or REST's JSON) as DataPlane
    arguments; ``deadline_s`` is the time the caller has left."""
    if not values:  # most requests carry none
        return InferOptions("", 0, deadline_s, _NO_PARAMETERS, None)
    routing_key = values.get("routing_key")
    if routing_key is not None and not isinstance(routing_key, str):
        raise InvalidArgument("parameter routing_key must be a string (string_param)")
    sequence = _sequence(values)
    if routing_key is None:
        routing_key = sequence.id if sequence is not None else ""
    priority = _int_param(values, "priority", -INT64_MAX - 1, UINT64_MAX)  # the DataPlane bounds it
    timeout_us = _int_param(values, "timeout", 0, INT64_MAX)  # microseconds, 0 = none
    timeout_s = timeout_us / 1e6 if timeout_us else None
    if deadline_s is not None:
        timeout_s = deadline_s if timeout_s is None else min(timeout_s, deadline_s)
    rest = _passed_on(values)
    return InferOptions(routing_key, priority, timeout_s, rest, sequence)


def _passed_on(values: Mapping[str, Any]) -> dict[str, str]:
    """The parameters for the backend: scalars as strings, bounded in number and size."""
    rest = {}
    for key, value in values.items():
        if key in _CONSUMED_PARAMETERS:
            continue
        if isinstance(value, (dict, list)):
            raise InvalidArgument(
                f"parameter {key} must be a string, a number or a bool, not a JSON {type(value).__name__}"
            )
        rest[key] = _param_str(value)
    if len(rest) > MAX_PARAMETERS:
        raise InvalidArgument(f"{len(rest)} request parameters; at most {MAX_PARAMETERS} go to the model")
    size = sum(len(k) + len(v) for k, v in rest.items())
    if size > MAX_PARAMETER_BYTES:
        raise InvalidArgument(
            f"request parameters are {size} bytes; at most {MAX_PARAMETER_BYTES} go to the model (send data "
            "as tensors)"
        )
    return rest


def check_request_id(request_id: str) -> str:
    """A client's request id (echoed in the answer, logged): at most ``MAX_REQUEST_ID_CHARS``."""
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        raise InvalidArgument(
            f"the request id is {len(request_id)} characters; at most {MAX_REQUEST_ID_CHARS} are taken"
        )
    return request_id


def _sequence(values: Mapping[str, Any]) -> SequenceFlags | None:
    """The request's sequence, Triton's way: a non-zero integer or non-empty string id, and bools."""
    raw = values.get("sequence_id")
    flags = {}
    for key in ("sequence_start", "sequence_end"):
        flag = values.get(key, False)
        if not isinstance(flag, bool):
            raise InvalidArgument(f"parameter {key} must be a bool (bool_param), got {flag!r}")
        flags[key] = flag
    if isinstance(raw, bool) or not isinstance(raw, (int, str, type(None))):
        raise InvalidArgument("parameter sequence_id must be an integer or a string")
    if isinstance(raw, int) and not 0 <= raw <= UINT64_MAX:
        raise InvalidArgument(
            f"parameter sequence_id {raw} is out of range: an id is an integer in 1..{UINT64_MAX} (uint64, "
            "0 = none) or a string"
        )
    if raw in (None, 0, ""):
        if flags["sequence_start"] or flags["sequence_end"]:
            raise InvalidArgument(
                "sequence_start and sequence_end need a sequence_id (non-zero, or a string)"
            )
        return None
    if isinstance(raw, str) and len(raw) > 256:
        raise InvalidArgument("parameter sequence_id is longer than 256 characters")
    return SequenceFlags(str(raw), flags["sequence_start"], flags["sequence_end"])


def _int_param(values: Mapping[str, Any], key: str, lo: int, hi: int) -> int:
    value = values.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"parameter {key} must be an integer (int64_param or uint64_param)")
    if not lo <= value <= hi:
        raise InvalidArgument(f"parameter {key} is {value}; it takes {lo}..{hi}")
    return value


def _param_str(value: bool | int | float | str | None) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)
