"""The tensor server's ZeroMQ ROUTER socket: how it is opened (limits, high-water marks, heartbeats,
CURVE) and how replies leave it.

Invariants:
- A single frame over the server's message limit is refused by ZeroMQ itself (``MAXMSGSIZE``) before it
  is buffered; replies are bounded by admission, so the send side never reaches its high-water mark, and
  the receive side stops reading from peers once ``max_requests`` messages wait (backpressure).
- A ROUTER send never blocks: a reply to a gone peer is dropped, not an error, and a send that fails is
  logged. After every send ``after_send`` runs: the send may have taken the edge a new message raised.
- Replies to coalesced requests leave with the same peer's others of one loop iteration, as few messages
  as the limits allow; any other reply leaves at once.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from typing import Any

import zmq

from mcp_worker.tensor_server.curve import secure
from mcpcore import wire

__all__ = ["Outbox", "open_router"]

log = logging.getLogger(__name__)


def open_router(
    ctx: zmq.Context[Any],
    bind: str,
    *,
    limits: wire.Limits,
    max_requests: int,
    heartbeat: tuple[float, float],
    curve_secret: bytes | None,
    curve_clients: str,
) -> tuple[zmq.Socket[Any], Any]:
    """The bound socket, and its ZAP authenticator (None without CURVE) to stop with it. ``heartbeat``:
    (interval, timeout) in seconds, to find peers that vanished or froze."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a gone peer's reply is dropped, not an error
    sock.setsockopt(zmq.MAXMSGSIZE, limits.max_message_bytes + limits.max_header_bytes)
    sock.setsockopt(zmq.SNDHWM, 4 * max_requests + 64)
    sock.setsockopt(zmq.RCVHWM, max_requests)
    interval, timeout = heartbeat
    sock.setsockopt(zmq.HEARTBEAT_IVL, int(interval * 1000))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(timeout * 1000))
    sock.setsockopt(zmq.HEARTBEAT_TTL, int(timeout * 1000))
    authenticator = None
    if curve_secret is not None:
        authenticator = secure(sock, ctx, curve_secret, curve_clients)
    sock.bind(bind)
    return sock, authenticator


class Outbox:
    """Where replies leave the socket (set ``sock`` and ``loop`` once it is open)."""

    def __init__(self, limits: wire.Limits, after_send: Callable[[], None]) -> None:
        self._limits = limits
        self._after_send = after_send
        self.sock: zmq.Socket[Any] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._queued: dict[bytes, tuple[Any, list[list[Any]]]] = {}  # peer -> coalesced replies to send
        self._flush_scheduled = False

    def post(self, identity: Any, frames: list[Any], *, coalesced: bool) -> None:
        """Send one reply: at once, or (a coalesced request's) with the peer's others of this iteration."""
        if not coalesced:
            self.send([identity, *frames], "a reply")
            return
        peer = bytes(identity.bytes)
        queued = self._queued.get(peer)
        if queued is None:
            self._queued[peer] = (identity, [frames])
        else:
            queued[1].append(frames)
        if not self._flush_scheduled and self.loop is not None:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush, context=contextvars.Context())

    def flush(self) -> None:
        """Send each peer's coalesced replies of the last iteration, as few messages as the limits allow."""
        self._flush_scheduled = False
        queued, self._queued = self._queued, {}
        if self.sock is None or self.sock.closed:
            return
        for identity, replies in queued.values():
            for _, message in wire.coalesce(replies, self._limits):
                self.send([identity, *message], "coalesced replies")

    def send(self, frames: list[Any], what: str) -> None:
        assert self.sock is not None
        try:  # a ROUTER send never blocks: past its high-water mark it drops
            self.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as exc:
            log.warning("could not send %s: %s", what, exc)
        self._after_send()
