"""ZeroMQ forwarding: one DEALER per worker, many requests in flight, replies matched by the sender's own id.

The one tensor link of the mesh: the router forwards through it, and the SDK's direct path
(``mcpclient.AsyncMeshClient(direct=True)``) sends through it to the worker a Route answer names, so both
keep the same ids, limits, delivery types and coalescing. "Router" below means whichever process sends.

Invariants:
- The id on the wire is this router's own (``new_id()``: a per-process random prefix and a counter), never
  a client's: two clients that use the same id never get each other's answer. A retry keeps its id, so a
  worker that runs it twice counts a duplicate.
- A request is in flight on exactly one worker until its reply comes or its link fails. A request the
  router gave up on (deadline, client gone) stays counted in ``loads`` (bounded loads, backpressure) as
  abandoned until then; its late reply is dropped by id and counted, never handed to anyone.
- What a failed send means is typed (DESIGN.md 7, delivery): ``NotSent`` — the link was down, draining or
  full, so the request provably did not start; ``MayHaveStarted`` — the link failed while the request was
  out, so the worker may have run it; a reply with ``FLAG_RETRYABLE`` — the worker says it did not start.
- Bounded: per worker at most ``max_in_flight`` requests, and at most ``max_bytes`` of tensors in flight
  in all; the sockets' high-water marks bound what libzmq buffers.
- Loads are kept per (model, version) ring as well as per worker, with running totals, so the router's
  bounded-load pick reads them in O(1): ``ring_loads(model, version)``.
- A link is up once its ZMTP handshake succeeded and down from its disconnect (a dead worker) or heartbeat
  timeout (a frozen one) until the next handshake; ``on_link_down(worker)`` tells the snapshot.
- A reply whose header parses but whose frames do not match it fails that request at once (INTERNAL,
  naming the worker); one whose header does not parse cannot be matched and is counted.
- A request the router gives up on (deadline, client gone) is cancelled at the worker (``KIND_CANCEL``,
  best effort), so queued work a client no longer waits for is not run. Deadlines are kept in 2 ms slots
  with one timer per slot in use, not one per request: a request fails ``DeadlineExceeded`` at most 2 ms
  before its deadline, never after it (so the router's answer is there before the worker's own deadline
  answer or the client's deadline).
- Requests for one worker sent in one loop iteration leave coalesced (``KIND_BATCH``) when its record
  lists the feature: together at the start of the next iteration, or, with ``flush_at`` > 0 (the
  router's ``coalesce_flush_at``), ``flush_at`` at a time as soon as that many wait and the rest at the
  next iteration; each keeps its own id, reply, status and retry. One still waiting to leave when its
  link fails, or whose send is refused, is ``NotSent``.
  Coalesced replies, which every request says it takes (``FLAG_TAKES_COALESCED``), are taken apart and
  each delivered as a single one.
- A link connects to the worker's same-host endpoint (``wire.local_endpoint``, an abstract Unix socket)
  when its record lists ``FEATURE_LOCAL``, publishes an address of this host, and that socket answers from
  here; else to its published endpoint. A link to a same-host endpoint is opened anew when the worker's
  incarnation changes (restarted: its name changed); a TCP link reconnects by itself, as before. A link is
  opened anew too when the record starts or stops offering the same-host endpoint and that changes where
  it connects (never for a worker on another host).
- Tensors go out and come back without copies (``copy=False``, ``np.frombuffer`` views of reply frames).
  With ``shared_memory``, a request of at least ``shm.MIN_BYTES`` of tensors to a worker on its same-host
  endpoint that offers ``FEATURE_SHM`` lends it a region of this process's memory instead (an
  ``mcpcore.shm.Lease`` from this forwarder's pool): its inputs go there, the worker writes outputs into
  it, and the reply's views name it (``Message.shared``). A worker that cannot take the region answers
  not started with ``FLAG_SHARED_MEMORY``: the request goes again at once with frames, as does every later
  one to that worker process. A request abandoned before its reply (deadline, cancelled, link failed in
  flight) spoils its region, since the worker may still write into it.
- A decoupled model's replies before its last (``FLAG_PARTIAL``) go to the request's ``on_partial`` in
  order; the request stays in flight until its last reply, and one that does not decode fails it.
- No future per message: each link's socket is a plain one that the event loop watches by its file
  descriptor. A readable callback takes up to ``_TAKE_PER_TURN`` replies with non-blocking calls, then
  lets the loop run the rest; since a send can consume the edge a reply raised (ZeroMQ's descriptor is
  edge-like), every send and every full turn schedule one more look: no reply is ever left unseen. Only
  the links' monitors (rare events) are asyncio sockets, on a shadow of the same context.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import ipaddress
import itertools
import logging
import math
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from mcpapi.v2 import tensor_pb2
from mcpcore import shm, wire
from mcpcore.errors import DataLoss, DeadlineExceeded, Internal, InvalidArgument, MCPError, Unavailable

__all__ = ["Forwarder", "LinkTarget", "MayHaveStarted", "NotSent", "link_address"]

_monitors = itertools.count(1)

log = logging.getLogger(__name__)
_SWEEP_S = 5.0
_TAKE_PER_TURN = 8  # replies taken per readable callback before the loop runs the rest
#: Deadlines are kept in slots this long, one timer per slot in use (not one per request): a request is
#: given up on at the start of its deadline's slot, at most this much before its deadline, never after.
_DEADLINE_SLOT_S = 0.002


class LinkTarget(Protocol):
    """What a link needs to know of a worker (the router's ``LinkTarget``, the SDK's route)."""

    @property
    def id(self) -> str: ...
    @property
    def zmq(self) -> str: ...
    @property
    def curve_public_key(self) -> str: ...
    @property
    def zmq_features(self) -> frozenset[str]: ...
    @property
    def incarnation(self) -> str: ...
    @property
    def draining(self) -> bool: ...


def link_address(endpoint: LinkTarget) -> str:
    """Where a link to ``endpoint`` connects: its same-host endpoint when the record offers one, publishes
    an address of this host and the name listens here (a connect to an abstract Unix socket answers at
    once either way), else its ``zmq``. A worker published at another host's address is never looked for
    here, so a local process cannot stand in for it by binding its name."""
    if _offers_local(endpoint) and endpoint.incarnation and _this_host(endpoint.zmq):
        local = wire.local_endpoint(
            endpoint.id, endpoint.incarnation, endpoint.zmq, endpoint.curve_public_key
        )
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.setblocking(False)
            try:
                probe.connect("\0" + local.removeprefix("ipc://@"))
                return local
            except BlockingIOError:  # its backlog is full: it listens
                return local
            except OSError:  # nobody by that name in this network namespace
                pass
    return endpoint.zmq


def _offers_local(endpoint: LinkTarget) -> bool:
    return wire.FEATURE_LOCAL in endpoint.zmq_features


def _this_host(zmq_endpoint: str) -> bool:
    """``tcp://HOST:PORT`` names an IP address of this network namespace (loopback, or one a socket can
    bind here). A host name is not resolved (no lookups on the loop): such a worker is reached by TCP."""
    host = zmq_endpoint.removeprefix("tcp://").rpartition(":")[0].strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if address.is_loopback:
        return True
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as udp:
        try:
            udp.bind((host, 0))  # only an address assigned here binds
        except OSError:
            return False
    return True


class NotSent(Unavailable):
    """The request never left this router for that worker: safe to send to another one."""


class MayHaveStarted(Unavailable):
    """The worker's link failed while the request was out: it may have run."""


@dataclass(eq=False, slots=True)
class _Pending:
    future: asyncio.Future[wire.Message] | None  # None once the router gave up on it (abandoned)
    ring: tuple[str, str]  # (model, version)
    nbytes: int
    since: float
    on_partial: Callable[[wire.Message], None] | None = None
    answers: int = 0  # partial replies taken (the next one must say this many)
    shared: shm.Lease | None = None  # the region this request lent the worker
    rid: str = ""  # this router's id of it
    timeout_s: float = 0.0  # what it was given
    slot: int = 0  # the deadline slot it is due in (``Forwarder._due``)


class RingLoad:
    """Requests in flight for one (model, version), per worker and in all (what bounded loads read)."""

    __slots__ = ("per_worker", "total")

    def __init__(self) -> None:
        self.per_worker: dict[str, int] = {}
        self.total = 0


class _Link:
    def __init__(self, endpoint: LinkTarget, fwd: Forwarder) -> None:
        self.endpoint = endpoint
        self.address = link_address(endpoint)  # what the socket connects to (the same-host one, or zmq)
        self.sock: zmq.Socket[Any] = fwd._ctx.socket(zmq.DEALER)
        try:
            self.monitor = self._configure(endpoint, fwd)
        except BaseException:
            self.sock.close(linger=0)
            raise
        self.pending: dict[str, _Pending] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.down = True  # until the handshake succeeds; again from a disconnect to the next handshake
        self.draining = False  # the worker answered "draining": send it nothing more
        self.up = asyncio.Event()  # set from a handshake to the next disconnect (``wait_connected``)
        self.look_scheduled = False
        self.outbox: dict[str, list[Any]] = {}  # request id -> its frames, until they leave (``_send``)
        self.flush_scheduled = False

    def _configure(self, endpoint: LinkTarget, fwd: Forwarder) -> zmq.asyncio.Socket:
        limits = fwd.limits
        for option, value in (
            (zmq.LINGER, 0),
            (zmq.IMMEDIATE, 1),  # queue only to a connected worker: a send to none fails at once
            (zmq.SNDHWM, fwd.max_in_flight + 16),
            (zmq.RCVHWM, fwd.max_in_flight + 16),
            (zmq.MAXMSGSIZE, limits.max_message_bytes + limits.max_header_bytes),
            (zmq.HEARTBEAT_IVL, int(fwd.heartbeat_s * 1000)),
            (zmq.HEARTBEAT_TIMEOUT, int(fwd.heartbeat_timeout_s * 1000)),
            (zmq.HEARTBEAT_TTL, int(fwd.heartbeat_timeout_s * 1000)),
        ):
            self.sock.setsockopt(option, value)
        if endpoint.curve_public_key:
            public, secret = fwd.curve_keypair or zmq.curve_keypair()
            self.sock.curve_serverkey = endpoint.curve_public_key.encode()
            self.sock.curve_publickey, self.sock.curve_secretkey = public, secret
        address = f"inproc://link-monitor-{next(_monitors)}"
        self.sock.monitor(address, zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
        monitor = fwd._actx.socket(zmq.PAIR)
        monitor.connect(address)
        try:
            self.sock.connect(self.address)
        except BaseException:
            monitor.close(linger=0)
            raise
        return monitor


class Forwarder:
    def __init__(
        self,
        *,
        max_in_flight: int = 512,
        max_bytes: int = 1 << 30,
        limits: wire.Limits = wire.DEFAULT_LIMITS,
        heartbeat_s: float = 0.5,
        heartbeat_timeout_s: float = 2.0,
        abandon_s: float = 60.0,
        on_error: Callable[[str], None] = lambda loop: None,
        on_link_down: Callable[[str], None] = lambda worker: None,
        on_late: Callable[[], None] = lambda: None,
        curve_keypair: tuple[bytes, bytes] | None = None,
        shared_memory: bool = False,
        flush_at: int = 0,
    ) -> None:
        if flush_at < 0:
            raise ValueError(f"flush_at: must be >= 0 (0: only at the next loop iteration), got {flush_at}")
        self._ctx = zmq.Context()
        #: Lend same-host workers shared memory for large requests (the module's docstring).
        self.shared_memory = shared_memory and shm.AVAILABLE
        self.regions: shm.RegionPool | None = None  # made at the first lease
        self._no_shared: dict[str, str] = {}  # worker -> the incarnation that refused this process's memory
        #: This sender's CURVE identity (public, secret), which workers with an allow-list check; None: a
        #: fresh key pair per link (the link is encrypted, but a worker with an allow-list refuses it).
        self.curve_keypair = curve_keypair
        self._actx = zmq.asyncio.Context.shadow(self._ctx.underlying)  # the links' monitors
        self._loop: asyncio.AbstractEventLoop | None = None
        self._links: dict[str, _Link] = {}
        self.max_in_flight = max_in_flight
        self.max_bytes = max_bytes
        self.limits = limits
        self.heartbeat_s, self.heartbeat_timeout_s = heartbeat_s, heartbeat_timeout_s
        self._abandon_s = abandon_s
        self._on_error, self._on_link_down, self._on_late = on_error, on_link_down, on_late
        self._prefix = uuid.uuid4().hex[:10]
        self._ids = itertools.count(1)
        self.loads: dict[str, int] = {}  # worker -> requests in flight (abandoned ones included)
        self._rings: dict[tuple[str, str], RingLoad] = defaultdict(RingLoad)
        self.nbytes = 0  # tensor bytes in flight, all workers
        self._sweeper: asyncio.Task[None] | None = None
        self._to_flush: list[_Link] = []  # links with an outbox to send at the next iteration
        #: A link's outbox leaves as soon as it holds this many requests (0: only at the next iteration).
        #: Measured at c=64 over one connection (harness load, alternating on one running mesh, 8 rounds x
        #: 6 s): 8 against 0, +5% req/s (ahead in 6 of 8), the share of idle CPU 0.15 against 0.21, the
        #: router's and worker's CPU per request +4% (more, smaller messages); 2 and 4 cost more CPU than
        #: the earlier start gains.
        self.flush_at = flush_at
        # deadline slot -> its timer and the requests due in it; a slot goes (and its timer is cancelled)
        # once its last request ends, so only slots with requests in flight are kept
        self._due: dict[int, tuple[asyncio.TimerHandle, dict[_Pending, _Link]]] = {}

    def new_id(self) -> str:
        """A correlation id unique to this router process."""
        return f"{self._prefix}-{next(self._ids):x}"

    # -- membership ------------------------------------------------------------------------------------
    def sync(self, workers: Mapping[str, LinkTarget]) -> None:
        """Open links to new workers, close links to workers gone or moved (called on every table swap)."""
        for worker_id, link in list(self._links.items()):
            new = workers.get(worker_id)
            if new is None or (new.zmq, new.curve_public_key) != (
                link.endpoint.zmq,
                link.endpoint.curve_public_key,
            ):
                self._close(worker_id, link, "left the routing table")
            elif link.address != link.endpoint.zmq and new.incarnation != link.endpoint.incarnation:
                self._close(worker_id, link, "restarted")  # its same-host endpoint has a new name
            elif _offers_local(new) != _offers_local(link.endpoint) and link_address(new) != link.address:
                self._close(worker_id, link, "changed its same-host endpoint")  # offered or withdrawn here
        for worker_id, endpoint in workers.items():
            link = self._links.get(worker_id)
            if link is None:
                try:
                    link = _Link(endpoint, self)
                except zmq.ZMQError as exc:  # one unusable endpoint must not cost the others their links
                    self._on_error("zmq_link")
                    log.error("cannot open a link to worker %s (%s): %s", worker_id, endpoint.zmq, exc)
                    continue
                self._loop = asyncio.get_running_loop()
                self._loop.add_reader(link.sock.FD, self._readable, link)
                link.tasks = [asyncio.create_task(self._watch(link), name=f"zmq-monitor-{worker_id}")]
                self._links[worker_id] = link
                self.loads[worker_id] = 0
            else:
                link.endpoint = endpoint
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep(), name="zmq-abandoned")

    def address(self, worker_id: str) -> str:
        """Where the link to ``worker_id`` connects ("" with no link): its same-host endpoint or its zmq."""
        link = self._links.get(worker_id)
        return "" if link is None else link.address

    def link_ok(self, worker_id: str) -> bool:
        """Connected (handshake done, heartbeats answered)."""
        link = self._links.get(worker_id)
        return link is not None and not link.down

    async def wait_connected(self, worker_id: str, timeout_s: float) -> bool:
        """Whether the link to ``worker_id`` is up, waiting at most ``timeout_s`` for its handshake (a
        link just opened by ``sync`` is down until then)."""
        link = self._links.get(worker_id)
        if link is None:
            return False
        if link.down:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await link.up.wait()  # also set when the link closes
        return self._links.get(worker_id) is link and not link.down

    def usable(self, worker_id: str) -> bool:
        """Connected and not draining: a new request may go there."""
        link = self._links.get(worker_id)
        return link is not None and not link.down and not link.draining and not link.endpoint.draining

    def serving(self, worker_id: str) -> bool:
        """Connected and still taking requests, though its record may say draining (it is handing its
        replicas over): where a request goes when no other copy can take it."""
        link = self._links.get(worker_id)
        return link is not None and not link.down and not link.draining

    def in_flight(self, worker_id: str) -> int:
        link = self._links.get(worker_id)
        return 0 if link is None else len(link.pending)

    def ring_load(self, model: str, version: str) -> RingLoad:
        """The live in-flight counts of one (model, version) (read-only: the forwarder keeps them)."""
        return self._rings[(model, version)]

    async def close(self) -> None:
        if self.regions is not None:
            self.regions.close()  # idle regions now; those still lent when their outputs go
        if self._sweeper is not None:
            self._sweeper.cancel()
        tasks = [t for link in self._links.values() for t in link.tasks]
        for worker_id, link in list(self._links.items()):
            self._close(worker_id, link, "left the routing table (router stopping)")
        await asyncio.gather(*tasks, *([self._sweeper] if self._sweeper else []), return_exceptions=True)
        self._ctx.term()

    def _close(self, worker_id: str, link: _Link, why: str) -> None:
        link.down = True
        link.up.set()  # wakes ``wait_connected``: it finds the link gone
        if self._loop is not None:
            self._loop.remove_reader(link.sock.FD)
        for task in link.tasks:
            task.cancel()
        self._fail_all(worker_id, link, why)
        with contextlib.suppress(zmq.ZMQError):
            link.sock.disable_monitor()
        link.monitor.close(linger=0)
        link.sock.close(linger=0)
        del self._links[worker_id]
        self.loads.pop(worker_id, None)

    # -- requests --------------------------------------------------------------------------------------
    def send(
        self,
        worker_id: str,
        header: tensor_pb2.TensorHeader,
        inputs: Mapping[str, np.ndarray],
        *,
        timeout_s: float,
        nbytes: int = 0,
        on_partial: Callable[[wire.Message], None] | None = None,
    ) -> Coroutine[Any, Any, wire.Message]:
        """Send one request (``header.request_id`` from ``new_id()``) and wait for its reply, whatever its
        status; a decoupled model's replies before the last go to ``on_partial`` as they come. Raises
        ``NotSent``, ``MayHaveStarted``, ``DeadlineExceeded`` or ``Internal`` (a reply that does not
        decode). A plain function returning the awaitable: no extra coroutine per request."""
        lease = None
        if self.shared_memory and nbytes >= shm.MIN_BYTES:
            try:
                lease = self._lease(worker_id, inputs)
            except OSError as exc:  # no region to be had (descriptors, memory): frames serve as well
                log.warning(
                    "no shared-memory region for a request to %s (%s); sending frames", worker_id, exc
                )
        if lease is None:
            return self._send(
                worker_id,
                header,
                inputs,
                timeout_s=timeout_s,
                nbytes=nbytes,
                on_partial=on_partial,
                shared=None,
            )
        attempt = functools.partial(
            self._send, worker_id, header, inputs, nbytes=nbytes, on_partial=on_partial
        )
        link = self._links.get(worker_id)
        incarnation = link.endpoint.incarnation if link is not None else ""  # the process it goes to
        return self._unless_refused(
            attempt, lease, header, worker=(worker_id, incarnation), timeout_s=timeout_s
        )

    async def _unless_refused(
        self,
        attempt: Callable[..., Coroutine[Any, Any, wire.Message]],
        lease: shm.Lease,
        header: tensor_pb2.TensorHeader,
        *,
        worker: tuple[str, str],
        timeout_s: float,
    ) -> wire.Message:
        """The reply to ``attempt`` with its tensors in ``lease``, unless the worker refused the memory (not
        started, ``FLAG_SHARED_MEMORY``): then ``attempt`` with frames and what is left of the time, and
        that worker process (``worker``: its id and incarnation) gets frames from now on."""
        worker_id, incarnation = worker
        started = time.monotonic()
        reply = await attempt(timeout_s=timeout_s, shared=lease)
        refused = wire.FLAG_SHARED_MEMORY | wire.FLAG_RETRYABLE
        if not reply.header.status_code or reply.header.flags & refused != refused:
            return reply
        log.info(
            "worker %s cannot take this process's shared memory (%s); sending frames",
            worker_id, reply.header.status_message,
        )  # fmt: skip
        if len(self._no_shared) > 4096:
            self._no_shared.clear()
        self._no_shared[worker_id] = incarnation
        left = timeout_s - (time.monotonic() - started)
        if left <= 0:
            raise DeadlineExceeded(
                f"worker {worker_id} refused this process's shared memory and no time was left to send "
                f"request {header.request_id} again with frames"
            )
        header.flags &= ~wire.FLAG_SHARED_MEMORY  # not started there: the same request, with frames
        header.ClearField("reply_region")
        header.timeout_us = max(1, int(left * 1e6))  # what is left of its time, as the worker counts it
        return await attempt(timeout_s=left, shared=None)

    def _lease(self, worker_id: str, inputs: Mapping[str, np.ndarray]) -> shm.Lease | None:
        """A shared-memory region for this request, or None for frames (the module's docstring)."""
        link = self._links.get(worker_id)
        if (
            link is None
            or link.down
            or link.draining  # refused unsent anyway: no region for it
            or wire.FEATURE_SHM not in link.endpoint.zmq_features
            or not link.address.startswith("ipc://")  # not on its same-host endpoint
            or self._no_shared.get(worker_id) == link.endpoint.incarnation
        ):
            return None
        if self.regions is None:
            self.regions = shm.RegionPool(max_region_bytes=2 * self.limits.max_message_bytes + (1 << 20))
        return self.regions.lease(list(inputs.values()))

    async def _send(
        self,
        worker_id: str,
        header: tensor_pb2.TensorHeader,
        inputs: Mapping[str, np.ndarray],
        *,
        timeout_s: float,
        nbytes: int,
        on_partial: Callable[[wire.Message], None] | None,
        shared: shm.Lease | None,
    ) -> wire.Message:
        link = self._links.get(worker_id)
        if link is None or link.down:
            raise NotSent(f"worker {worker_id} is not connected")
        if link.draining:
            raise NotSent(f"worker {worker_id} is draining")
        if len(link.pending) >= self.max_in_flight:
            raise NotSent(
                f"exceeds maximum queue size: worker {worker_id} has {len(link.pending)} requests in flight "
                "from this router (max_in_flight_per_worker)"
            )
        if self.nbytes + nbytes > self.max_bytes:
            raise NotSent(
                f"exceeds maximum queue size: this router has {self.nbytes} bytes of tensors in flight and "
                f"the request brings {nbytes} (max_bytes_in_flight {self.max_bytes})"
            )
        rid = header.request_id
        header.flags |= wire.FLAG_TAKES_COALESCED  # its reply may come with others (older workers ignore it)
        place = None
        if shared is not None:
            header.flags |= wire.FLAG_SHARED_MEMORY
            header.reply_region.CopyFrom(shared.reply_region())
            place = shared.place
        frames = wire.encode(header, inputs, place)
        if len(frames[0]) > self.limits.max_header_bytes:  # the worker could only refuse it, unnamed
            raise InvalidArgument(
                f"the request's header is {len(frames[0])} bytes, over the "
                f"{self.limits.max_header_bytes}-byte limit (too many tensors or parameters)"
            )
        loop = asyncio.get_running_loop()
        coalescing = wire.FEATURE_BATCH in link.endpoint.zmq_features
        if not coalescing:
            self._send_now(link, frames)
        future: asyncio.Future[wire.Message] = loop.create_future()
        entry = _Pending(
            future, (header.model, header.version), nbytes, time.monotonic(), on_partial, shared=shared,
            rid=rid, timeout_s=timeout_s,
        )  # fmt: skip
        link.pending[rid] = entry
        ring = self._rings[entry.ring]
        ring.per_worker[worker_id] = ring.per_worker.get(worker_id, 0) + 1
        ring.total += 1
        self.loads[worker_id] += 1
        self.nbytes += nbytes
        if coalescing:  # leaves with this iteration's others for the worker (``_flush``)
            link.outbox[rid] = frames
            if not link.flush_scheduled:
                link.flush_scheduled = True
                self._to_flush.append(link)
                if len(self._to_flush) == 1:  # in a fresh context: no request's log fields
                    loop.call_soon(self._flush, context=contextvars.Context())
        self._due_at(loop, loop.time() + timeout_s, entry, link)
        if coalescing and self.flush_at and len(link.outbox) >= self.flush_at:
            # its worker can start on these while this iteration goes on; in a fresh context, as ``_flush``
            contextvars.Context().run(self._send_outbox, link)
        try:
            return await future  # its reply, or its deadline (``_expire``) fails it
        except asyncio.CancelledError:  # the client went away: the worker may still be running it
            if entry.future is not None:
                self._abandon(link, entry)
            raise

    def _due_at(self, loop: asyncio.AbstractEventLoop, deadline: float, entry: _Pending, link: _Link) -> None:
        if not math.isfinite(deadline):  # no deadline: it waits for its reply or its link
            return
        entry.slot = slot = math.floor(deadline / _DEADLINE_SLOT_S)
        slotted = self._due.get(slot)
        if slotted is None:
            timer = loop.call_at(slot * _DEADLINE_SLOT_S, self._expire, slot, context=contextvars.Context())
            slotted = self._due[slot] = (timer, {})
        slotted[1][entry] = link

    def _expire(self, slot: int) -> None:
        """The requests whose deadline passed in ``slot`` and that are still waiting: given up on."""
        slotted = self._due.pop(slot, None)
        if slotted is None:
            return
        for entry, link in slotted[1].items():
            future = entry.future
            if future is None or future.done():
                continue
            try:
                self._abandon(link, entry)
            except Exception:  # never: the others of the slot are still given up on
                log.exception("request %s could not be given up on cleanly", entry.rid)
            future.set_exception(
                DeadlineExceeded(
                    f"worker {link.endpoint.id} did not answer within {entry.timeout_s * 1000:.0f} ms "
                    f"(request {entry.rid})"
                )
            )

    def _send_now(self, link: _Link, frames: list[Any]) -> None:
        worker_id = link.endpoint.id
        try:  # NOBLOCK: sent at once or refused at once (never waits, never queues)
            link.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            raise NotSent(f"worker {worker_id}'s link is full or not connected") from None
        except zmq.ZMQError as exc:
            raise NotSent(f"worker {worker_id}: the send failed ({exc})") from None
        finally:
            self._look_again(link)  # the send may have taken the edge a reply raised

    def _flush(self) -> None:
        """Send each link's requests of the last iteration, coalesced as far as the limits allow; those a
        send refuses fail ``NotSent`` (they never left)."""
        links, self._to_flush = self._to_flush, []
        for link in links:
            link.flush_scheduled = False
        for link in links:
            self._send_outbox(link)

    def _send_outbox(self, link: _Link) -> None:
        """Send the requests waiting in ``link``'s outbox, coalesced as far as the limits allow."""
        out, link.outbox = link.outbox, {}
        if not out or self._links.get(link.endpoint.id) is not link:
            return  # nothing waits, or it failed already (the link closed)
        rids, messages = list(out), list(out.values())
        try:
            groups = wire.coalesce(messages, self.limits)
        except Exception as exc:  # never: the frames were made by encode; if so, none of them left
            log.exception("requests for worker %s could not be coalesced", link.endpoint.id)
            self._unsent(link, rids, f"worker {link.endpoint.id}: the send failed ({exc})")
            return
        at = 0
        for count, message in groups:
            group, at = rids[at : at + count], at + count
            try:
                self._send_now(link, message)
            except NotSent as exc:
                self._unsent(link, group, exc.message)
            except Exception as exc:  # whatever it was, these did not leave; the other links go on
                log.exception("sending to worker %s failed", link.endpoint.id)
                self._unsent(link, group, f"worker {link.endpoint.id}: the send failed ({exc})")

    def _unsent(self, link: _Link, rids: list[str], why: str) -> None:
        for rid in rids:
            entry = self._finish(link.endpoint.id, link, rid)
            if entry is not None and entry.future is not None and not entry.future.done():
                entry.future.set_exception(NotSent(why))

    def _abandon(self, link: _Link, entry: _Pending) -> None:
        """Given up by the router: the worker is told (KIND_CANCEL: it drops the request if still queued,
        stops a stream), and the request stays counted until the worker answers (or its link fails). One
        still waiting for its link's flush (a deadline slot that came due before it) never leaves: it is
        taken out of the outbox and forgotten, with nothing to cancel."""
        entry.future = None
        entry.on_partial = None
        if link.outbox.pop(entry.rid, None) is not None:  # still waiting for its flush: it never left
            self._finish(link.endpoint.id, link, entry.rid)
            return
        entry.since = time.monotonic()
        self._not_due(entry)
        if entry.shared is not None:
            entry.shared.spoil()
        cancel = tensor_pb2.TensorHeader(
            kind=tensor_pb2.KIND_CANCEL, request_id=entry.rid, model=entry.ring[0]
        )
        with contextlib.suppress(zmq.ZMQError):  # best effort: the deadline drops it at the worker anyway
            link.sock.send_multipart([cancel.SerializeToString()], flags=zmq.NOBLOCK)
        self._look_again(link)

    def mark_draining(self, worker_id: str) -> None:
        """The worker answered "draining": choose it no more (until it connects again)."""
        link = self._links.get(worker_id)
        if link is not None and not link.draining:
            link.draining = True
            log.info("worker %s is draining: no new requests go to it", worker_id)

    def _finish(self, worker_id: str, link: _Link, rid: str) -> _Pending | None:
        entry = link.pending.pop(rid, None)
        if entry is not None:
            self._not_due(entry)
            ring = self._rings[entry.ring]
            ring.per_worker[worker_id] -= 1
            ring.total -= 1
            self.loads[worker_id] -= 1
            self.nbytes -= entry.nbytes
        return entry

    def _not_due(self, entry: _Pending) -> None:
        slotted = self._due.get(entry.slot)
        if slotted is not None:
            due = slotted[1]
            due.pop(entry, None)
            if not due:  # its last request ended: no timer for nobody
                slotted[0].cancel()
                del self._due[entry.slot]

    def _fail_all(self, worker_id: str, link: _Link, why: str) -> None:
        unsent, link.outbox = link.outbox, {}
        for rid in list(link.pending):
            entry = self._finish(worker_id, link, rid)
            if entry is not None and entry.shared is not None and rid not in unsent:
                entry.shared.spoil()  # no last reply came: the worker may still write into it
            if entry is not None and entry.future is not None and not entry.future.done():
                if rid in unsent:  # it never left: safe anywhere
                    error: Unavailable = NotSent(f"worker {worker_id} {why} before the request was sent")
                else:
                    error = MayHaveStarted(f"worker {worker_id} {why} while the request was in flight")
                entry.future.set_exception(error)

    def _look_again(self, link: _Link) -> None:
        """Run ``_readable`` for ``link`` once more soon (at most one pending)."""
        if not link.look_scheduled and self._loop is not None:
            link.look_scheduled = True
            self._loop.call_soon(self._readable, link, context=contextvars.Context())

    def _readable(self, link: _Link) -> None:
        link.look_scheduled = False
        sock = link.sock
        for _ in range(_TAKE_PER_TURN):
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
        self._look_again(link)  # more may wait: the rest of the loop runs first

    def _take(self, link: _Link, frames: list[Any]) -> None:
        """Hand one reply, or each of a coalesced message's, to the request waiting for it (by this
        router's id), or count it late."""
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

    def _deliver(self, link: _Link, header: tensor_pb2.TensorHeader, frames: Sequence[Any]) -> None:
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
        else:  # a partial reply to a request that expects one answer: the worker's fault, said at once
            entry.future.set_exception(
                Internal(f"worker {worker_id} answered a request more than once (model {header.model})")
            )

    async def _watch(self, link: _Link) -> None:
        worker_id = link.endpoint.id
        while True:
            try:
                event = parse_monitor_message(await link.monitor.recv_multipart())
            except asyncio.CancelledError:
                raise
            except Exception:
                return  # the monitor closed with its link
            if event["event"] == zmq.EVENT_DISCONNECTED:
                was_up, link.down = not link.down, True
                link.up.clear()
                self._fail_all(worker_id, link, "disconnected")
                if was_up:
                    log.warning("worker %s disconnected", worker_id)
                self._on_link_down(worker_id)
            elif event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                link.down, link.draining = False, False
                link.up.set()

    async def _sweep(self) -> None:
        """Forget abandoned requests a worker never answered (it lost them), so loads cannot creep up."""
        while True:
            await asyncio.sleep(_SWEEP_S)  # a periodic clean-up, not a synchronisation
            cutoff = time.monotonic() - self._abandon_s
            for worker_id, link in list(self._links.items()):
                for rid, entry in list(link.pending.items()):
                    if entry.future is None and entry.since < cutoff:
                        self._finish(worker_id, link, rid)
