"""The client's control calls to the scheduler's v2 ``ModelControl``: load (and wait), unload, status.

Invariants:
- Every call has a deadline: the caller's, else the client's timeout.
- A ``grpc.RpcError`` becomes its ``MCPError`` (``mcpcore.transport.grpc_status.from_rpc_error``) with the
  scheduler's message; nothing is retried (a load or unload is the operator's decision to repeat).
- The channel is made on first use, on the caller's event loop; ``close()`` closes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio

from mcpapi.v2 import control_pb2, control_pb2_grpc, model_pb2
from mcpclient.convert import model_info
from mcpclient.values import ModelInfo
from mcpcore.tls import TLSConfig, aio_channel
from mcpcore.transport.grpc_status import from_rpc_error

__all__ = ["Control"]


class Control:
    """The scheduler at ``address``; ``timeout_s`` is each call's deadline unless the caller gives one."""

    def __init__(self, address: str, tls: TLSConfig | None, timeout_s: float) -> None:
        self._address = address
        self._tls = tls
        self._timeout = timeout_s
        self._stub: control_pb2_grpc.ModelControlStub | None = None
        self._channel: grpc.aio.Channel | None = None

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._stub = None

    async def _call(self, method: str, request: Any, deadline_s: float | None) -> Any:
        if self._stub is None:
            self._channel = aio_channel(self._address, self._tls)
            self._stub = control_pb2_grpc.ModelControlStub(self._channel)
        try:
            return await getattr(self._stub, method)(request, timeout=deadline_s or self._timeout)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    async def load(
        self,
        model: str,
        versions: Sequence[str],
        replicas: int,
        *,
        max_replicas: int,
        fallback_version: str,
        priority: int,
        deadline_s: float | None,
    ) -> ModelInfo:
        """LoadModel: the scheduler answers once the wanted replicas run."""
        if isinstance(versions, str):
            versions = (versions,)
        spec = model_pb2.ModelSpec(
            model=model, versions=list(versions), replicas=replicas, max_replicas=max_replicas,
            fallback_version=fallback_version, priority=priority,
        )  # fmt: skip
        reply = await self._call("LoadModel", control_pb2.LoadModelRequest(spec=spec), deadline_s)
        return model_info(reply.status)

    async def unload(self, model: str, version: str | None, deadline_s: float | None) -> None:
        request = control_pb2.UnloadModelRequest(model=model, version=version or "")
        await self._call("UnloadModel", request, deadline_s)

    async def status(self, model: str | None, deadline_s: float | None) -> list[ModelInfo]:
        if model:
            request = control_pb2.GetModelStatusRequest(model=model)
            reply = await self._call("GetModelStatus", request, deadline_s)
            return [model_info(reply.status)]
        reply = await self._call("ListModels", control_pb2.ListModelsRequest(), deadline_s)
        return [model_info(m) for m in reply.models]
