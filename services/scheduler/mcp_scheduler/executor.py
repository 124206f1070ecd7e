"""One planned action carried out, as the scheduler leader: a worker call (load, resume, pause, unload),
a routing document, a canary rollback, or a stale replica record forgotten.

Invariants:
- Fenced (``mcpcore.fencing``): every etcd write carries the leader token's compare and every worker call
  its metadata, so a deposed leader changes nothing; a fenced write is counted (``on_fenced``) and dropped.
- Idempotent: a Load of a loaded version, a Resume of a RUNNING one, a delete guarded by revision; a
  record that changed since the round was planned is left for the next round to decide again.
- A canary rollback rewrites the traffic key by compare-and-swap on the revision the round was planned
  from: an operator's write meanwhile wins.
- A replica forgotten because its worker is gone goes only while the worker is still gone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from mcp_scheduler.actions import (
    Action,
    ForgetReplica,
    LoadReplica,
    PauseReplica,
    PublishRouting,
    RollbackCanary,
    StartReplica,
)
from mcp_scheduler.state import ClusterState
from mcp_scheduler.view import ClusterView
from mcp_scheduler.worker_client import WorkerClients
from mcpcore.errors import FailedPrecondition, NotFound
from mcpcore.fencing import Fence
from mcpcore.keys import Keyspace, ReplicaId
from mcpcore.lifecycle import ReplicaLifecycle, ReplicaState
from mcpcore.store import Compare, Delete, Put, Store

__all__ = ["Executor"]

log = logging.getLogger(__name__)


class Executor:
    def __init__(
        self,
        state: ClusterState,
        store: Store,
        keys: Keyspace,
        clients: WorkerClients,
        *,
        on_fenced: Callable[[str], None] = lambda what: None,
    ) -> None:
        self._state = state
        self._store = store
        self._keys = keys
        self._lifecycle = ReplicaLifecycle(store, keys)
        self._clients = clients
        self._on_fenced = on_fenced

    async def run(self, action: Action, view: ClusterView, revision: int, fence: Fence) -> int:
        """Carry ``action`` out (planned from etcd ``revision``); the etcd revision of what it wrote, where
        known (else 0). Raises what the worker or etcd answered."""
        if isinstance(action, RollbackCanary):
            return await self._rollback(action, revision, fence)
        return await self._execute(action, view, fence)

    async def _write(self, fence: Fence, op: Put | Delete, what: str) -> int:
        """One etcd write as the leader: the revision written, or 0 (counted) once another leads."""
        result = await self._store.txn([fence.compare()], [op])
        if not result.succeeded:
            self._on_fenced(what)
            log.warning("%s not written: fenced, scheduler leader revision %d no longer leads",
                        what, fence.revision)  # fmt: skip
            return 0
        return result.revision

    async def _execute(self, action: Action, view: ClusterView, fence: Fence) -> int:
        """Carry ``action`` out; the etcd revision of what it wrote, where known (else 0)."""
        if isinstance(action, PublishRouting):
            key = self._keys.model_routing(action.model)
            raw = None if action.routing is None else action.routing.to_json()
            if written := await self._write(fence, Delete(key) if raw is None else Put(key, raw), "routing"):
                log.info("routing of %s now %s", action.model, action.routing)
            return written
        if isinstance(action, ForgetReplica):
            await self._forget(action, view, fence)
            return 0
        calls = fence.metadata()
        worker = view.workers.get(action.worker)
        if worker is None:
            raise NotFound(f"worker {action.worker} is gone")
        if isinstance(action, LoadReplica):
            spec = self._state.view().specs.get(action.model)
            if spec is None:
                return 0  # unloaded before its load began: nothing to do
            log.info("loading %s/%s on %s (%s)", action.model, action.version, action.worker, action.reason)
            response: Any = await self._clients.load(
                worker.grpc,
                action.model,
                action.version,
                memory_bytes=spec.memory_bytes,
                max_batch_size=spec.max_batch_size,
                max_queue_delay_us=spec.max_queue_delay_us,
                priority=spec.priority,
                latency_sensitivity=spec.latency_sensitivity,
                metadata=calls,
            )
        elif isinstance(action, StartReplica):
            response = await self._clients.resume(worker.grpc, action.model, action.version, metadata=calls)
        elif isinstance(action, PauseReplica):
            response = await self._clients.pause(worker.grpc, action.model, action.version, metadata=calls)
        else:
            log.info("unloading %s/%s on %s (%s)", action.model, action.version, action.worker, action.reason)
            try:
                response = await self._clients.unload(
                    worker.grpc, action.model, action.version, metadata=calls
                )
            except NotFound:  # not held there: the stale record is forgotten next round
                return 0
        return int(response.replica.revision)  # the worker wrote its record before it answered

    async def _rollback(self, action: RollbackCanary, revision: int, fence: Fence) -> int:
        key = self._keys.model_traffic(action.model)
        result = await self._store.txn(
            [Compare(key, revision), fence.compare()], [Put(key, action.traffic.to_json())]
        )
        if not result.succeeded:
            log.info("canary rollback of %s skipped: its traffic changed meanwhile, or this scheduler "
                     "no longer leads", action.model)  # fmt: skip
            return 0
        log.warning("rolled back the canary of %s: %s", action.model, action.reason)
        return result.revision

    async def _forget(self, action: ForgetReplica, view: ClusterView, fence: Fence) -> None:
        rid = ReplicaId(*action.key)
        revision = action.revision
        record = await self._lifecycle.get(rid)
        if record is None or record.revision != revision:
            return  # changed meanwhile: the next round decides again
        # A replica forgotten because its worker is gone goes only while the worker is still gone: one
        # that registered again meanwhile (etcd was away) keeps what it holds.
        guard = [fence.compare()]
        if rid.worker not in view.workers:
            guard.append(Compare(self._keys.worker(rid.worker), 0))
        try:
            if record.state not in (ReplicaState.ERROR, ReplicaState.IDLE):
                revision = (
                    await self._lifecycle.transition(
                        rid, ReplicaState.ERROR, reason=action.reason, expected_revision=revision, guard=guard
                    )
                ).revision
            log.info("forgetting replica %s: %s", rid, action.reason)
            await self._lifecycle.remove(rid, expected_revision=revision, guard=guard)
        except FailedPrecondition:
            pass  # changed meanwhile, the worker is back, or fenced: the next round decides again
