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

import asyncio
import logging
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from mcpcore.call_context import RpcServer
from mcpcore.logs import OncePer
from mcpcore.tls import Access, TLSConfig
from mcpcore.transport.guarded import GuardedServer

__all__ = ["DEFAULT_MAX_RECEIVE", "AioServer", "GrpcService", "Parts", "advertised_host", "join_parts"]

#: A request larger than this is refused RESOURCE_EXHAUSTED before it is parsed (control APIs; the router
#: and workers, which carry tensors, set their own: 64 MiB and 16 MiB).
DEFAULT_MAX_RECEIVE = 4 << 20

log = logging.getLogger(__name__)

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


def _grpc_path_crash(exc: BaseException | None) -> bool:
    """``exc`` is grpc.aio's serving loop failing to decode a request's method path (see ``AioServer``)."""
    if not isinstance(exc, UnicodeDecodeError):
        return False
    tb = exc.__traceback__
    while tb is not None:
        if "aio/server.pyx" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


def _not_a_path_crash(record: logging.LogRecord) -> bool:
    """A log filter: drops grpc's and asyncio's ERROR lines (with tracebacks) for that failure, which
    ``AioServer`` reports itself, once per period, as a WARNING."""
    if isinstance(record.msg, BaseException):  # grpc logs the exception itself, outside its handler
        return not _grpc_path_crash(record.msg)
    return not (record.exc_info and _grpc_path_crash(record.exc_info[1]))


for _name in ("grpc._cython.cygrpc", "asyncio"):
    logging.getLogger(_name).addFilter(_not_a_path_crash)


class AioServer:
    """A ``grpc.aio`` server as an ``RpcServer`` (``mcpcore.call_context``): what every service runs
    unless it names another ``server_factory`` (the router's grpc++ front door).

    grpc.aio (1.85) ends its whole server when a request's method path is not UTF-8: its serving loop
    decodes the path before any handler runs, and a failure there shuts the server down. One such
    request would leave the port closed for good while the process, and its etcd records, live on. So
    this server keeps what it was given (handlers, ports) and, when the server ends without ``stop``,
    serves again on the same ports at once, with a WARNING (once per 10 s) instead of grpc's traceback.
    Calls in flight at that moment end CANCELLED or UNAVAILABLE; clients retry them."""

    def __init__(
        self, *, options: Sequence[tuple[str, Any]] = (), maximum_concurrent_rpcs: int | None = None
    ) -> None:
        self._options = list(options)
        self._maximum_concurrent_rpcs = maximum_concurrent_rpcs
        self._generic: list[grpc.GenericRpcHandler] = []
        self._registered: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
        self._ports: list[tuple[str, TLSConfig | None]] = []
        self._watch: asyncio.Task[None] | None = None
        self._stopping = False
        self.restarts = 0
        self.server = self._new()

    def _new(self) -> grpc.aio.Server:
        return grpc.aio.server(options=self._options, maximum_concurrent_rpcs=self._maximum_concurrent_rpcs)

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._generic.extend(handlers)
        self.server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        self._registered[service] = dict(handlers)
        self.server.add_registered_method_handlers(service, dict(handlers))

    def bind(self, address: str, tls: TLSConfig | None) -> int:
        port = self._bind(self.server, address, tls)
        self._ports.append((f"{address.rsplit(':', 1)[0]}:{port}", tls))  # the port it got, if 0 was asked
        return port

    @staticmethod
    def _bind(server: grpc.aio.Server, address: str, tls: TLSConfig | None) -> int:
        try:
            if tls is None:
                return server.add_insecure_port(address)
            return server.add_secure_port(address, tls.server_credentials())
        except RuntimeError as exc:  # grpc.aio's word for it; the same error as the native server's
            why = "in use by another process, or not an address of this host"
            raise OSError(f"Failed to bind gRPC port {address}: {why}") from exc

    async def start(self) -> None:
        await self.server.start()
        self._watch = asyncio.get_running_loop().create_task(self._serve_again_when_it_ends())

    async def _serve_again_when_it_ends(self) -> None:
        while True:
            try:
                await self.server.wait_for_termination()
                cause = "it stopped"
            except Exception as exc:  # grpc re-raises what ended its serving loop
                cause = "a request's method path is not UTF-8" if _grpc_path_crash(exc) else repr(exc)
            if self._stopping:
                return
            self.restarts += 1
            if (unsaid := _RESTARTS.allow(cause)) is not None:
                ports = ", ".join(address for address, _ in self._ports)
                log.warning("the gRPC server on %s ended (%s); serving again on the same ports "
                            "(%d more since the last line)", ports, cause, unsaid)  # fmt: skip
            server = self._new()
            server.add_generic_rpc_handlers(self._generic)
            for service, handlers in self._registered.items():
                server.add_registered_method_handlers(service, handlers)
            for address, tls in self._ports:
                self._bind(server, address, tls)
            await server.start()
            if self._stopping:  # stop() came while this one started: it stopped the one that ended
                await server.stop(None)
                return
            self.server = server

    async def stop(self, grace: float | None) -> None:
        self._stopping = True
        await self.server.stop(grace)
        if self._watch is not None:  # not cancelled: it awaits grpc's own shutdown future
            await self._watch


_RESTARTS = OncePer(10.0)


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
