"""Replies from workers, each handed to the request waiting for it by this sender's own id.

Invariants:
- No future per message: a link's socket is a plain one the event loop watches by its file descriptor.
  ``readable`` takes up to ``TAKE_PER_TURN`` replies with non-blocking calls, then lets the loop run the
  rest; since a send can consume the edge a reply raised (ZeroMQ's descriptor is edge-like), every send
  and every full turn schedule one more look (``look_again``): no reply is ever left unseen.
- A reply for a request the sender gave up on (or never sent) is dropped by id and counted (``on_late``),
  never handed to anyone.
- A reply whose header parses but whose frames do not match it fails that request at once (INTERNAL,
  naming the worker); one whose header does not parse cannot be matched and is counted (``on_error``).
- Coalesced replies (``KIND_BATCH``) are taken apart and each delivered as a single one.
- Tensors come back without copies (``np.frombuffer`` views of reply frames, or of the request's lent
  region: ``Message.shared``).
- A decoupled model's replies before its last (``FLAG_PARTIAL``) go to the request's ``on_partial`` in
  order; the request stays in flight until its last reply, and one that does not decode, or a gap in the
  answers, fails it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from mcpapi.v2 import tensor_pb2
from mcpcore import wire
from mcpcore.errors import DataLoss, Internal, MCPError
from mcpcore.transport.link import Link, Pending

__all__ = ["TAKE_PER_TURN", "ReplyReader"]

log = logging.getLogger(__name__)

TAKE_PER_TURN = 8  # replies taken per readable callback before the loop runs the rest


class ReplyReader:
    """Reads the links' sockets and settles their requests."""

    __slots__ = ("_finish", "_on_error", "_on_late", "limits", "loop")

    def __init__(
        self,
        limits: wire.Limits,
        *,
        finish: Callable[[str, Link, str], Pending | None],
        on_error: Callable[[str], None],
        on_late: Callable[[], None],
    ) -> None:
        self.limits = limits
        self.loop: asyncio.AbstractEventLoop | None = None  # the loop the links are watched on
        self._finish = finish  # (worker, link, request id): the request out of flight, or None
        self._on_error, self._on_late = on_error, on_late

    def look_again(self, link: Link) -> None:
        """Run ``readable`` for ``link`` once more soon (at most one pending)."""
        if not link.look_scheduled and self.loop is not None:
            link.look_scheduled = True
            self.loop.call_soon(self.readable, link, context=contextvars.Context())

    def readable(self, link: Link) -> None:
        link.look_scheduled = False
        sock = link.sock
        for _ in range(TAKE_PER_TURN):
            try:
                if sock.closed or not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    return
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            except zmq.ZMQError as exc:
                self._on_error("zmq_reply")
                log.warning("receiving from worker %s failed: %s", link.endpoint.id, exc)
                return
            self._take(link, frames)
        self.look_again(link)  # more may wait: the rest of the loop runs first

    def _take(self, link: Link, frames: list[Any]) -> None:
        """Hand one reply, or each of a coalesced message's, to the request waiting for it (by this
        sender's id), or count it late."""
        worker_id = link.endpoint.id
        try:
            header = wire.parse_header(frames[0], self.limits)
        except MCPError as exc:
            self._on_error("zmq_reply")
            log.warning("worker %s sent a reply that does not parse (%s); it matches no request",
                        worker_id, exc.message)  # fmt: skip
            return
        if header.kind != wire.KIND_BATCH:
            self._deliver(link, header, frames[1:])
            return
        try:
            parts = wire.uncoalesce(header, frames[1:], self.limits)
        except MCPError as exc:  # every request it names fails now, not at its deadline
            self._on_error("zmq_reply")
            for sub in header.batch:
                entry = self._finish(worker_id, link, sub.request_id)
                if entry is not None and entry.future is not None and not entry.future.done():
                    entry.future.set_exception(
                        Internal(f"worker {worker_id} sent replies that do not decode: {exc.message}")
                    )
            return
        for sub, tensors in parts:
            self._deliver(link, sub, tensors)

    def _deliver(self, link: Link, header: tensor_pb2.TensorHeader, frames: Sequence[Any]) -> None:
        worker_id = link.endpoint.id
        partial = bool(header.flags & wire.FLAG_PARTIAL)
        if partial:  # more replies follow: it stays in flight
            entry = link.pending.get(header.request_id)
        else:
            entry = self._finish(worker_id, link, header.request_id)
        if entry is None or entry.future is None or entry.future.done():
            self._on_late()  # the router gave up on it (or never sent it): dropped by id
            return
        try:
            if entry.shared is not None and not partial:
                frames = wire.with_regions(header, frames, entry.shared.view, self.limits)
            msg = wire.Message(
                header, wire.tensors_of(header, frames, self.limits), shared=entry.shared is not None
            )
        except Exception as exc:  # whatever the reply holds, its request fails now, not at its deadline
            self._on_error("zmq_reply")
            why = exc.message if isinstance(exc, MCPError) else f"{type(exc).__name__}: {exc}"
            entry.future.set_exception(
                Internal(f"worker {worker_id} sent a reply that does not decode: {why}")
            )
            return
        if not partial:
            entry.future.set_result(msg)
        elif entry.on_partial is not None:
            self._partial(worker_id, entry, header, msg)
        else:  # a partial reply to a request that expects one answer: the worker's fault, said at once
            entry.future.set_exception(
                Internal(f"worker {worker_id} answered a request more than once (model {header.model})")
            )

    @staticmethod
    def _partial(worker_id: str, entry: Pending, header: tensor_pb2.TensorHeader, msg: wire.Message) -> None:
        """One of a decoupled model's answers before its last, passed on in order."""
        assert entry.future is not None and entry.on_partial is not None
        said = header.parameters.get(wire.PARAM_ANSWER)
        if said != str(entry.answers):  # a gap: ZeroMQ dropped an answer (a full queue) on the way
            entry.future.set_exception(
                DataLoss(
                    f"worker {worker_id} sent answer {said} of model {header.model} but answer "
                    f"{entry.answers} was next: an answer was lost on the way; run the request again"
                )
            )
            return
        entry.answers += 1
        try:
            entry.on_partial(msg)
        except Exception as exc:  # its own request fails (MCPError as is), never the other replies
            if not isinstance(exc, MCPError):
                exc = Internal(f"an answer from worker {worker_id} could not be passed on: {exc}")
            entry.future.set_exception(exc)
