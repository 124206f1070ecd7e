"""ZeroMQ forwarding: one DEALER per worker, many requests in flight, replies matched by the sender's own id.

The one tensor link of the mesh: the router forwards through it, and the SDK's direct path
(``mcpclient.AsyncMeshClient(direct=True)``) sends through it to the worker a Route answer names, so both
keep the same ids, limits, delivery types and coalescing. "Router" below means whichever process sends.
The parts: ``link`` (one worker's socket), ``outbox`` (coalescing), ``deadlines`` (2 ms slots),
``replies`` (matching replies to requests) and ``shm_lending`` (same-host shared memory); this module
owns the links and the counts.

Invariants:
- The id on the wire is this router's own (``new_id()``: a per-process random prefix and a counter), never
  a client's: two clients that use the same id never get each other's answer. A retry keeps its id, so a
  worker that runs it twice counts a duplicate.
- A request is in flight on exactly one worker until its reply comes or its link fails. A request the
  router gave up on (deadline, client gone) stays counted in ``loads`` (bounded loads, backpressure) as
  abandoned until then, and is cancelled at the worker (``KIND_CANCEL``, best effort), so queued work a
  client no longer waits for is not run.
- What a failed send means is typed (``NotSent``, ``MayHaveStarted``; a reply with ``FLAG_RETRYABLE``:
  the worker says it did not start).
- Bounded: per worker at most ``max_in_flight`` requests, and at most ``max_bytes`` of tensors in flight
  in all.
- Loads are kept per (model, version) ring as well as per worker, with running totals, so the router's
  bounded-load pick reads them in O(1): ``ring_load(model, version)``.
- ``on_link_down(worker)`` tells the snapshot when a link goes down. A link to a same-host endpoint is
  opened anew when the worker's incarnation changes (restarted: its name changed); a TCP link reconnects
  by itself. A link is opened anew too when the record starts or stops offering the same-host endpoint
  and that changes where it connects (never for a worker on another host).
- Tensors go out without copies (``copy=False``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from mcpapi.v2 import tensor_pb2
from mcpcore import wire
from mcpcore.errors import DeadlineExceeded, InvalidArgument, Unavailable
from mcpcore.transport import shm_lease
from mcpcore.transport.deadlines import DeadlineSlots
from mcpcore.transport.link import (
    Link,
    LinkOptions,
    LinkTarget,
    MayHaveStarted,
    NotSent,
    Pending,
    link_address,
    offers_local,
)
from mcpcore.transport.outbox import Outboxes
from mcpcore.transport.replies import ReplyReader
from mcpcore.transport.shm_lending import Lender

__all__ = ["Forwarder", "LinkTarget", "MayHaveStarted", "NotSent", "RingLoad", "link_address"]

log = logging.getLogger(__name__)
_SWEEP_S = 5.0


class RingLoad:
    """Requests in flight for one (model, version), per worker and in all (what bounded loads read)."""

    __slots__ = ("per_worker", "total")

    def __init__(self) -> None:
        self.per_worker: dict[str, int] = {}
        self.total = 0


class Forwarder:
    """The links of one sending process (a router, or an SDK client's direct path), and what is in flight."""

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
        #: Coalescing links' requests leave at the next loop iteration, or once ``flush_at`` wait.
        self.outboxes = Outboxes(limits, flush_at, send_now=self._send_now, unsent=self._unsent)
        self._ctx = zmq.Context()
        #: Lends same-host workers shared memory for large requests (``shm_lending``).
        self.lender = Lender(shared_memory, limits)
        #: What every link is opened with; ``curve_keypair`` is this sender's CURVE identity (None: a fresh
        #: key pair per link: encrypted, but a worker with an allow-list refuses it).
        self._link_options = LinkOptions(
            max_in_flight, limits, heartbeat_s, heartbeat_timeout_s, curve_keypair
        )
        self._actx = zmq.asyncio.Context.shadow(self._ctx.underlying)  # the links' monitors
        self._loop: asyncio.AbstractEventLoop | None = None
        self._links: dict[str, Link] = {}
        self.max_in_flight = max_in_flight
        self.max_bytes = max_bytes
        self.limits = limits
        self._abandon_s = abandon_s
        self._on_error, self._on_link_down = on_error, on_link_down
        self._prefix = uuid.uuid4().hex[:10]
        self._ids = itertools.count(1)
        self.loads: dict[str, int] = {}  # worker -> requests in flight (abandoned ones included)
        self._rings: dict[tuple[str, str], RingLoad] = defaultdict(RingLoad)
        self.nbytes = 0  # tensor bytes in flight, all workers
        self._sweeper: asyncio.Task[None] | None = None
        self.deadlines = DeadlineSlots(self._deadline_passed)
        self.replies = ReplyReader(limits, finish=self._finish, on_error=on_error, on_late=on_late)

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
            elif offers_local(new) != offers_local(link.endpoint) and link_address(new) != link.address:
                self._close(worker_id, link, "changed its same-host endpoint")  # offered or withdrawn here
        for worker_id, endpoint in workers.items():
            link = self._links.get(worker_id)
            if link is None:
                try:
                    link = Link(endpoint, self._ctx, self._actx, self._link_options)
                except zmq.ZMQError as exc:  # one unusable endpoint must not cost the others their links
                    self._on_error("zmq_link")
                    log.error("cannot open a link to worker %s (%s): %s", worker_id, endpoint.zmq, exc)
                    continue
                self._loop = self.replies.loop = asyncio.get_running_loop()
                self._loop.add_reader(link.sock.FD, self.replies.readable, link)
                watch = link.watch(functools.partial(self._disconnected, worker_id, link))
                link.tasks = [asyncio.create_task(watch, name=f"zmq-monitor-{worker_id}")]
                self._links[worker_id] = link
                self.loads[worker_id] = 0
            else:
                link.endpoint = endpoint
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep(), name="zmq-abandoned")

    def _disconnected(self, worker_id: str, link: Link, was_up: bool) -> None:
        self._fail_all(worker_id, link, "disconnected")
        if was_up:
            log.warning("worker %s disconnected", worker_id)
        self._on_link_down(worker_id)

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

    def mark_draining(self, worker_id: str) -> None:
        """The worker answered "draining": choose it no more (until it connects again)."""
        link = self._links.get(worker_id)
        if link is not None and not link.draining:
            link.draining = True
            log.info("worker %s is draining: no new requests go to it", worker_id)

    async def close(self) -> None:
        self.lender.close()  # idle regions now; those still lent when their outputs go
        if self._sweeper is not None:
            self._sweeper.cancel()
        tasks = [t for link in self._links.values() for t in link.tasks]
        for worker_id, link in list(self._links.items()):
            self._close(worker_id, link, "left the routing table (router stopping)")
        await asyncio.gather(*tasks, *([self._sweeper] if self._sweeper else []), return_exceptions=True)
        self._ctx.term()

    def _close(self, worker_id: str, link: Link, why: str) -> None:
        link.close(self._loop)
        self._fail_all(worker_id, link, why)
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
        if self.lender.enabled and nbytes >= shm_lease.MIN_BYTES:
            lease = self.lender.lease(worker_id, self._links.get(worker_id), inputs)
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
        return self.lender.unless_refused(
            attempt, lease, header, worker=(worker_id, incarnation), timeout_s=timeout_s
        )

    async def _send(
        self,
        worker_id: str,
        header: tensor_pb2.TensorHeader,
        inputs: Mapping[str, np.ndarray],
        *,
        timeout_s: float,
        nbytes: int,
        on_partial: Callable[[wire.Message], None] | None,
        shared: shm_lease.Lease | None,
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
        entry = Pending(
            future, (header.model, header.version), nbytes, time.monotonic(), on_partial, shared=shared,
            rid=rid, timeout_s=timeout_s,
        )  # fmt: skip
        link.pending[rid] = entry
        ring = self._rings[entry.ring]
        ring.per_worker[worker_id] = ring.per_worker.get(worker_id, 0) + 1
        ring.total += 1
        self.loads[worker_id] += 1
        self.nbytes += nbytes
        self.deadlines.add(loop, loop.time() + timeout_s, entry, link)
        if coalescing:  # leaves with this iteration's others for the worker (or at once: ``flush_at``)
            self.outboxes.put(loop, link, rid, frames)
        try:
            return await future  # its reply, or its deadline (``_deadline_passed``) fails it
        except asyncio.CancelledError:  # the client went away: the worker may still be running it
            if entry.future is not None:
                self._abandon(link, entry)
            raise

    def _deadline_passed(self, entry: Pending, link: Link) -> None:
        future = entry.future
        assert future is not None
        try:
            self._abandon(link, entry)
        finally:  # failed all the same
            future.set_exception(
                DeadlineExceeded(
                    f"worker {link.endpoint.id} did not answer within {entry.timeout_s * 1000:.0f} ms "
                    f"(request {entry.rid})"
                )
            )

    def _send_now(self, link: Link, frames: list[Any]) -> None:
        """Send one message at once or refuse it at once (``NotSent``): never waits, never queues."""
        try:
            link.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            raise NotSent(f"worker {link.endpoint.id}'s link is full or not connected") from None
        except zmq.ZMQError as exc:
            raise NotSent(f"worker {link.endpoint.id}: the send failed ({exc})") from None
        finally:
            self.replies.look_again(link)  # the send may have taken the edge a reply raised

    def _unsent(self, link: Link, rids: list[str], why: str) -> None:
        for rid in rids:
            entry = self._finish(link.endpoint.id, link, rid)
            if entry is not None and entry.future is not None and not entry.future.done():
                entry.future.set_exception(NotSent(why))

    def _abandon(self, link: Link, entry: Pending) -> None:
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
        self.deadlines.discard(entry)
        if entry.shared is not None:
            entry.shared.spoil()
        cancel = tensor_pb2.TensorHeader(
            kind=tensor_pb2.KIND_CANCEL, request_id=entry.rid, model=entry.ring[0]
        )
        with contextlib.suppress(zmq.ZMQError):  # best effort: the deadline drops it at the worker anyway
            link.sock.send_multipart([cancel.SerializeToString()], flags=zmq.NOBLOCK)
        self.replies.look_again(link)

    def _finish(self, worker_id: str, link: Link, rid: str) -> Pending | None:
        """Take request ``rid`` out of flight and out of the counts (None: not in flight)."""
        entry = link.pending.pop(rid, None)
        if entry is not None:
            self.deadlines.discard(entry)
            ring = self._rings[entry.ring]
            ring.per_worker[worker_id] -= 1
            ring.total -= 1
            self.loads[worker_id] -= 1
            self.nbytes -= entry.nbytes
        return entry

    def _fail_all(self, worker_id: str, link: Link, why: str) -> None:
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

    async def _sweep(self) -> None:
        """Forget abandoned requests a worker never answered (it lost them), so loads cannot creep up."""
        while True:
            await asyncio.sleep(_SWEEP_S)  # a periodic clean-up, not a synchronisation
            cutoff = time.monotonic() - self._abandon_s
            for worker_id, link in list(self._links.items()):
                for rid, entry in list(link.pending.items()):
                    if entry.future is None and entry.since < cutoff:
                        self._finish(worker_id, link, rid)
