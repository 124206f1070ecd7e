"""KServe V2 (Open Inference Protocol) gRPC front end: ``inference.GRPCInferenceService`` over a DataPlane.

A thin adapter, so that tritonclient and perf_analyzer work against the router unchanged: it converts
protobuf to numpy and DataPlane values and back, and holds no routing logic.

Invariants:
- Protobuf stops here: the DataPlane sees names, numpy arrays and plain values only.
- Errors are raised as ``MCPError``s (``InvalidArgument`` naming the tensor or parameter); the shared
  error mapping (``GuardedServer``) turns them into statuses, so nothing here calls ``context.abort``.
- Raw input bytes become arrays with ``dtypes.from_bytes`` (numeric: a read-only view, no copy; BYTES:
  Triton's length-prefixed elements, in ``raw_input_contents`` or ``contents.bytes_contents``). Raw bytes
  are little-endian on the wire, read and written as such. Typed ``contents`` (the slow path) are copied.
  Classification outputs are refused. Inputs and outputs may live in system shared memory regions
  registered with this router (``mcp_router.shm``); CUDA shared memory answers UNAVAILABLE (no CUDA here).
- Request parameters, Triton's convention: "priority" (int64 or uint64), "timeout" (int64, microseconds,
  0 = none), "routing_key" (string; else "sequence_id" keys the route), "sequence_id" (int or string; 0
  or "" = none) with "sequence_start"/"sequence_end" (bools). Every other parameter (scalars only, at most
  ``MAX_PARAMETERS`` and ``MAX_PARAMETER_BYTES``) goes on to the worker's backend as a string, but the
  transport's own (triton_enable_empty_final_response, binary_data_output). The gRPC deadline, when
  shorter than "timeout", bounds the request.
- Streams: a decoupled model's answers go out as they come; with "triton_enable_empty_final_response"
  set, each answer says "triton_final_response" false and an empty last one says true (as Triton's).
- With tracing on (``mcpcore.tracing``), the call's W3C ``traceparent``/``tracestate`` metadata is the
  trace context each of its requests' spans is a child of (a stream's every request: the stream's);
  tracing off, the metadata is not read.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mcp_router import kserve_wire, logsettings, stream, trace
from mcp_router.dataplane import (
    DataPlane,
    Duration,
    InferResult,
    ModelConfigInfo,
    ModelStats,
    SequenceFlags,
    TensorMeta,
)
from mcp_router.shm import SharedMemory
from mcpapi.kserve import grpc_service_pb2 as pb
from mcpapi.kserve import grpc_service_pb2_grpc as pb_grpc
from mcpapi.kserve import model_config_pb2 as mc
from mcpcore import dtypes, tracing
from mcpcore.errors import (
    Internal,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from mcpcore.serving import Parts, join_parts

__all__ = [
    "EXTENSIONS",
    "NO_CUDA_SHM",
    "SERVER_NAME",
    "InferOptions",
    "KServeServicer",
    "check_shape",
    "decode_inputs",
    "infer_options",
    "load_version",
    "model_config_proto",
    "shm_reference",
    "statistics_proto",
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
NO_CUDA_SHM = Unavailable(
    "CUDA shared memory is not available: the router runs no CUDA; use system shared memory "
    "(SystemSharedMemoryRegister) or send the tensors"
)

# Which InferTensorContents field carries each datatype; FP16 and BF16 travel as raw bytes only.
_TYPED_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
# The element type of each field, so values are range-checked before narrowing (INT8 from int32).
_FIELD_DTYPE = {
    "bool_contents": np.bool_,
    "int_contents": np.int32,
    "int64_contents": np.int64,
    "uint_contents": np.uint32,
    "uint64_contents": np.uint64,
    "fp32_contents": np.float32,
    "fp64_contents": np.float64,
}
#: Parameters the front doors act on; every other one goes on to the backend.
_CONSUMED_PARAMETERS = frozenset(
    {"routing_key", "priority", "timeout", stream.EMPTY_FINAL, "sequence_id", "sequence_start",
     "sequence_end", "binary_data_output"}
)  # fmt: skip
MAX_PARAMETERS = 64  # passed on to the backend, per request
MAX_PARAMETER_BYTES = 16 << 10  # their keys and values in all (the ZeroMQ header holds them)


class KServeServicer(pb_grpc.GRPCInferenceServiceServicer):
    """The KServe V2 service; register with ``add_GRPCInferenceServiceServicer_to_server``."""

    def __init__(
        self,
        dataplane: DataPlane,
        *,
        version: str,
        shm: SharedMemory | None = None,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self._dataplane = dataplane
        self._version = version
        self._shm = shm if shm is not None else SharedMemory()
        self._tracer = tracer if tracer is not None else trace.Tracer()
        self._tracing = tracing.enabled()  # OpenTelemetry, apart from TraceSetting's tracer

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self._dataplane.live())

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._dataplane.ready())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self._dataplane.model_ready(request.name, request.version))

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: Any
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=self._version, extensions=EXTENSIONS)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        meta = self._dataplane.model_metadata(request.name, request.version)
        return pb.ModelMetadataResponse(
            name=meta.name,
            versions=meta.versions,
            platform=meta.platform,
            inputs=[_tensor_metadata(t) for t in meta.inputs],
            outputs=[_tensor_metadata(t) for t in meta.outputs],
        )

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        config = self._dataplane.model_config(_model_name(request.name), request.version)
        return pb.ModelConfigResponse(config=model_config_proto(config))

    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: Any
    ) -> pb.ModelStatisticsResponse:
        if request.version and not request.name:
            raise InvalidArgument("a version needs a model name; name the model, or leave both empty")
        stats = await self._dataplane.model_statistics(request.name, request.version)
        return pb.ModelStatisticsResponse(model_stats=[statistics_proto(s) for s in stats])

    #: ModelInfer's bytes are read and written by ``kserve_wire`` (no copies of the tensors); the other
    #: methods use the generated protobuf codecs.
    grpc_codecs = {"ModelInfer": (kserve_wire.parse_request, join_parts)}

    async def ModelInfer(self, request: kserve_wire.InferRequest, context: Any) -> Parts:
        caller = self._caller(context)
        response, raw = await self._infer(
            request.message, request.raw, _time_remaining(context), caller=caller
        )
        return kserve_wire.serialize_response(response, raw)

    def _caller(self, context: Any) -> Any:
        """The caller's trace context (tracing on), from the call's metadata; None: tracing is off."""
        if not self._tracing:
            return None
        return tracing.extract_metadata(context.invocation_metadata() if context is not None else None)

    async def ModelStreamInfer(
        self, requests: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Every request on the stream runs at once; answers come back as they finish, each with its
        request's id, and an error is an answer too (``mcp_router.stream``)."""
        caller = self._caller(context)

        async def infer(
            request: pb.ModelInferRequest, partial: Callable[[pb.ModelInferResponse], None]
        ) -> pb.ModelInferResponse:
            return _whole(
                *await self._infer(request, request.raw_input_contents, None, partial, caller=caller)
            )

        async for answer in stream.serve(requests, infer):
            yield answer

    async def _infer(
        self,
        request: pb.ModelInferRequest,
        raw: Sequence[Any],
        deadline_s: float | None,
        partial: Callable[[pb.ModelInferResponse], None] | None = None,
        *,
        caller: Any = None,
    ) -> tuple[pb.ModelInferResponse, list[Any]]:
        """Run one request (``raw``: its raw input entries); returns the response and its raw output
        entries apart (``_encode_response``). With ``partial`` (a stream), a decoupled model's answers
        before its last go there, encoded, as they come. ``caller``: the trace context the request's
        span is a child of (None: tracing off)."""
        if not request.model_name:
            raise InvalidArgument("model_name is empty; name the model to run")
        inputs = decode_inputs(request, self._shm, raw)
        requested, into_shm = _requested_outputs(request)
        options = infer_options({key: _param_value(p) for key, p in request.parameters.items()}, deadline_s)
        request_id = request.id  # the client's: only echoed in the response (the wire id is the router's)
        on_partial = None
        if partial is not None:
            send = partial

            def on_partial(result: InferResult) -> None:
                send(_whole(*_encode_response(result, request_id, requested)))

        traced = trace.begin(self._tracer, request.model_name, request.model_version, request_id, inputs)
        token = tracing.attach(caller) if caller is not None else None
        try:
            result = await self._dataplane.infer(
                request.model_name,
                request.model_version,
                request_id,
                inputs,
                routing_key=options.routing_key,
                priority=options.priority,
                timeout_s=options.timeout_s,
                outputs=requested,
                parameters=options.parameters,
                sequence=options.sequence,
                on_partial=on_partial,
                trace=traced,
            )
        except BaseException:
            trace.end(traced)
            raise
        finally:
            if token is not None:
                tracing.detach(token)
        trace.end(traced, result.outputs)
        return _encode_response(result, request_id, requested, into_shm, self._shm)

    # -- shared memory ---------------------------------------------------------------------------------
    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: Any
    ) -> pb.SystemSharedMemoryStatusResponse:
        status = pb.SystemSharedMemoryStatusResponse.RegionStatus
        regions = {
            r.name: status(name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size)
            for r in self._shm.status(request.name)
        }
        return pb.SystemSharedMemoryStatusResponse(regions=regions)

    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: Any
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self._shm.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: Any
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self._shm.unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        raise NO_CUDA_SHM

    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        raise NO_CUDA_SHM

    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        raise NO_CUDA_SHM

    # -- tracing ---------------------------------------------------------------------------------------
    async def TraceSetting(self, request: pb.TraceSettingRequest, context: Any) -> pb.TraceSettingResponse:
        changes = {key: list(v.value) for key, v in request.settings.items()}  # [] clears one
        settings = trace_settings(self._tracer, self._dataplane, request.model_name, changes)
        value = pb.TraceSettingResponse.SettingValue
        return pb.TraceSettingResponse(settings={k: value(value=v) for k, v in settings.items()})

    # -- logging ---------------------------------------------------------------------------------------
    async def LogSettings(self, request: pb.LogSettingsRequest, context: Any) -> pb.LogSettingsResponse:
        changes = {key: _setting_value(key, v) for key, v in request.settings.items()}
        settings = logsettings.apply(changes) if changes else logsettings.current()
        value = pb.LogSettingsResponse.SettingValue
        out = {}
        for key, v in settings.items():
            if isinstance(v, bool):
                out[key] = value(bool_param=v)
            elif isinstance(v, int):
                out[key] = value(uint32_param=v)
            else:
                out[key] = value(string_param=v)
        return pb.LogSettingsResponse(settings=out)

    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: Any
    ) -> pb.RepositoryIndexResponse:
        # The router has one repository (the cluster's), so repository_name is not consulted.
        entries = self._dataplane.index()
        return pb.RepositoryIndexResponse(
            models=[
                pb.RepositoryIndexResponse.ModelIndex(
                    name=e.name, version=e.version, state=e.state, reason=e.reason
                )
                for e in entries
                if not request.ready or e.state == "READY"
            ]
        )

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        version = load_version({key: _param_value(p) for key, p in request.parameters.items()})
        await self._dataplane.load(_model_name(request.model_name), version)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        # "unload_dependents" (always sent by tritonclient) has nothing to act on: there are no ensembles.
        await self._dataplane.unload(_model_name(request.model_name))
        return pb.RepositoryModelUnloadResponse()


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


def _setting_value(key: str, value: pb.LogSettingsRequest.SettingValue) -> bool | int | str:
    which = value.WhichOneof("parameter_choice")
    if which is None:
        raise InvalidArgument(f"log setting {key} has no value")
    return getattr(value, which)  # type: ignore[no-any-return]


def _model_name(name: str) -> str:
    if not name:
        raise InvalidArgument("model_name is empty; name the model")
    return name


def _tensor_metadata(t: TensorMeta) -> pb.ModelMetadataResponse.TensorMetadata:
    return pb.ModelMetadataResponse.TensorMetadata(name=t.name, datatype=t.dtype, shape=t.shape)


# --- statistics --------------------------------------------------------------------------------------


def _duration(d: Duration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=d.count, ns=d.ns)


def statistics_proto(s: ModelStats) -> pb.ModelStatistics:
    return pb.ModelStatistics(
        name=s.name,
        version=s.version,
        last_inference=s.last_inference_ms,
        inference_count=s.inference_count,
        execution_count=s.execution_count,
        inference_stats=pb.InferStatistics(
            success=_duration(s.success),
            fail=_duration(s.fail),
            queue=_duration(s.queue),
            compute_input=_duration(s.compute_input),
            compute_infer=_duration(s.compute_infer),
            compute_output=_duration(s.compute_output),
        ),
        batch_stats=[
            pb.InferBatchStatistics(
                batch_size=b.batch_size,
                compute_input=_duration(b.compute_input),
                compute_infer=_duration(b.compute_infer),
                compute_output=_duration(b.compute_output),
            )
            for b in s.batches
        ],
    )


# --- model configuration -----------------------------------------------------------------------------

# Triton's names for our backends: (backend, platform)
_BACKEND = {"onnx": ("onnxruntime", "onnxruntime_onnx")}
_DATA_TYPES = frozenset(mc.DataType.keys())


def _config_dtype(dtype: str) -> int:
    """A datatype string as model_config's DataType: "FP32" -> TYPE_FP32, "BYTES" -> TYPE_STRING."""
    name = "TYPE_STRING" if dtype == "BYTES" else f"TYPE_{dtype}"
    return mc.DataType.Value(name) if name in _DATA_TYPES else mc.TYPE_INVALID


def model_config_proto(info: ModelConfigInfo) -> mc.ModelConfig:
    """Triton's ModelConfig for one version. Dims leave out the batch dimension when the model batches
    (max_batch_size > 0), as Triton's do; the queue policy rejects on timeout, and a request's own
    deadline may shorten the wait (the worker waits min(policy, deadline))."""
    batched = info.max_batch_size > 0
    backend, platform = _BACKEND.get(info.backend, (info.backend, ""))
    config = mc.ModelConfig(
        name=info.name,
        platform=platform,
        backend=backend,
        max_batch_size=info.max_batch_size,
        version_policy=mc.ModelVersionPolicy(
            specific=mc.ModelVersionPolicy.Specific(versions=[int(v) for v in info.versions])
        ),
        input=[
            mc.ModelInput(
                name=t.name, data_type=_config_dtype(t.dtype), dims=t.shape[1:] if batched else t.shape
            )
            for t in info.inputs
        ],
        output=[
            mc.ModelOutput(
                name=t.name, data_type=_config_dtype(t.dtype), dims=t.shape[1:] if batched else t.shape
            )
            for t in info.outputs
        ],
        instance_group=[
            mc.ModelInstanceGroup(
                name=f"{info.name}_{info.version}",
                count=info.instance_count,
                kind=mc.ModelInstanceGroup.KIND_GPU
                if info.device == "gpu"
                else mc.ModelInstanceGroup.KIND_CPU,
            )
        ],
        model_transaction_policy=mc.ModelTransactionPolicy(decoupled=info.decoupled),
    )
    batching = info.dynamic_batching
    if batching is not None:
        levels = batching.priority_levels if batching.priority_levels > 1 else 0  # Triton: 0 = no levels
        config.dynamic_batching.CopyFrom(
            mc.ModelDynamicBatching(
                preferred_batch_size=batching.preferred_batch_sizes,
                max_queue_delay_microseconds=batching.max_queue_delay_us,
                priority_levels=levels,
                default_priority_level=batching.default_priority_level if levels else 0,
                default_queue_policy=mc.ModelQueuePolicy(
                    timeout_action=mc.ModelQueuePolicy.REJECT,
                    default_timeout_microseconds=batching.default_queue_timeout_us,
                    allow_timeout_override=True,
                    max_queue_size=batching.max_queue_size,
                ),
            )
        )
    return config


# --- inputs ------------------------------------------------------------------------------------------


def decode_inputs(
    request: pb.ModelInferRequest, shm: SharedMemory | None = None, raw: Sequence[Any] | None = None
) -> dict[str, np.ndarray]:
    """The request's input tensors by name, from its raw entries (``raw``, else its own
    ``raw_input_contents``), typed ``contents`` or a system shared memory region registered with ``shm``."""
    if raw is None:
        raw = request.raw_input_contents
    # raw entries belong, in order, to the inputs that are not in shared memory (as tritonclient sends them)
    tensors = request.inputs
    shared = [bool(t.parameters) and "shared_memory_region" in t.parameters for t in tensors]
    if raw and len(raw) != len(tensors) - sum(shared):
        raise InvalidArgument(
            f"raw_input_contents has {len(raw)} entries but the request has {len(tensors) - sum(shared)} "
            "inputs not in shared memory; send one entry per such input, in the order of inputs"
        )
    arrays: dict[str, np.ndarray] = {}
    next_raw = 0
    for tensor, in_shm in zip(tensors, shared, strict=True):
        if tensor.name in arrays:
            raise InvalidArgument(f"input {tensor.name} appears twice; send each input once")
        entry = None
        if raw and not in_shm:
            entry, next_raw = raw[next_raw], next_raw + 1
        arrays[tensor.name] = _decode_tensor(tensor, entry, shm, in_shm)
    return arrays


def _decode_tensor(
    tensor: pb.ModelInferRequest.InferInputTensor, raw: Any, shm: SharedMemory | None, in_shm: bool
) -> np.ndarray:
    name = tensor.name
    shape = check_shape(f"input {name}", tuple(tensor.shape))
    dtype = _input_dtype(name, tensor.datatype)
    if in_shm:
        if shm is None:
            raise InvalidArgument(f"input {name}: shared memory is not supported; send raw_input_contents")
        region, offset, size = shm_reference(
            {k: _param_value(p) for k, p in tensor.parameters.items()}, f"input {name}"
        )
        return shm.read(region, offset, size, datatype=tensor.datatype, shape=shape, what=f"input {name}")
    count = math.prod(shape)
    typed = [d.name for d, _ in tensor.contents.ListFields()] if tensor.HasField("contents") else []
    if raw is not None:
        if typed:
            raise InvalidArgument(
                f"input {name}: has both contents and a raw_input_contents entry; send one of them"
            )
        if tensor.datatype != dtypes.BYTES and len(raw) != count * dtype.itemsize:
            raise InvalidArgument(
                f"input {name}: raw content is {len(raw)} bytes but shape {list(shape)} of "
                f"{tensor.datatype} needs {count * dtype.itemsize}"
            )
        return dtypes.from_bytes(tensor.datatype, raw, shape, f"input {name}")
    return _typed_array(tensor, dtype, shape, typed)


def _input_dtype(name: str, datatype: str) -> np.dtype:
    try:
        return dtypes.numpy_dtype(datatype)
    except InvalidArgument as err:
        raise InvalidArgument(f"input {name}: {err.message}") from None


def _typed_array(
    tensor: pb.ModelInferRequest.InferInputTensor, dtype: np.dtype, shape: tuple[int, ...], typed: list[str]
) -> np.ndarray:
    name, datatype, count = tensor.name, tensor.datatype, math.prod(shape)
    slot = _TYPED_FIELD.get(datatype)
    if not typed:
        if count == 0:
            return np.empty(shape, dtype)
        raise InvalidArgument(
            f"input {name}: no data; send raw_input_contents (one entry per input) or contents"
        )
    if slot is None:
        raise InvalidArgument(
            f"input {name}: {datatype} has no typed contents field; send raw_input_contents"
        )
    if typed != [slot]:
        raise InvalidArgument(f"input {name}: {datatype} elements go in contents.{slot}, not {typed}")
    if slot == "bytes_contents":
        values = np.empty(len(tensor.contents.bytes_contents), dtype=object)
        values[:] = list(tensor.contents.bytes_contents)
    else:
        values = np.array(getattr(tensor.contents, slot), dtype=_FIELD_DTYPE[slot])
    if values.size != count:
        raise InvalidArgument(
            f"input {name}: contents has {values.size} elements but shape {list(shape)} needs {count}"
        )
    if dtype.kind in "iu" and values.size:
        info = np.iinfo(dtype)
        if values.min() < info.min or values.max() > info.max:
            raise InvalidArgument(f"input {name}: a value in contents.{slot} is out of range for {datatype}")
    return values.astype(dtype, copy=False).reshape(shape)


def _requested_outputs(
    request: pb.ModelInferRequest,
) -> tuple[tuple[str, ...], dict[str, tuple[str, int, int]]]:
    """The outputs asked for by name, and those to write into shared memory (name -> region, offset,
    byte size)."""
    names, into_shm = [], {}
    for out in request.outputs:
        if "classification" in out.parameters:
            raise InvalidArgument(f"output {out.name}: parameter 'classification' is not supported")
        if "shared_memory_region" in out.parameters:
            values = {k: _param_value(p) for k, p in out.parameters.items()}
            into_shm[out.name] = shm_reference(values, f"output {out.name}")
        names.append(out.name)
    return tuple(names), into_shm


MAX_DIM = (1 << 31) - 1  # no dimension past this (numpy and the wire could not take it anyway)


def check_shape(what: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A tensor's shape from a client: non-negative dimensions numpy can hold."""
    if not shape:
        return shape
    if min(shape) < 0:
        raise InvalidArgument(f"{what}: shape {list(shape)} has a negative dimension")
    if max(shape) > MAX_DIM or math.prod(shape) > MAX_DIM:
        raise InvalidArgument(f"{what}: shape {list(shape)} is too large (at most {MAX_DIM} elements)")
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


def infer_options(values: Mapping[str, Any], deadline_s: float | None = None) -> InferOptions:
    """Triton's request parameters (their values: from gRPC's InferParameter or REST's JSON) as DataPlane
    arguments; ``deadline_s`` is the time the caller has left."""
    routing_key = values.get("routing_key")
    if routing_key is not None and not isinstance(routing_key, str):
        raise InvalidArgument("parameter routing_key must be a string (string_param)")
    sequence = _sequence(values)
    if routing_key is None:
        routing_key = sequence.id if sequence is not None else ""
    priority = _int_param(values, "priority")
    timeout_us = _int_param(values, "timeout")
    if timeout_us < 0:
        raise InvalidArgument(f"parameter timeout is {timeout_us}; give microseconds >= 0 (0 = no timeout)")
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
    if raw in (None, 0, ""):
        if flags["sequence_start"] or flags["sequence_end"]:
            raise InvalidArgument(
                "sequence_start and sequence_end need a sequence_id (non-zero, or a string)"
            )
        return None
    if isinstance(raw, str) and len(raw) > 256:
        raise InvalidArgument("parameter sequence_id is longer than 256 characters")
    return SequenceFlags(str(raw), flags["sequence_start"], flags["sequence_end"])


def _param_value(param: pb.InferParameter) -> bool | int | float | str | None:
    which = param.WhichOneof("parameter_choice")
    return getattr(param, which) if which else None


def _int_param(values: Mapping[str, Any], key: str) -> int:
    value = values.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"parameter {key} must be an integer (int64_param or uint64_param)")
    return value


def _param_str(value: bool | int | float | str | None) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _time_remaining(context: Any) -> float | None:
    # Unit tests call the servicer without a context.
    remaining = context.time_remaining() if context is not None else None
    return remaining if remaining is not None and math.isfinite(remaining) else None


# --- outputs -----------------------------------------------------------------------------------------


def _encode_response(
    result: InferResult,
    request_id: str,
    requested: tuple[str, ...],
    into_shm: Mapping[str, tuple[str, int, int]] | None = None,
    shm: SharedMemory | None = None,
) -> tuple[pb.ModelInferResponse, list[Any]]:
    """The response without its raw output entries, and those entries (each output's own buffer, or b""
    for one written to shared memory): ``kserve_wire.serialize_response`` copies them at most once, into the
    bytes grpc sends; ``_whole`` puts them in the message (a stream's answers)."""
    response = pb.ModelInferResponse(model_name=result.model, model_version=result.version, id=request_id)
    raw: list[Any] = []
    # the DataPlane checked the requested names: one it left out is a secondary output off at breaker
    # level 2, left out of the answer too
    for name in [n for n in requested if n in result.outputs] if requested else tuple(result.outputs):
        array = result.outputs[name]
        try:
            datatype = dtypes.from_numpy(array.dtype)
        except InvalidArgument as err:
            raise Internal(f"output {name} of model {result.model}: {err.message}") from None
        response.outputs.add(name=name, datatype=datatype, shape=array.shape)
        data = dtypes.to_bytes(array)
        target = (into_shm or {}).get(name)
        if target is not None and shm is not None:  # written there; an empty entry keeps the indices
            region, offset, size = target
            shm.write(region, offset, size, data, what=f"output {name}")
            raw.append(b"")
        else:
            raw.append(data)
    return response, raw


def _whole(response: pb.ModelInferResponse, raw: list[Any]) -> pb.ModelInferResponse:
    response.raw_output_contents.extend(bytes(data) for data in raw)
    return response
