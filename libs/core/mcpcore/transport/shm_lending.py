"""Lending same-host workers this process's memory for a request's tensors (``shm_lease`` regions).

Invariants:
- Only when enabled (the forwarder's ``shared_memory``) and on Linux: a request of at least
  ``shm_lease.MIN_BYTES`` of tensors to a worker on its same-host endpoint whose record offers
  ``FEATURE_SHM`` lends it a region from this process's pool (a ``shm_lease.Lease``): its inputs go there,
  the worker writes outputs into it, and the reply's views name it (``Message.shared``). Any other request
  goes as frames; so does one for which no region can be had (descriptors, memory), with a warning.
- A worker that cannot take the region answers not started with ``FLAG_SHARED_MEMORY``: the request goes
  again at once with frames, with what is left of its time, as does every later one to that worker
  process (its incarnation); a new process of the same worker is offered memory again.
- A request abandoned before its reply (deadline, cancelled, link failed in flight) spoils its region
  (the forwarder's part), since the worker may still write into it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import numpy as np

from mcpapi.v2 import tensor_pb2
from mcpcore import wire
from mcpcore.errors import DeadlineExceeded
from mcpcore.transport import shm_lease
from mcpcore.transport.link import Link

__all__ = ["Lender"]

log = logging.getLogger(__name__)

_MAX_REFUSALS_KEPT = 4096  # workers remembered as refusing; the memory is offered again past this


class Lender:
    """The region pool of one forwarder, and the worker processes that refused its memory."""

    __slots__ = ("_max_region_bytes", "_no_shared", "enabled", "regions")

    def __init__(self, enabled: bool, limits: wire.Limits) -> None:
        self.enabled = enabled and shm_lease.AVAILABLE
        self.regions: shm_lease.RegionPool | None = None  # made at the first lease
        self._max_region_bytes = 2 * limits.max_message_bytes + (1 << 20)
        self._no_shared: dict[str, str] = {}  # worker -> the incarnation that refused this process's memory

    def lease(
        self, worker_id: str, link: Link | None, inputs: Mapping[str, np.ndarray]
    ) -> shm_lease.Lease | None:
        """A shared-memory region for this request to ``worker_id`` over ``link``, or None for frames."""
        if (
            link is None
            or link.down
            or link.draining  # refused unsent anyway: no region for it
            or wire.FEATURE_SHM not in link.endpoint.zmq_features
            or not link.address.startswith("ipc://")  # not on its same-host endpoint
            or self._no_shared.get(worker_id) == link.endpoint.incarnation
        ):
            return None
        try:
            if self.regions is None:
                self.regions = shm_lease.RegionPool(max_region_bytes=self._max_region_bytes)
            return self.regions.lease(list(inputs.values()))
        except OSError as exc:  # no region to be had (descriptors, memory): frames serve as well
            log.warning("no shared-memory region for a request to %s (%s); sending frames", worker_id, exc)
            return None

    async def unless_refused(
        self,
        attempt: Callable[..., Coroutine[Any, Any, wire.Message]],
        lease: shm_lease.Lease,
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
        if len(self._no_shared) > _MAX_REFUSALS_KEPT:
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

    def close(self) -> None:
        """Idle regions go now; those still lent when their outputs go."""
        if self.regions is not None:
            self.regions.close()
