"""The reconcile loop: desired state (specs, traffic) vs actual (replicas, workers) → idempotent actions.

Invariants:
- Only the leader acts. Every round plans from one ``ClusterView`` (``plan.plan``, pure) and executes the
  actions concurrently, at most one at a time per replica; a replica action still running is passed to
  the planner as in flight with its kind, so no replica is ever loaded twice and a queued unload counts
  as a copy gone, not as one running.
- Every action is idempotent (a worker's Load of a loaded version, a Resume of a RUNNING one, a delete
  guarded by revision), so a new leader can replay whatever the last one was doing: all state is in etcd.
- A failed action backs off per replica (doubling to a maximum), is logged and counted. A load that failed
  for a reason retrying cannot mend (the model is not in the repository, its model.yaml is invalid, its
  key is wrong) is published as the model's error until an action on that model succeeds; one that
  another worker may not hit (the worker died or was full, a timeout) is published as ``retrying`` only:
  the planner places the copy elsewhere meanwhile (the failed worker is in backoff for it), and LoadModel
  keeps waiting. The loop itself never dies.
- A canary rollback (``RollbackCanary``) rewrites the traffic key by compare-and-swap on the mod revision
  the round was planned from: if an operator wrote the key meanwhile, the rollback is skipped and the
  next round decides again from what they wrote.
- The leader publishes each model's status (``/mcp/models/<m>/status``) when it differs from what etcd
  holds, so any scheduler instance, ``mcpctl`` or ``etcdctl`` can read why a model is pending or failing
  (and a status lost with etcd's data is written again).
- Fenced (``mcpcore.fencing``): a round takes the leader's token once; every etcd write of the round and
  its actions carries the token's compare, and every worker call carries the token, so a leader deposed
  mid-round (frozen past its lease, say) changes nothing once another leads. A fenced write is counted
  (``on_fenced``) and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from mcp_scheduler import docs
from mcp_scheduler.config import SchedulerConfig
from mcp_scheduler.hot import HotCopies
from mcp_scheduler.plan import (
    Action,
    ForgetReplica,
    InFlight,
    LoadReplica,
    ModelStatus,
    PauseReplica,
    Plan,
    PublishRouting,
    ReplicaAction,
    RollbackCanary,
    StartReplica,
    UnloadReplica,
    kind_of,
    plan,
)
from mcp_scheduler.state import ClusterState
from mcp_scheduler.view import ClusterView, ReplicaKey
from mcp_scheduler.worker_client import WorkerClients
from mcpcore.errors import FailedPrecondition, MCPError, NotFound
from mcpcore.fencing import Fence
from mcpcore.keys import Keyspace, ReplicaId
from mcpcore.lifecycle import ReplicaLifecycle, ReplicaState
from mcpcore.store import Compare, Delete, Put, Store

__all__ = ["PERMANENT_LOAD_ERRORS", "Reconciler"]

#: Load failures that another try (or another worker, with the same repository) cannot mend.
PERMANENT_LOAD_ERRORS = frozenset(
    {"NOT_FOUND", "INVALID_ARGUMENT", "PERMISSION_DENIED", "DATA_LOSS", "UNIMPLEMENTED"}
)

log = logging.getLogger(__name__)


class Reconciler:
    def __init__(
        self,
        state: ClusterState,
        store: Store,
        keys: Keyspace,
        clients: WorkerClients,
        config: SchedulerConfig,
        *,
        is_leader: Callable[[], bool],
        fence: Callable[[], Fence],
        on_error: Callable[[str], None] = lambda loop: None,
        on_fenced: Callable[[str], None] = lambda what: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._state = state
        self._store = store
        self._keys = keys
        self._lifecycle = ReplicaLifecycle(store, keys)
        self._clients = clients
        self._config = config
        self._is_leader = is_leader
        self._fence = fence
        self._on_error = on_error
        self._on_fenced = on_fenced
        self._clock = clock
        self._hot = HotCopies(config.hot_quiet_period_s)
        self._running: dict[tuple[str, ...], asyncio.Task[None]] = {}
        self._kinds: dict[ReplicaKey, InFlight] = {}  # the replica actions among them, by kind
        self._backoff: dict[tuple[str, str, str], tuple[float, float]] = {}  # key -> (until, delay)
        self._errors: dict[str, tuple[str, str, float]] = {}  # model -> (code, message, at)
        self._retrying: dict[str, str] = {}  # model -> the last load failure that is retried elsewhere
        self._published: dict[str, tuple[bytes | None, int]] = {}  # model -> (doc written, revision)
        self._published_generation = 0
        self._slots = asyncio.Semaphore(config.max_parallel_actions)
        self._task: asyncio.Task[None] | None = None
        self.rounds = 0
        self.last_plan: Plan | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="reconcile")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._running.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that races a wake-up,
            # and stop() would then wait for this loop forever
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._config.reconcile_interval_s):
                    await self._state.changed.wait()
            self._state.changed.clear()
            if not self._is_leader():
                continue
            try:
                await self.reconcile_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                self._on_error("reconcile")
                log.exception("reconcile round failed; the next round starts on the next change")

    async def reconcile_once(self, view: ClusterView | None = None) -> Plan:
        """Plan from the current state and start every action not already running."""
        fence = self._fence()  # raises once this scheduler does not lead: nothing of the round is done
        view = view or self._state.view()
        # read with the view, before any await: status says which spec revision it was planned from
        spec_revisions = {m: self._state.mod_revision(self._keys.model_spec(m)) for m in view.specs}
        traffic_revisions = {m: self._state.mod_revision(self._keys.model_traffic(m)) for m in view.traffic}
        now = self._clock()
        in_flight = dict(self._kinds)  # replica actions under way, by kind
        backoff = {k: until for k, (until, _) in self._backoff.items() if until > now}
        result = plan(view, in_flight=in_flight, backoff=backoff, extra_copies=self._hot.update(view))
        self.rounds += 1
        self.last_plan = result
        for action in result.actions:
            key = _key(action)
            if key not in self._running:
                if isinstance(action, ReplicaAction):
                    self._kinds[action.key] = kind_of(action)
                # a rollback is guarded by the traffic revision it was planned from
                revision = traffic_revisions.get(action.model, 0) if isinstance(action, RollbackCanary) else 0
                self._running[key] = asyncio.create_task(self._run(key, action, view, revision, fence))
        await self._publish_status(result.status, view, spec_revisions, fence)
        return result

    # -- actions ---------------------------------------------------------------------------------------
    async def _run(
        self, key: tuple[str, ...], action: Action, view: ClusterView, revision: int, fence: Fence
    ) -> None:
        try:
            await self._run_guarded(action, view, revision, fence)
        finally:
            # no longer in flight *before* the next round is woken, or that round would skip this
            # replica and nothing would wake another until the periodic tick
            self._running.pop(key, None)
            self._kinds.pop(key, None)  # type: ignore[arg-type]
            self._state.changed.set()

    async def _run_guarded(self, action: Action, view: ClusterView, revision: int, fence: Fence) -> None:
        async with self._slots:
            try:
                if isinstance(action, RollbackCanary):
                    await self._rollback(action, revision, fence)
                else:
                    await self._execute(action, view, fence)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(action, exc)
            else:
                if not isinstance(action, PublishRouting | RollbackCanary):
                    self._backoff.pop(action.key, None)
                if isinstance(action, LoadReplica):
                    self._errors.pop(action.model, None)
                    self._retrying.pop(action.model, None)

    async def _write(self, fence: Fence, op: Put | Delete, what: str) -> int:
        """One etcd write as the leader: the revision written, or 0 (counted) once another leads."""
        result = await self._store.txn([fence.compare()], [op])
        if not result.succeeded:
            self._on_fenced(what)
            log.warning("%s not written: fenced, scheduler leader revision %d no longer leads",
                        what, fence.revision)  # fmt: skip
            return 0
        return result.revision

    async def _execute(self, action: Action, view: ClusterView, fence: Fence) -> None:
        if isinstance(action, PublishRouting):
            key = self._keys.model_routing(action.model)
            raw = None if action.routing is None else docs.routing_to_json(action.routing)
            if await self._write(fence, Delete(key) if raw is None else Put(key, raw), "routing"):
                log.info("routing of %s now %s", action.model, action.routing)
            return
        if isinstance(action, ForgetReplica):
            await self._forget(action, view, fence)
            return
        calls = fence.metadata()
        worker = view.workers.get(action.worker)
        if worker is None:
            raise NotFound(f"worker {action.worker} is gone")
        if isinstance(action, LoadReplica):
            spec = view.specs[action.model]
            log.info("loading %s/%s on %s (%s)", action.model, action.version, action.worker, action.reason)
            await self._clients.load(
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
            await self._clients.resume(worker.grpc, action.model, action.version, metadata=calls)
        elif isinstance(action, PauseReplica):
            await self._clients.pause(worker.grpc, action.model, action.version, metadata=calls)
        elif isinstance(action, UnloadReplica):
            log.info("unloading %s/%s on %s (%s)", action.model, action.version, action.worker, action.reason)
            with contextlib.suppress(NotFound):  # not held there: the stale record is forgotten next round
                await self._clients.unload(worker.grpc, action.model, action.version, metadata=calls)

    async def _rollback(self, action: RollbackCanary, revision: int, fence: Fence) -> None:
        key = self._keys.model_traffic(action.model)
        result = await self._store.txn(
            [Compare(key, revision), fence.compare()], [Put(key, docs.traffic_to_json(action.traffic))]
        )
        if not result.succeeded:
            log.info("canary rollback of %s skipped: its traffic changed meanwhile, or this scheduler "
                     "no longer leads", action.model)  # fmt: skip
            return
        log.warning("rolled back the canary of %s: %s", action.model, action.reason)

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

    def _failed(self, action: Action, exc: BaseException) -> None:
        self._on_error("action")
        message = exc.message if isinstance(exc, MCPError) else f"{type(exc).__name__}: {exc}"
        code = exc.code.name if isinstance(exc, MCPError) else "INTERNAL"
        log.warning("%s failed: %s", action, message)
        if isinstance(action, PublishRouting | RollbackCanary):
            return
        key = action.key
        _, delay = self._backoff.get(key, (0.0, self._config.retry_backoff_s / 2))
        delay = min(delay * 2, self._config.retry_backoff_max_s)
        self._backoff[key] = (self._clock() + delay, delay)
        if isinstance(action, LoadReplica):
            where = f"{action.model}/{action.version} on {action.worker}: {message}"
            if code in PERMANENT_LOAD_ERRORS:
                self._errors[action.model] = (code, where, self._clock())
            else:
                self._retrying[action.model] = f"{where}; retrying (elsewhere if another worker fits)"

    # -- status ----------------------------------------------------------------------------------------
    async def _publish_status(
        self,
        status: Mapping[str, ModelStatus],
        view: ClusterView,
        spec_revisions: Mapping[str, int],
        fence: Fence,
    ) -> None:
        docs_now = {}
        if self._published_generation != self._state.generation:  # etcd listed afresh: trust only it
            self._published, self._published_generation = {}, self._state.generation
        for model in sorted(set(status) | self._state.status_models()):
            doc = self._status_doc(model, status.get(model), view)
            if doc is not None:
                doc["spec_revision"] = spec_revisions.get(model, 0)
            docs_now[model] = (
                None if doc is None else json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
            )
        for model, raw in docs_now.items():
            key = self._keys.model_status(model)
            if raw == self._state.raw(key):
                continue
            written = self._published.get(model)
            if written is not None and written[0] == raw and self._state.revision < written[1]:
                continue  # written already; the mirror has not caught up with it yet
            try:
                revision = await self._write(fence, Delete(key) if raw is None else Put(key, raw), "status")
                if not revision:
                    return  # fenced: the rest would be too
                self._published[model] = (raw, revision)
            except MCPError as exc:
                self._on_error("status")
                log.warning("could not publish the status of %s: %s", model, exc.message)

    def _status_doc(self, model: str, status: ModelStatus | None, view: ClusterView) -> dict[str, Any] | None:
        if status is None and model not in view.specs:
            return None
        doc: dict[str, Any] = {"model": model, "versions": {}, "pending": "", "error": "", "error_code": ""}
        if status is not None:
            doc["versions"] = {v: {"running": r, "required": q} for v, (r, q) in status.versions.items()}
            doc.update(pending=status.pending, error=status.error, error_code=status.error_code)
        failure = self._errors.get(model)
        if failure is not None and not doc["error"]:
            doc.update(error_code=failure[0], error=failure[1])
        if model in self._retrying:
            doc["retrying"] = self._retrying[model]
        rejected = self._state.rejections.get(self._keys.model_traffic(model))
        if rejected:
            doc["traffic_rejected"] = rejected
        return doc


def _key(action: Action) -> tuple[str, ...]:
    if isinstance(action, PublishRouting):
        return ("routing", action.model)
    if isinstance(action, RollbackCanary):
        return ("traffic", action.model)
    return action.key
