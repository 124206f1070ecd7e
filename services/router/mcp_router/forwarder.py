"""ZeroMQ forwarding: one DEALER per worker, many requests in flight, replies matched by request id.

Invariants:
- A request is in flight on exactly one worker; ``in_flight(worker)`` is what bounded-load routing and
  backpressure read. Past ``max_in_flight`` per worker a send is refused ``RESOURCE_EXHAUSTED``.
- A worker that disconnects (socket monitor) or leaves the routing table fails every request pending on
  it at once with a *retryable* ``Unavailable``: the worker never answered, so the caller may send the
  request to another worker. A reply that arrives for an unknown id (timed out, cancelled) is dropped.
- Tensors go out and come back without copies (``copy=False``, ``np.frombuffer`` views of reply frames).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

import numpy as np
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from mcp_router.snapshot import WorkerEndpoint
from mcpapi.v2 import tensor_pb2
from mcpcore import wire
from mcpcore.errors import DeadlineExceeded, ResourceExhausted, Unavailable

__all__ = ["Forwarder", "WorkerGone"]

log = logging.getLogger(__name__)


class WorkerGone(Unavailable):
    """The worker went away before it answered: safe to retry elsewhere."""


class _Link:
    def __init__(self, ctx: zmq.asyncio.Context, endpoint: WorkerEndpoint, limits: wire.Limits) -> None:
        self.endpoint = endpoint
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, limits.max_message_bytes + limits.max_header_bytes)
        if endpoint.curve_public_key:
            public, secret = zmq.curve_keypair()
            self.sock.curve_serverkey = endpoint.curve_public_key.encode()
            self.sock.curve_publickey, self.sock.curve_secretkey = public, secret
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.sock.connect(endpoint.zmq)
        self.pending: dict[str, asyncio.Future[wire.Message]] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.down = False  # disconnected and not reconnected yet: refuse at once, so callers go elsewhere

    def fail_all(self, why: str) -> None:
        for future in self.pending.values():
            if not future.done():
                future.set_exception(WorkerGone(f"worker {self.endpoint.id} {why} before answering"))
        self.pending.clear()

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.fail_all("left the routing table")
        with contextlib.suppress(zmq.ZMQError):
            self.sock.disable_monitor()
        self.monitor.close(linger=0)
        self.sock.close(linger=0)


class Forwarder:
    def __init__(
        self,
        *,
        max_in_flight: int = 256,
        limits: wire.Limits = wire.DEFAULT_LIMITS,
        on_error: Callable[[str], None] = lambda loop: None,
    ) -> None:
        self._ctx = zmq.asyncio.Context()
        self._links: dict[str, _Link] = {}
        self._max_in_flight = max_in_flight
        self._limits = limits
        self._on_error = on_error

    # -- membership ------------------------------------------------------------------------------------
    def sync(self, workers: Mapping[str, WorkerEndpoint]) -> None:
        """Open links to new workers, close links to workers gone or moved (called on every table swap)."""
        for worker_id, link in list(self._links.items()):
            if workers.get(worker_id) != link.endpoint:
                link.close()
                del self._links[worker_id]
        for worker_id, endpoint in workers.items():
            if worker_id not in self._links:
                link = _Link(self._ctx, endpoint, self._limits)
                link.tasks = [
                    asyncio.create_task(self._receive(link), name=f"zmq-recv-{worker_id}"),
                    asyncio.create_task(self._watch(link), name=f"zmq-monitor-{worker_id}"),
                ]
                self._links[worker_id] = link

    def is_down(self, worker_id: str) -> bool:
        link = self._links.get(worker_id)
        return link is None or link.down

    def in_flight(self, worker_id: str) -> int:
        link = self._links.get(worker_id)
        return len(link.pending) if link else 0

    def loads(self, workers: list[str] | tuple[str, ...]) -> dict[str, int]:
        return {w: self.in_flight(w) for w in workers}

    async def close(self) -> None:
        for link in self._links.values():
            link.close()
        tasks = [t for link in self._links.values() for t in link.tasks]
        await asyncio.gather(*tasks, return_exceptions=True)
        self._links.clear()
        self._ctx.term()

    # -- requests --------------------------------------------------------------------------------------
    async def send(
        self,
        worker_id: str,
        header: tensor_pb2.TensorHeader,
        inputs: Mapping[str, np.ndarray],
        *,
        timeout_s: float,
    ) -> wire.Message:
        link = self._links.get(worker_id)
        if link is None or link.down:
            raise WorkerGone(f"worker {worker_id} is not connected")
        if len(link.pending) >= self._max_in_flight:
            raise ResourceExhausted(
                f"worker {worker_id} has {len(link.pending)} requests in flight, the limit; retry later"
            )
        rid = header.request_id
        if rid in link.pending:
            raise ResourceExhausted(f"request id {rid} is already in flight on worker {worker_id}")
        future: asyncio.Future[wire.Message] = asyncio.get_running_loop().create_future()
        link.pending[rid] = future
        try:
            await link.sock.send_multipart(wire.encode(header, inputs), copy=False)
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError:
            raise DeadlineExceeded(
                f"worker {worker_id} did not answer request {rid} within {timeout_s * 1000:.0f} ms"
            ) from None
        finally:
            link.pending.pop(rid, None)

    async def _receive(self, link: _Link) -> None:
        while True:
            try:
                frames = await link.sock.recv_multipart(copy=False)
                msg = wire.decode(frames, self._limits)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._on_error("zmq_reply")
                log.warning("bad reply from worker %s: %s", link.endpoint.id, exc)
                continue
            future = link.pending.get(msg.header.request_id)
            if future is not None and not future.done():
                future.set_result(msg)

    async def _watch(self, link: _Link) -> None:
        while True:
            try:
                event = parse_monitor_message(await link.monitor.recv_multipart())
            except asyncio.CancelledError:
                raise
            except Exception:
                return  # the monitor closed with its link
            if event["event"] == zmq.EVENT_DISCONNECTED:
                link.down = True
                link.fail_all("disconnected")
            elif event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                link.down = False
