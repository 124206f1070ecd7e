"""The client's routers: one gRPC channel each to the mesh's v2 ``Inference``, and the rule for moving a call
from one router to the next.

Invariants:
- A call goes to the router that answered last; it moves to the next only when it provably did not start
  there (the router said so, ``mcp-not-started``, or no connection to it could be made). Any other failure
  is the answer.
- An ``idempotent`` call (``Route``) also moves on any ``UNAVAILABLE`` and, each try getting its share of
  the time left, on a router that does not answer in it (frozen).
- A router that went away holding a call (its connection broke mid-call: killed, or cancelled as it
  stopped) may have run it: the call moves on only when ``resend_if()`` says its model version may run
  twice (``stats.failovers``), else it fails ``Unavailable`` "may have started".
- Channels are made on first use, on the caller's event loop; ``close()`` closes them all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from mcpapi.v2 import inference_pb2_grpc
from mcpclient.values import ClientStats
from mcpcore.errors import DeadlineExceeded, Unavailable, not_started
from mcpcore.tls import TLSConfig, aio_channel
from mcpcore.transport.grpc_status import from_rpc_error

__all__ = ["Routers"]

_MAX_MESSAGE = 256 << 20  # gRPC message limit both ways (bulk tensors through the router)
#: gRPC's words for a call that could not reach its server at all (so it never left this process)
_UNREACHED = (
    "failed to connect",
    "connection refused",
    "errors resolving",
    "dns resolution",
    "name resolution",
)
#: A call whose router went away mid-call: the connection broke (UNAVAILABLE with these words) or the
#: server cancelled it (CANCELLED: this client never cancels a call it still waits for).
_BROKEN = ("socket closed", "connection reset", "stream removed", "broken pipe", "goaway", "rst_stream",
           "connection aborted", "end of tcp stream")  # fmt: skip


@dataclass(slots=True)
class _Router:
    address: str
    channel: grpc.aio.Channel
    inference: inference_pb2_grpc.InferenceStub = field(init=False)

    def __post_init__(self) -> None:
        self.inference = inference_pb2_grpc.InferenceStub(self.channel)


def _never_reached(err: grpc.RpcError) -> bool:
    """No connection to the server could be made, so the call never left this process."""
    details = (err.details() or "").lower() if hasattr(err, "details") else ""
    return err.code() == grpc.StatusCode.UNAVAILABLE and any(words in details for words in _UNREACHED)


def _broken(err: grpc.RpcError) -> bool:
    """The call reached a router and lost it on the way: its transport broke, or the server cancelled it."""
    details = (err.details() or "").lower() if hasattr(err, "details") else ""
    if err.code() == grpc.StatusCode.CANCELLED:
        return True
    return err.code() == grpc.StatusCode.UNAVAILABLE and any(words in details for words in _BROKEN)


class Routers:
    """The routers a client was given, called in turn by the rules above."""

    def __init__(self, addresses: Sequence[str], tls: TLSConfig | None, stats: ClientStats) -> None:
        self._addresses = list(addresses)
        self._tls = tls
        self._stats = stats
        self._routers: list[_Router] = []
        self._current = 0  # the router that answered last

    def _router_list(self) -> list[_Router]:
        if not self._routers:
            options = [
                ("grpc.max_send_message_length", _MAX_MESSAGE),
                ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ]
            self._routers = [_Router(a, aio_channel(a, self._tls, options)) for a in self._addresses]
        return self._routers

    async def close(self) -> None:
        for router in self._routers:
            await router.channel.close()
        self._routers = []

    async def call(
        self,
        method: str,
        request: Any,
        deadline: float,
        *,
        idempotent: bool,
        resend_if: Callable[[], Coroutine[Any, Any, bool]] | None = None,
    ) -> Any:
        """Call ``method`` on the router that answered last, moving on to the next only when the call
        provably did not start there; an ``idempotent`` call also on any ``UNAVAILABLE`` and, since each
        try gets its share of the time left, on a router that does not answer in it (frozen). A call
        whose router went away holding it moves on only if ``resend_if()`` says it may run twice; else it
        fails "may have started"."""
        routers = self._router_list()
        tried: list[str] = []
        first = self._current  # the order is fixed here: a nested call (resend_if's Route) moves _current
        for step in range(len(routers)):
            index = (first + step) % len(routers)
            router, last = routers[index], step == len(routers) - 1
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeadlineExceeded(f"{method} ran out of time (tried {', '.join(tried) or 'no router'})")
            share = left if last or not idempotent else left / (len(routers) - step)
            try:
                reply = await getattr(router.inference, method)(request, timeout=share)
            except grpc.RpcError as rpc_error:
                error = from_rpc_error(rpc_error)
                reached = not _never_reached(rpc_error)
                if reached:
                    self._current = index  # it answered: the next call starts there
                else:
                    not_started(error)
                movable = (
                    not reached
                    or error.not_started
                    or (idempotent and isinstance(error, Unavailable | DeadlineExceeded))
                )
                if reached and not movable and resend_if is not None and _broken(rpc_error):
                    movable = not last and await resend_if()
                    if not movable:
                        error = Unavailable(
                            f"{method}: router {router.address} went away holding the request "
                            f"({error.message}); it may have started, so it was not sent again"
                        )
                if not movable or last:
                    if tried and not reached:
                        where = ", ".join([*tried, router.address])
                        unreached = Unavailable(f"no router could be reached ({where}): {error.message}")
                        raise not_started(unreached) from None
                    raise error from None
                tried.append(router.address)
                self._stats.failovers += 1
                continue
            self._current = index
            return reply
        raise Unavailable("no router configured")  # unreachable: the loop returns or raises
