"""A worker's graceful stop (SIGTERM), DESIGN.md section 7: hand over, take nothing new, finish, leave.

1. The record says ``draining``: the scheduler places the worker's replicas elsewhere and routers choose it
   only where no other copy can serve.
2. Handover: it keeps serving until each RUNNING replica it holds also runs on a live worker that is not
   draining (read from etcd, polled), bounded by the drain timeout; skipped when etcd cannot say, when no
   scheduler leads (nobody would place the copies: a whole cluster going down) or no other worker is up.
3. Every new request is answered "not started, draining" (routers send it elsewhere and stop choosing it);
   admitted work finishes; whatever is still queued then is answered "not started".
4. It waits until no request came for a moment (senders that had not seen the flag get their answers);
   the caller then revokes the lease and closes the sockets.

Routers retry only what provably did not start, so a drained worker fails no request and runs none twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from mcp_worker.batching import Dispatcher
from mcp_worker.models import ModelManager
from mcp_worker.registration import Registration
from mcp_worker.tensor_server.server import TensorServer
from mcpcore.errors import InvalidArgument, MCPError
from mcpcore.keys import Keyspace
from mcpcore.lifecycle import ReplicaState
from mcpcore.records import ReplicaRecord, WorkerRecord
from mcpcore.store import Store

__all__ = ["Drain"]

log = logging.getLogger(__name__)
_LINGER_S = 0.2  # close once no request came for this long (routers have seen the flag)
_LINGER_MAX_S = 2.0
_POLL_S = 0.2


class Drain:
    def __init__(
        self,
        *,
        worker_id: str,
        store: Store,
        keys: Keyspace,
        manager: ModelManager,
        tensors: TensorServer,
        dispatcher: Dispatcher,
        registration: Callable[[], Registration | None],
        timeout_s: float,
        etcd_timeout_s: float,
    ) -> None:
        self._id, self._store, self._keys = worker_id, store, keys
        self._manager, self._tensors, self._dispatcher = manager, tensors, dispatcher
        self._registration = registration
        self._timeout, self._etcd_timeout = timeout_s, etcd_timeout_s

    async def run(self, reason: str) -> None:
        deadline = time.monotonic() + self._timeout
        registration = self._registration()
        if registration is not None:
            try:
                async with asyncio.timeout(min(2.0, self._etcd_timeout)):
                    await registration.update_record()
                await self._hand_over(deadline)
            except (MCPError, TimeoutError) as exc:  # etcd away: the replies' draining flag still tells
                log.warning("drain of worker %s without etcd: %s", self._id, exc)
        self._tensors.drain()  # from now on: "not started, draining"
        if not await self._tensors.wait_idle(max(0.0, deadline - time.monotonic())):
            log.warning("drain: admitted work did not finish in time; answering the rest not started")
        await self._dispatcher.close()  # what is still queued: "not started"; running batches finish
        await self._tensors.wait_idle(self._timeout)
        await self._tensors.wait_quiet(_LINGER_S, _LINGER_MAX_S)
        log.info("worker %s drained (%s)", self._id, reason)

    async def _hand_over(self, deadline: float) -> None:
        if not self._running():
            return
        if await self._store.get(self._keys.leader("scheduler")) is None:
            log.info("drain of worker %s: no scheduler leads, so no handover", self._id)
            return
        others = (await self._store.get_prefix(self._keys.workers_prefix())).items
        if not any(
            (wk := self._keys.parse_worker_key(kv.key)) and not wk[1] and wk[0] != self._id
            and _serving(kv.key, kv.value)
            for kv in others
        ):  # fmt: skip
            log.info("drain of worker %s: no other worker to hand over to", self._id)
            return
        while (held := self._running()) and time.monotonic() < deadline:
            if await self._covered(held):
                return
            await asyncio.sleep(_POLL_S)  # the scheduler's load elsewhere: polled, bounded by the deadline

    def _running(self) -> list[tuple[str, str]]:
        running = ReplicaState.RUNNING
        return [(r.rid.model, r.rid.version) for r in self._manager.replicas() if r.state is running]

    async def _covered(self, held: list[tuple[str, str]]) -> bool:
        """Whether every (model, version) in ``held`` is RUNNING on some other live, not-draining worker."""
        serving: dict[str, bool] = {}
        for model, version in held:
            found = False
            for kv in (await self._store.get_prefix(self._keys.replicas_prefix(model, version))).items:
                rid = self._keys.parse_replica_key(kv.key)
                if rid is None or rid.worker == self._id or not _running(kv.key, kv.value):
                    continue
                if rid.worker not in serving:
                    record = await self._store.get(self._keys.worker(rid.worker))
                    serving[rid.worker] = record is not None and _serving(record.key, record.value)
                if serving[rid.worker]:
                    found = True
                    break
            if not found:
                return False
        return True


def _running(key: str, raw: bytes) -> bool:
    try:
        return ReplicaRecord.parse(key, raw).state is ReplicaState.RUNNING
    except InvalidArgument:
        return False


def _serving(key: str, raw: bytes) -> bool:
    """A registered worker that is not stopping (a record that does not parse serves nothing)."""
    try:
        return not WorkerRecord.parse(key, raw).draining
    except InvalidArgument:
        return False
