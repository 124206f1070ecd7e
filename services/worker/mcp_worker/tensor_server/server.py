"""The worker's ZeroMQ tensor server: a ROUTER socket speaking ``mcpcore.wire``.

Invariants:
- Many requests are in flight at once, and replies go out in whatever order the work finishes, addressed by
  the peer identity and carrying the request id. Every request, a decoupled model's included, starts the one
  way: the ``Starter`` queues it with callbacks for its answers, no task of its own. A coalesced message's
  requests (``KIND_BATCH``, sent by routers that read the record's ``zmq_features``) are each admitted,
  answered, retried and cancelled exactly as a single one, and their replies and refusals go back coalesced:
  those of single requests flagged ``FLAG_TAKES_COALESCED`` too (``router_socket.Outbox``). Any other single
  message is answered with single messages: older senders, the SDK.
- Bounded: a request for a model held here holds an ``Admission`` ticket (requests and tensor bytes in
  flight, shared fairly between models) from its arrival to its reply (one for any other model is answered
  "not loaded here", not started, before admission); past the bounds it is refused at once "exceeds maximum
  queue size", not started (``FLAG_RETRYABLE``). The socket's high-water marks bound what libzmq buffers
  (``router_socket``).
- Nothing a peer sends can stop the server: a malformed message is answered with an error reply (its
  gRPC code in the header) and the loop goes on. A tensor frame over ``max_tensor_bytes`` is answered
  RESOURCE_EXHAUSTED; a frame over the message limit disconnects its peer (``MAXMSGSIZE``).
- A reply over the limits is never sent: the request is answered RESOURCE_EXHAUSTED instead (it ran, so
  it is not retryable), and a router never has to drop a frame it cannot take.
- ``FLAG_RETRYABLE`` goes only on errors raised before the request began to execute
  (``MCPError.not_started``): a router may send those elsewhere whatever the model.
- ``KIND_CANCEL`` from a peer stops its request: dropped if still queued, a decoupled model's answers
  stop; it is answered "cancelled", so the peer's in-flight count ends at once.
- Draining (``drain()``, a graceful stop): every new request is answered not started with
  ``FLAG_DRAINING``, so routers send elsewhere at once and stop choosing this worker.
- Tensors are received and sent without copies (``copy=False``; ``np.frombuffer`` views).
- No future per frame: the socket is a plain (sync) one that the event loop watches by its file
  descriptor. A readable callback takes up to ``_TAKE_PER_TURN`` whole messages with non-blocking calls,
  then lets the loop run the rest; the descriptor is edge-like (a send can consume the edge a new message
  raised), so after a turn that took its limit, and after every send, one more look is scheduled.
- The header is parsed once per request, on arrival (a coalesced message's headers in one parse):
  admission, the handler and the reply use that one.
- A decoupled model answers with any number of replies: each one handed to the request's ``Partial``
  goes out at once with ``FLAG_PARTIAL``, in order, and the request's last reply (its outputs, often
  none, or its error) goes without it; the ticket is held until that last one is sent. An answer that
  cannot be sent ends the request: its last reply carries that error.
- A same-host sender on the local endpoint may pass tensors in its shared memory and lend a reply region
  (``shared_memory``); memory that cannot be taken is refused not started with ``FLAG_SHARED_MEMORY``
  (the sender sends frames instead), a range outside its region is ``INVALID_ARGUMENT``; each refusal is
  logged and counted.
- ZMTP heartbeats detect a peer that vanished or froze; who may connect is ``curve``'s.
- While a request is admitted and started (synchronously, no task of its own), its log fields are bound
  (``mcpcore.logs``: request_id, model, trace_id from ``wire.PARAM_TRACEPARENT``) and, with tracing on, the
  trace context that parameter names is attached: what runs then logs them, and the queue records the context
  with the request (``mcp_worker.batching``). The loop's own callbacks (looks, flushes) run in a fresh
  context, so no request's fields outlive it there.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from mcp_worker.tensor_server.admission import Admission, Ticket
from mcp_worker.tensor_server.replies import encode_reply, header_or_none
from mcp_worker.tensor_server.router_socket import Outbox, open_router
from mcp_worker.tensor_server.shared_memory import take_shared
from mcpapi.v2 import tensor_pb2
from mcpcore import logs, tracing, wire
from mcpcore.errors import (
    Internal,
    InvalidArgument,
    MCPError,
    Unavailable,
    not_started,
)
from mcpcore.transport import shm_lease

__all__ = ["Done", "Partial", "Starter", "TensorServer"]


log = logging.getLogger(__name__)
_TAKE_PER_TURN = 8  # messages taken per readable callback before the loop runs the rest

#: Sends one partial reply now (version, outputs): a decoupled model's answers before its last; on the
#: loop, in order, before the request's ``Done``.
Partial = Callable[[str, dict[str, np.ndarray]], None]
#: Takes a started request's end: (version, outputs), or the MCPError that goes back in its reply.
Done = Callable[[tuple[str, dict[str, np.ndarray]] | MCPError], None]
#: Starts a request without a task: queues it, returns a callable that withdraws it (a running stream
#: stops answering), and calls ``Done`` once, later, on the loop; raises an MCPError to refuse it.
Starter = Callable[[wire.Message, Partial, Done], Callable[[], None]]


@dataclass(slots=True)
class _Started:
    """A started request: what answers or withdraws it."""

    identity: Any
    header: tensor_pb2.TensorHeader
    ticket: Ticket
    coalesced: bool  # it came in a coalesced message: its reply goes back in one
    withdraw: Callable[[], None] = lambda: None
    area: shm_lease.ReplyArea | None = None  # the sender's reply region, when it lent one
    answers: int = 0  # partial replies sent
    broken: MCPError | None = None  # a partial reply that could not go: the last reply says so


class TensorServer:
    def __init__(
        self,
        bind: str,
        start: Starter,
        *,
        limits: wire.Limits = wire.DEFAULT_LIMITS,
        curve_secret: bytes | None = None,
        curve_clients: str = "",
        on_error: Callable[[str], None] | None = None,
        admission: Admission | None = None,
        holds: Callable[[str], bool] = lambda model: True,
        on_not_held: Callable[[], None] = lambda: None,
        on_message: Callable[[int], None] = lambda coalesced: None,
        on_cancelled: Callable[[tensor_pb2.TensorHeader], None] = lambda header: None,
        on_shared: Callable[[str, int], None] = lambda direction, nbytes: None,
        heartbeat_s: float = 1.0,
        heartbeat_timeout_s: float = 3.0,
    ) -> None:
        self._bind = bind
        self._start = start
        self._limits = limits
        self._curve_secret = curve_secret
        self._curve_clients = curve_clients  # a folder of allowed clients' public keys (ZAP); "" = any
        self._authenticator: Any = None
        self._on_error = on_error or (lambda where: None)
        self.admission = admission or Admission(max_requests=1024, max_bytes=256 << 20)
        self._holds, self._on_not_held, self._on_message = holds, on_not_held, on_message
        self._on_cancelled = on_cancelled  # a request its sender gave up on (its header), before its end
        # shared-memory bytes taken ("in"), written ("out"), or a refusal ("refused", 0)
        self._on_shared = on_shared
        self._regions = (
            shm_lease.PeerRegions(max_region_bytes=4 * limits.max_message_bytes + (1 << 20))
            if shm_lease.AVAILABLE
            else None
        )
        self._heartbeat = (heartbeat_s, heartbeat_timeout_s)
        self._ctx = zmq.Context()
        self._sock: zmq.Socket[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._look_scheduled = False
        self._stopping = False
        self._started: dict[tuple[bytes, str], _Started] = {}  # (peer, request id) -> its request
        self._outbox = Outbox(limits, after_send=self._look_again)
        self._idle = asyncio.Event()
        self._idle.set()
        self._tracing = tracing.enabled()  # resolved once: off, a request costs no trace work here
        self.endpoint = ""
        self.local_endpoint = ""  # bound: senders on this host may use it (the record says FEATURE_LOCAL)
        self.draining = False
        self.last_request = 0.0  # monotonic time of the last message received

    async def start(self) -> str:
        sock, self._authenticator = open_router(
            self._ctx, self._bind, limits=self._limits, max_requests=self.admission.max_requests,
            heartbeat=self._heartbeat, curve_secret=self._curve_secret, curve_clients=self._curve_clients,
        )  # fmt: skip
        self._sock = self._outbox.sock = sock
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._loop = self._outbox.loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.FD, self._readable)
        self._look_again()  # the descriptor signals changes, not state: look once to begin
        return self.endpoint

    def bind_local(self, address: str) -> bool:
        """Also listen on ``address`` (``wire.local_endpoint``: same-host senders), best effort; the same
        socket, so the same CURVE keys, limits and replies by identity. False: senders use ``endpoint``."""
        assert self._sock is not None, "start() first"
        if not sys.platform.startswith("linux"):  # elsewhere "@name" would be a file in the working dir
            log.info("no same-host endpoint off Linux (no abstract sockets); senders use %s", self.endpoint)
            return False
        try:
            self._sock.bind(address)
        except zmq.ZMQError as exc:  # the name is taken
            log.warning("no same-host endpoint %s (%s); senders use %s", address, exc, self.endpoint)
            return False
        self.local_endpoint = address
        return True

    @property
    def shared_memory(self) -> bool:
        """Same-host senders may use their shared memory (the record says ``FEATURE_SHM``)."""
        return bool(self.local_endpoint) and self._regions is not None

    def drain(self) -> None:
        """Answer every new request "not started, draining" from now on (a graceful stop)."""
        self.draining = True

    @property
    def in_flight(self) -> int:
        return len(self._started)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until every admitted request is answered (True), or ``timeout_s`` passed (False)."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def _settle(self) -> None:
        if not self._started:
            self._idle.set()

    async def wait_quiet(self, quiet_s: float, max_s: float) -> None:
        """Wait until no request arrived for ``quiet_s`` (at most ``max_s``): while draining, senders that
        had not seen the flag yet get their "not started" answers before the socket closes."""
        deadline = time.monotonic() + max_s
        # quiet is the absence of events: a timer, not a readiness wait
        while (now := time.monotonic()) < deadline and now - self.last_request < quiet_s:  # noqa: ASYNC110
            await asyncio.sleep(min(quiet_s - (now - self.last_request), deadline - now))

    async def stop(self) -> None:
        self._stopping = True  # a look already scheduled takes nothing more
        if self._sock is not None and self._loop is not None:
            self._loop.remove_reader(self._sock.FD)
        for started in list(self._started.values()):  # unanswered: the router retries what did not start
            started.withdraw()
            self.admission.release(started.ticket)
        self._started.clear()
        self._idle.set()  # nothing is in flight any more: a wait_idle ends now
        self._outbox.flush()  # replies already made still go
        if self._sock is not None:
            self._sock.close(linger=0)
        if self._authenticator is not None:
            self._authenticator.stop()
        self._ctx.term()

    def _look_again(self) -> None:
        """Run ``_readable`` once more soon (at most one pending): the descriptor may not signal again."""
        if not self._look_scheduled and self._loop is not None:
            self._look_scheduled = True
            self._loop.call_soon(self._readable, context=contextvars.Context())

    def _readable(self) -> None:
        self._look_scheduled = False
        sock = self._sock
        if sock is None or sock.closed or self._stopping:
            return
        for _ in range(_TAKE_PER_TURN):
            try:
                if not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    return
            except zmq.ZMQError:  # closed under us (stopping)
                return
            self._take()
        self._look_again()  # more may wait: the rest of the loop runs first

    def _take(self) -> None:
        """Receive one whole message, admit it, and start its answer (or answer it here and now)."""
        try:
            frames, header = self._receive()
            self.last_request = time.monotonic()
            identity = frames[0]
            if header is None:
                self._malformed(identity, frames[1:])
            elif header.kind == tensor_pb2.KIND_CANCEL:
                self._cancel(bytes(identity.bytes), header.request_id)
            elif header.kind == wire.KIND_BATCH:
                self._on_message(len(header.batch))
                self._take_batch(identity, header, frames[2:])
            else:
                self._on_message(0)
                coalesced = bool(header.flags & wire.FLAG_TAKES_COALESCED)  # its reply may join others
                self._take_one(identity, header, frames[2:], coalesced=coalesced)
        except Exception:
            log.exception("receive failed; the server goes on")
            self._on_error("zmq_receive")

    def _take_batch(self, identity: Any, envelope: tensor_pb2.TensorHeader, frames: list[Any]) -> None:
        """Admit and start each request of a coalesced message, each on its own terms."""
        try:
            parts = wire.uncoalesce(envelope, frames, self._limits)
        except MCPError as error:  # nothing in it can be trusted: each request it names is refused
            for header in envelope.batch:  # as many as max_header_bytes allows
                self._refuse(identity, header, error, retryable=False, coalesced=True)
            return
        for header, tensors in parts:
            self._take_one(identity, header, tensors, coalesced=True)

    def _take_one(
        self, identity: Any, header: tensor_pb2.TensorHeader, frames: Sequence[Any], *, coalesced: bool
    ) -> None:
        """Admit and start one request, its log fields bound and (tracing on) its trace context attached
        meanwhile (the module's docstring)."""
        traceparent = header.parameters.get(wire.PARAM_TRACEPARENT, "")
        trace_id = traceparent[3:35] if len(traceparent) == 55 else ""  # W3C: 00-<trace id>-<span id>-<flags>
        _, token = logs.bind(request_id=header.request_id, model=header.model, trace_id=trace_id)
        caller = tracing.attach(tracing.from_traceparent(traceparent)) if self._tracing else None
        try:
            if (ticket := self._admit(identity, header, coalesced=coalesced)) is None:
                return
            area = None
            if header.flags & wire.FLAG_SHARED_MEMORY:
                try:
                    regions = self._regions if self.local_endpoint else None
                    frames, area, taken = take_shared(regions, identity, header, frames, self._limits)
                    self._on_shared("in", taken)
                except Exception as exc:
                    self.admission.release(ticket)
                    self._refuse_shared(identity, header, exc, coalesced=coalesced)
                    return
            self._begin(identity, header, frames, ticket, coalesced=coalesced, area=area)
        finally:
            if caller is not None:
                tracing.detach(caller)
            logs.reset(token)

    def _refuse_shared(
        self, identity: Any, header: tensor_pb2.TensorHeader, exc: Exception, *, coalesced: bool
    ) -> None:
        """Answer a request whose shared memory could not be taken: not started, with
        ``FLAG_SHARED_MEMORY`` (the sender sends frames instead), unless its ranges were wrong."""
        if not isinstance(exc, MCPError):
            log.exception("request %s: the sender's shared memory could not be taken", header.request_id)
            self._on_error("zmq_shared_memory")
            exc = not_started(
                Internal("the sender's shared memory could not be taken; the worker log says why")
            )
        self._on_shared("refused", 0)
        log.warning("request %s: shared memory refused: %s", header.request_id, exc.message)
        flags = wire.FLAG_SHARED_MEMORY if exc.not_started else 0
        self._refuse(identity, header, exc, flags, retryable=exc.not_started, coalesced=coalesced)

    def _begin(
        self,
        identity: Any,
        header: tensor_pb2.TensorHeader,
        frames: Sequence[Any],
        ticket: Ticket,
        *,
        coalesced: bool,
        area: shm_lease.ReplyArea | None = None,
    ) -> None:
        """Start one admitted request through the ``Starter``."""
        key = (bytes(identity.bytes), header.request_id)
        started = _Started(identity, header, ticket, coalesced, area=area)
        self._started[key] = started  # before it starts: an answer may come at any time after
        self._idle.clear()
        try:
            msg = wire.Message(header, wire.tensors_of(header, frames, self._limits))
            withdraw = self._start(
                msg,
                lambda version, outputs: self._partial(key, started, version, outputs),
                lambda result: self._finished(key, started, result),
            )
        except MCPError as err:
            self._forget(key, started)
            self.admission.release(ticket)
            retryable = err.not_started and err.retryable
            self._refuse(identity, header, err, retryable=retryable, coalesced=coalesced)
            return
        except Exception:
            log.exception("request %s failed", header.request_id)
            self._on_error("zmq_request")
            self._forget(key, started)
            self.admission.release(ticket)
            error = Internal("internal error; the worker log has the details")
            self._refuse(identity, header, error, retryable=False, coalesced=coalesced)
            return
        if self._started.get(key) is started:
            started.withdraw = withdraw

    def _forget(self, key: tuple[bytes, str], started: _Started) -> None:
        if self._started.get(key) is started:
            del self._started[key]
        self._settle()

    def _finished(
        self, key: tuple[bytes, str], started: _Started, result: tuple[str, dict[str, np.ndarray]] | MCPError
    ) -> None:
        """A request ended: its ticket is released and its last reply goes (a coalesced one's with the
        peer's others of this iteration)."""
        if self._started.get(key) is not started:
            return  # withdrawn (cancelled, or the server stops): answered already, or never
        del self._started[key]
        self.admission.release(started.ticket)
        header = started.header
        try:
            if isinstance(result, MCPError):
                raise result
            if started.broken is not None:
                raise started.broken
            out = self._encode_reply(header, *result, area=started.area)
        except MCPError as err:
            out = [wire.error_reply(header, err, retryable=err.not_started and err.retryable)]
        except Exception:
            log.exception("request %s: the reply could not be encoded", header.request_id)
            self._on_error("zmq_request")
            out = [wire.error_reply(header, Internal("internal error; the worker log has the details"))]
        self._outbox.post(started.identity, out, coalesced=started.coalesced)
        self._settle()

    def _partial(
        self, key: tuple[bytes, str], started: _Started, version: str, outputs: dict[str, np.ndarray]
    ) -> None:
        """Send one of a decoupled model's answers before its last, at once, with ``FLAG_PARTIAL``."""
        if self._started.get(key) is not started or started.broken is not None:
            return  # an answer still on its way after the request ended, or after one that failed
        header = started.header
        try:
            frames = self._encode_reply(header, version, outputs, wire.FLAG_PARTIAL, answer=started.answers)
        except MCPError as err:
            started.broken = err
            return
        except Exception as exc:  # never lost in the loop's handler: the last reply says it
            log.exception("request %s: an answer could not be encoded", header.request_id)
            started.broken = Internal(f"an answer of model {header.model} could not be encoded ({exc})")
            return
        self._outbox.send([started.identity, *frames], "a reply")
        started.answers += 1

    def _cancel(self, peer: bytes, request_id: str) -> None:
        """The sender gave up on the request: stop it (dropped if queued; a stream stops answering)."""
        started = self._started.pop((peer, request_id), None)
        if started is not None:  # answered here: nothing of it is sent after this
            started.withdraw()
            self._on_cancelled(started.header)
            self.admission.release(started.ticket)
            error = Unavailable("cancelled: the sender gave up on the request")
            reply = [wire.error_reply(started.header, error)]
            self._outbox.post(started.identity, reply, coalesced=started.coalesced)
            self._settle()

    def _malformed(self, identity: Any, body: list[Any]) -> None:
        """Answer a message whose header does not parse (parsed again only to name what is wrong)."""
        try:
            if not body:
                raise InvalidArgument("empty message: expected [TensorHeader, tensor frames...]")
            wire.parse_header(body[0], self._limits)
            raise InvalidArgument("first frame is not a TensorHeader")
        except MCPError as error:
            self._refuse(identity, None, error, retryable=False)

    def _admit(self, identity: Any, header: tensor_pb2.TensorHeader, *, coalesced: bool) -> Ticket | None:
        """A ticket for the request, or None once it has been answered here and now."""
        key = (bytes(identity.bytes), header.request_id)
        if key in self._started:  # its answer could not say which one it is
            error = InvalidArgument(
                f"request id {header.request_id!r} is already in flight from this sender; use a new id"
            )
            self._refuse(identity, header, error, retryable=False, coalesced=coalesced)
            return None
        if self.draining:
            error = not_started(Unavailable("worker is stopping (draining); send it to another worker"))
            self._refuse(identity, header, error, wire.FLAG_DRAINING, coalesced=coalesced)
            return None
        if not self._holds(header.model):  # answered unadmitted: names from the network count for nothing
            self._on_not_held()
            error = not_started(Unavailable(f"model {header.model} is not loaded here"))
            self._refuse(identity, header, error, coalesced=coalesced)
            return None
        try:
            return self.admission.admit(header.model, sum(spec.byte_size for spec in header.tensors))
        except MCPError as error:
            self._refuse(identity, header, error, coalesced=coalesced)
            return None

    def _refuse(
        self,
        identity: Any,
        header: tensor_pb2.TensorHeader | None,
        error: MCPError,
        flags: int = 0,
        *,
        retryable: bool = True,
        coalesced: bool = False,
    ) -> None:
        reply = wire.error_reply(header, error, retryable=retryable, flags=flags)
        self._outbox.post(identity, [reply], coalesced=coalesced)

    def _receive(self) -> tuple[list[Any], tensor_pb2.TensorHeader | None]:
        """One multipart message (it is readable: called after POLLIN) and its parsed header (None if
        it does not parse). Every frame stays in libzmq's own buffer (``copy=False``): the loop copies
        nothing."""
        sock = self._sock
        assert sock is not None
        frames: list[Any] = [sock.recv(zmq.NOBLOCK, copy=False)]
        more = frames[0].more
        while more:  # the rest of a message arrives with its first frame: these never wait
            frame = sock.recv(zmq.NOBLOCK, copy=False)
            frames.append(frame)
            more = frame.more
        # the header: parsed once, to admit the request and to read its tensors
        return frames, header_or_none(frames[1], self._limits) if len(frames) > 1 else None

    def _encode_reply(
        self,
        header: tensor_pb2.TensorHeader,
        version: str,
        outputs: dict[str, np.ndarray],
        flags: int = 0,
        *,
        answer: int | None = None,
        area: shm_lease.ReplyArea | None = None,
    ) -> list[Any]:
        """``replies.encode_reply`` under this server's limits, counting what went into a reply region."""
        return encode_reply(
            header, version, outputs, self._limits, flags, answer=answer, area=area,
            on_written=lambda nbytes: self._on_shared("out", nbytes),
        )  # fmt: skip
