"""What a gRPC handler of the mesh may ask of its call, and what ``GrpcService`` asks of its server.

The mesh serves gRPC on two transports: ``grpc.aio`` (every service) and the router's grpc++ front door
(``mcp_native.grpc_server``). A handler is written against ``CallContext``, never against either
transport's class, so it runs unchanged on both; ``GrpcService`` drives its server through
``RpcServer`` alone.

Invariants:
- ``CallContext`` names exactly the methods the services' handlers and the error mapping call on a
  context (``git grep 'context\\.' services libs/core`` is the check); a handler needing another one
  adds it here and to both transports, and the conformance suite
  (``tests/integration/test_native_grpc_server.py``) checks it on both.
- ``grpc.aio.ServicerContext`` implements ``CallContext`` as it is; ``RpcServer``'s ``bind`` is the one
  place a server learns its address and TLS, and it raises ``OSError`` when the address cannot be bound.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, NoReturn, Protocol, runtime_checkable

import grpc

if TYPE_CHECKING:
    from mcpcore.tls import TLSConfig

__all__ = ["CallContext", "Metadata", "RpcServer"]

#: (key, value) pairs; a value is bytes for a key ending "-bin", else str.
Metadata = Sequence[tuple[str, str | bytes]]


@runtime_checkable
class CallContext(Protocol):
    """One call, as its handler sees it."""

    def invocation_metadata(self) -> Metadata | None:
        """The request metadata the client sent."""

    def time_remaining(self) -> float | None:
        """Seconds until the call's deadline (None: it has none)."""

    def auth_context(self) -> Mapping[str, Iterable[bytes]]:
        """The TLS session's properties (the caller's certificate names); empty without TLS."""

    def set_code(self, code: grpc.StatusCode) -> None:
        """The status the call ends with (a handler that sets one other than OK returns no reply)."""

    def set_details(self, details: str) -> None:
        """The status message the call ends with."""

    def set_trailing_metadata(self, trailing_metadata: Metadata) -> None:
        """Metadata sent with the status."""

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Metadata = ()
    ) -> NoReturn:
        """End the call now with ``code`` (not OK): raises ``grpc.aio.AbortError`` out of the handler."""


@runtime_checkable
class RpcServer(Protocol):
    """A gRPC server as ``GrpcService`` uses it. The two ``add_*`` methods are what the generated
    ``add_*Servicer_to_server`` functions call."""

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None: ...

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None: ...

    def bind(self, address: str, tls: TLSConfig | None) -> int:
        """Listen on ``address`` (TLS when ``tls``, an enabled config with a certificate and key); returns
        the bound port. Raises OSError when the address cannot be bound."""

    async def start(self) -> None: ...

    async def stop(self, grace: float | None) -> None:
        """Refuse new calls, give open ones ``grace`` seconds, then cancel them."""
