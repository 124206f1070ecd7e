"""The gRPC server every mcpmesh service runs: an ``RpcServer`` (``grpc.aio`` unless the service names
another, as the router does its grpc++ front door), the MCPError mapping, and grpc.health.v1.

Invariants: every servicer is registered with ``add`` (through ``GuardedServer``), so an MCPError it
raises reaches the client as its status; every service's port answers ``grpc.health.v1`` for ``""`` and
for each of its services; they report SERVING only once the service says it is ready (``set_serving``),
and NOT_SERVING as soon as it begins to stop, before the server stops taking calls. Every port has a
request size limit (``DEFAULT_MAX_RECEIVE`` unless the service sets its own). With ``tls`` enabled
the port speaks only TLS (mutual TLS with a CA; ``mcpcore.tls``), and control methods check the caller's
certificate name before they run.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from typing import Any

from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from mcpcore.call_context import RpcServer
from mcpcore.tls import Access, TLSConfig
from mcpcore.transport.aio_server import AioServer
from mcpcore.transport.guarded import GuardedServer

__all__ = ["DEFAULT_MAX_RECEIVE", "GrpcService", "Parts", "advertised_host", "join_parts"]

#: A request larger than this is refused RESOURCE_EXHAUSTED before it is parsed (control APIs; the router
#: and workers, which carry tensors, set their own: 64 MiB and 16 MiB).
DEFAULT_MAX_RECEIVE = 4 << 20

_WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]"})  # noqa: S104 (recognised, not bound)


class Parts(tuple):  # type: ignore[type-arg]
    """A reply already serialized, as byte strings and buffers to send one after another: the router's
    native server (``mcp_native.grpc_server``) sends them as they are, large ones from their own memory;
    a method whose reply is ``Parts`` names ``join_parts`` as its serializer, for a grpc.aio server."""

    __slots__ = ()


def join_parts(parts: Parts) -> bytes:
    return b"".join(parts)


def advertised_host(bound: str, advertise: str = "") -> str:
    """The host others dial for a port bound on ``bound``: ``advertise`` when set (a pod IP, a DNS name),
    else ``bound``, or this machine's host name when ``bound`` is a wildcard (never ``0.0.0.0``)."""
    if advertise:
        return advertise
    return socket.gethostname() if bound in _WILDCARDS else bound


class GrpcService:
    def __init__(
        self,
        services: Sequence[str],
        *,
        options: Sequence[tuple[str, Any]] = (),
        maximum_concurrent_rpcs: int | None = None,
        tls: TLSConfig | None = None,
        server_factory: Callable[..., RpcServer] | None = None,
    ) -> None:
        self.services = tuple(services)
        options = list(options)
        if not any(name == "grpc.max_receive_message_length" for name, _ in options):
            options.append(("grpc.max_receive_message_length", DEFAULT_MAX_RECEIVE))  # stated, not implied
        self.tls = tls if tls is not None and tls.enabled else None
        self._access = Access(self.tls)
        self.server = (server_factory or AioServer)(  # None: grpc.aio
            options=list(options),
            maximum_concurrent_rpcs=maximum_concurrent_rpcs,
        )
        self.health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)

    def add(self, add_to_server: Callable[[Any, Any], None], servicer: Any) -> None:
        """Register ``servicer`` with its generated ``add_*Servicer_to_server`` function."""
        add_to_server(servicer, GuardedServer(self.server, self._access.check_for))

    async def start(self, host: str, port: int) -> int:
        """Bind (port 0 picks one) and start; returns the bound port. Not SERVING yet."""
        bound = self.server.bind(f"{host}:{port}", self.tls)
        await self.server.start()
        return bound

    async def set_serving(self) -> None:
        for name in ("", *self.services):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def set_not_serving(self) -> None:
        """Every name reports NOT_SERVING (a graceful stop began) while calls are still served."""
        await self.health.enter_graceful_shutdown()

    async def stop(self, grace_s: float = 1.0) -> None:
        """NOT_SERVING, refuse new calls, give in-flight ones ``grace_s``, then close."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace=grace_s)
