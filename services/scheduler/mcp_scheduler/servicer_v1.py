"""``mcpapi.v1.ModelControl``: the small frozen surface, as thin adapters over the same ``ControlService``.

v1 messages are converted to the v2 dataclasses and back; v1 adds no behaviour of its own, so a v1 client
and a v2 client see the same cluster.
"""

from __future__ import annotations

from mcp_scheduler.service import ControlService, ModelStatusView
from mcp_scheduler.servicer_v2 import deadline_s
from mcp_scheduler.view import ModelSpecDoc
from mcpapi.v1 import control_pb2, control_pb2_grpc
from mcpcore.errors import InvalidArgument

__all__ = ["ModelControlV1"]


def _status(s: ModelStatusView) -> control_pb2.ModelStatus:
    state = s.state
    return control_pb2.ModelStatus(
        model=s.model,
        state=control_pb2.ModelState.Value(state.value) if state else control_pb2.STATE_UNSPECIFIED,
        replicas=[
            control_pb2.ReplicaStatus(
                model=r.model,
                version=r.version,
                worker_id=r.worker,
                state=control_pb2.ModelState.Value(r.state.value),
                since_unix_ms=int(r.since * 1000),
                reason=r.reason,
            )
            for r in s.replicas
        ],
    )


class ModelControlV1(control_pb2_grpc.ModelControlServicer):
    def __init__(self, service: ControlService) -> None:
        self._s = service

    async def LoadModel(self, request, context):  # type: ignore[no-untyped-def]
        if not request.version:
            raise InvalidArgument("version: required in v1, e.g. '1'")
        spec = ModelSpecDoc(model=request.model, versions=(request.version,), replicas=request.replicas or 1)
        status = await self._s.load_model(spec, timeout_s=deadline_s(context))
        return control_pb2.LoadModelResponse(status=_status(status))

    async def UnloadModel(self, request, context):  # type: ignore[no-untyped-def]
        status = await self._s.unload_model(request.model, request.version, timeout_s=deadline_s(context))
        return control_pb2.UnloadModelResponse(status=_status(status))

    async def GetModelStatus(self, request, context):  # type: ignore[no-untyped-def]
        return control_pb2.GetModelStatusResponse(
            status=_status(self._s.status(request.model, request.version))
        )

    async def ListModels(self, request, context):  # type: ignore[no-untyped-def]
        response = control_pb2.ListModelsResponse()
        async for chunk in self._s.list_models():
            response.models.extend(_status(s) for s in chunk)
        return response
