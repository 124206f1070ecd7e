"""KServe V2 (Open Inference Protocol) gRPC front end: ``inference.GRPCInferenceService`` over a DataPlane.

A thin adapter, so that tritonclient and perf_analyzer work against the router unchanged: protobuf in
and out (``kserve_grpc_tensors``, ``kserve_grpc_wire``), everything else the REST door shares in
``kserve_codec``; no routing logic.

Invariants:
- Protobuf stops here: the DataPlane sees names, numpy arrays and plain values only.
- Errors are raised as ``MCPError``s; the shared error mapping (``GuardedServer``) turns them into
  statuses, so nothing here calls ``context.abort``. CUDA shared memory answers UNAVAILABLE (no CUDA here).
- The gRPC deadline, when shorter than the "timeout" parameter, bounds the request.
- Streams (``kserve_stream``): a decoupled model's answers go out as they come.
- With tracing on (``mcpcore.tracing``), the call's W3C ``traceparent``/``tracestate`` metadata is the
  trace context each of its requests' spans is a child of (a stream's every request: the stream's);
  tracing off, the metadata is not read.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from mcp_router import trace
from mcp_router.dataplane import DataPlane, InferResult, TensorMeta
from mcp_router.frontends import kserve_codec, kserve_grpc_wire, kserve_stream, logsettings
from mcp_router.frontends.kserve_codec import EXTENSIONS, SERVER_NAME
from mcp_router.frontends.kserve_grpc_tensors import (
    decode_inputs,
    encode_response,
    param_value,
    requested_outputs,
    whole,
)
from mcp_router.frontends.kserve_model_info import model_config_proto, statistics_proto
from mcp_router.frontends.shm_regions import SharedMemory
from mcpapi.kserve import grpc_service_pb2 as pb
from mcpapi.kserve import grpc_service_pb2_grpc as pb_grpc
from mcpcore import tracing
from mcpcore.errors import InvalidArgument
from mcpcore.serving import Parts, join_parts

__all__ = ["KServeServicer"]


class KServeServicer(pb_grpc.GRPCInferenceServiceServicer):
    """The KServe V2 service; register with ``add_GRPCInferenceServiceServicer_to_server``."""

    def __init__(
        self,
        dataplane: DataPlane,
        *,
        version: str,
        server_name: str = SERVER_NAME,
        shm: SharedMemory | None = None,
        tracer: trace.Tracer | None = None,
        max_tensor_bytes: int = kserve_codec.DEFAULT_MAX_TENSOR_BYTES,
    ) -> None:
        self._dataplane = dataplane
        self._max_tensor_bytes = max_tensor_bytes
        self._version = version
        self._server_name = server_name
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
        return pb.ServerMetadataResponse(name=self._server_name, version=self._version, extensions=EXTENSIONS)

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

    #: ModelInfer's bytes are read and written by ``kserve_grpc_wire`` (no copies of the tensors); the
    #: other methods use the generated protobuf codecs.
    grpc_codecs = {"ModelInfer": (kserve_grpc_wire.parse_request, join_parts)}

    async def ModelInfer(self, request: kserve_grpc_wire.InferRequest, context: Any) -> Parts:
        caller = self._caller(context)
        response, raw = await self._infer(
            request.message, request.raw, _time_remaining(context), caller=caller
        )
        return kserve_grpc_wire.serialize_response(response, raw)

    def _caller(self, context: Any) -> Any:
        """The caller's trace context (tracing on), from the call's metadata; None: tracing is off."""
        if not self._tracing:
            return None
        return tracing.extract_metadata(context.invocation_metadata() if context is not None else None)

    async def ModelStreamInfer(
        self, requests: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Every request on the stream runs at once; answers come back as they finish, each with its
        request's id, and an error is an answer too (``kserve_stream``)."""
        caller = self._caller(context)

        async def infer(
            request: pb.ModelInferRequest, partial: Callable[[pb.ModelInferResponse], None]
        ) -> pb.ModelInferResponse:
            answer = await self._infer(request, request.raw_input_contents, None, partial, caller=caller)
            return whole(*answer)

        async for answer in kserve_stream.serve(requests, infer):
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
        entries apart (``encode_response``). With ``partial`` (a stream), a decoupled model's answers
        before its last go there, encoded, as they come. ``caller``: the trace context the request's
        span is a child of (None: tracing off)."""
        if not request.model_name:
            raise InvalidArgument("model_name is empty; name the model to run")
        inputs = decode_inputs(request, self._shm, raw, self._max_tensor_bytes)
        requested, into_shm = requested_outputs(request)
        values = {key: param_value(p) for key, p in request.parameters.items()} if request.parameters else {}
        options = kserve_codec.infer_options(values, deadline_s)
        # the client's: only echoed in the response (the wire id is the router's)
        request_id = kserve_codec.check_request_id(request.id)
        on_partial = None
        if partial is not None:
            send = partial

            def on_partial(result: InferResult) -> None:
                send(whole(*encode_response(result, request_id, requested)))

        call = kserve_codec.Request(
            request.model_name, request.model_version, request_id, inputs, options, requested
        )
        result = await kserve_codec.infer(
            self._dataplane, self._tracer, call, caller=caller, on_partial=on_partial
        )
        return encode_response(result, request_id, requested, into_shm, self._shm)

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

    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest, context: Any
    ) -> pb.CudaSharedMemoryStatusResponse:
        kserve_codec.cuda_shm_status({r.name for r in self._shm.status()}, request.name)
        return pb.CudaSharedMemoryStatusResponse()  # none: the router runs no CUDA

    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest, context: Any
    ) -> Any:
        raise kserve_codec.cuda_shm_register(request.name)

    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, context: Any
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        return pb.CudaSharedMemoryUnregisterResponse()  # none is registered: nothing to do, as in Triton

    # -- tracing ---------------------------------------------------------------------------------------
    async def TraceSetting(self, request: pb.TraceSettingRequest, context: Any) -> pb.TraceSettingResponse:
        changes = {key: list(v.value) for key, v in request.settings.items()}  # [] clears one
        settings = kserve_codec.trace_settings(self._tracer, self._dataplane, request.model_name, changes)
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
        version = kserve_codec.load_version({key: param_value(p) for key, p in request.parameters.items()})
        await self._dataplane.load(_model_name(request.model_name), version)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        # "unload_dependents" (always sent by tritonclient) has nothing to act on: there are no ensembles.
        await self._dataplane.unload(_model_name(request.model_name))
        return pb.RepositoryModelUnloadResponse()


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


def _time_remaining(context: Any) -> float | None:
    # Unit tests call the servicer without a context.
    remaining = context.time_remaining() if context is not None else None
    return remaining if remaining is not None and math.isfinite(remaining) else None
