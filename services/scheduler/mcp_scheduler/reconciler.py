"""The reconcile loop: desired state (specs, traffic) vs actual (replicas, workers) → idempotent actions.

Controller shape (informer → work queue → reconcile one model):
- The state mirror (``ClusterState``, the informer) tells, per applied batch, which models and workers
  changed (``Changes``). A model whose spec, traffic, routing, replicas, demand or breaker changed is
  queued; a worker that registered, left, was drained or stopped queues the models it holds and those not
  yet settled (pending or failing: they may fit now). Load reports that only move heartbeats or load
  figures, router stats, and the status documents this leader wrote itself queue nothing.
- The queue (``WorkQueue``) holds each model once. The loop takes ``batch_size`` models at a time, plans
  just them (``plan.plan(models=...)``, synchronous: a batch is a few milliseconds, and the loop yields
  between batches so the API and the watches keep being served), starts their actions and publishes their
  status (one etcd transaction per up to ``STATUS_TXN_OPS`` documents, and only those that changed).
- A failed action requeues its model once its backoff ends (rate-limited retry); a finished action
  requeues its model at once, and stays in flight for planning until the mirror shows what it wrote (the
  revision a worker answers with, or any change of the key; ``SETTLE_S`` when neither is known), so a
  watch that runs behind never makes a done load look like a missing copy. A tick every
  ``reconcile_interval_s`` queues what time alone changes (hot
  copies whose quiet period runs out, forced breaker levels expiring); every ``resync_interval_s``, on
  winning the election and after the mirror lists etcd afresh, every model is queued (a full pass, timed
  into ``on_full_pass``).

Invariants:
- Only the leader acts. Every batch plans from one ``ClusterView`` (``plan.plan``, pure) and executes the
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
- Actions are carried out by ``executor`` (fenced, idempotent; a canary rollback by compare-and-swap).
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
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from mcp_scheduler.actions import (
    Action,
    ForgetReplica,
    InFlight,
    InFlightActions,
    LoadReplica,
    ModelStatus,
    Plan,
    PublishRouting,
    ReplicaAction,
    RollbackCanary,
    UnloadReplica,
    kind_of,
)
from mcp_scheduler.config import SchedulerConfig
from mcp_scheduler.executor import Executor
from mcp_scheduler.hot_copies import HotCopies
from mcp_scheduler.plan import plan
from mcp_scheduler.state import Changes, ClusterState
from mcp_scheduler.view import ClusterView, ReplicaKey
from mcp_scheduler.worker_client import WorkerClients
from mcp_scheduler.workqueue import WorkQueue
from mcpcore.errors import MCPError
from mcpcore.fencing import Fence
from mcpcore.keys import Keyspace
from mcpcore.records.model import ModelStatusDoc, VersionCount
from mcpcore.store import Delete, Put, Store

__all__ = ["PERMANENT_LOAD_ERRORS", "STATUS_TXN_OPS", "Reconciler"]

#: Status documents written per etcd transaction (etcd's default limit is 128 operations).
STATUS_TXN_OPS = 64

#: Load failures that another try (or another worker, with the same repository) cannot mend.
PERMANENT_LOAD_ERRORS = frozenset(
    {"NOT_FOUND", "INVALID_ARGUMENT", "PERMISSION_DENIED", "DATA_LOSS", "UNIMPLEMENTED"}
)

log = logging.getLogger(__name__)


#: How long a done action whose written revision is unknown is assumed before the mirror shows its write.
SETTLE_S = 5.0
#: How long one batch may hold the event loop: batches are sized from the cost per model seen so far.
BATCH_BUDGET_S = 0.02
#: Placements (each a pass over every worker) in one batch; the batch's other models wait for the next.
PLACEMENTS_PER_BATCH = 16


@dataclass(frozen=True)
class _Settling:
    """A done action the mirror has yet to show: in flight for planning until ``etcd_key`` changes from
    ``before``, the mirror's revision reaches ``written``, or ``until`` passes."""

    etcd_key: str
    before: int
    written: int
    until: float
    kind: InFlight | None


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
        on_reconciled: Callable[[int, float], None] = lambda models, seconds: None,
        on_full_pass: Callable[[float], None] = lambda seconds: None,
        on_action: Callable[[str], None] = lambda kind: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._state = state
        self._store = store
        self._keys = keys
        self._executor = Executor(state, store, keys, clients, on_fenced=on_fenced)
        self._config = config
        self._is_leader = is_leader
        self._fence = fence
        self._on_error = on_error
        self._on_fenced = on_fenced
        self._on_reconciled = on_reconciled
        self._on_full_pass = on_full_pass
        self._on_action = on_action
        self._clock = clock
        self._hot = HotCopies(config.hot_quiet_period_s)
        self._running: dict[tuple[str, ...], asyncio.Task[None]] = {}
        self._kinds: dict[ReplicaKey, InFlight] = {}  # the replica actions among them, by kind
        # what the planner is told is in flight: those running, and those done the mirror does not show yet
        self._flight = InFlightActions()
        self._settling: dict[tuple[str, ...], _Settling] = {}  # done, not yet seen by the mirror
        self._backoff: dict[tuple[str, str, str], tuple[float, float]] = {}  # key -> (until, delay)
        self._errors: dict[str, tuple[str, str, float]] = {}  # model -> (code, message, at)
        self._retrying: dict[str, str] = {}  # model -> the last load failure that is retried elsewhere
        self._published: dict[str, tuple[bytes | None, int]] = {}  # model -> (doc written, revision)
        self._published_generation = 0
        self._slots = asyncio.Semaphore(config.max_parallel_actions)
        self._task: asyncio.Task[None] | None = None
        self.queue = WorkQueue()
        self._work = asyncio.Event()  # set when the queue gets work
        self._unsettled: set[str] = set()  # models last published pending or failing
        self._pass: tuple[float, set[str]] | None = None  # the full pass under way: (started, models left)
        self._last_resync = time.monotonic()
        self.reconciled = 0  # models reconciled (planned) while leading
        self._per_model_s = 0.0  # planning cost per model, recent (sizes the batches)
        self.last_plan: Plan | None = None
        state.listen(self._on_changes)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="reconcile")

    # -- the work queue --------------------------------------------------------------------------------
    def resync(self) -> None:
        """Queue every model (a full pass): on winning the election, after a re-list, and periodically."""
        models = self._state.view().models() | self._state.status_models()
        self.queue.add_all(sorted(models))
        self._pass = (time.monotonic(), set(models))
        self._last_resync = time.monotonic()
        self._work.set()

    def _on_changes(self, changes: Changes) -> None:
        if changes.reload:  # what the mirror shows now is all there is: nothing is waited for
            self._published, self._published_generation = {}, self._state.generation
            for key in self._settling:
                if key not in self._kinds:
                    self._flight.discard(key)  # type: ignore[arg-type]
            self._settling.clear()
            self.resync()
            return
        if changes.freed:  # room freed: the models waiting for room go first (before what freed it)
            self.queue.add_first(sorted(self._unsettled))
        self.queue.add_all(changes.models)
        for model in changes.statuses:
            written = self._published.get(model)
            if written is None or written[0] != self._state.raw(self._keys.model_status(model)):
                self.queue.add(model)  # not what this leader wrote: written again if it must be
        if changes.workers:
            view = self._state.view()
            for worker in changes.workers:
                self.queue.add_all(sorted({k[0] for k in view.by_worker.get(worker, ())}))
            self.queue.add_all(sorted(self._unsettled))
        if self.queue:
            self._work.set()

    def _batch(self) -> int:
        """Models to plan at once: as many as fit ``BATCH_BUDGET_S`` at the cost per model seen lately
        (placing a copy costs a pass over the workers; a settled model costs little)."""
        return max(1, min(self._config.batch_size, int(BATCH_BUDGET_S / max(self._per_model_s, 1e-6))))

    def _tick(self) -> None:
        self.queue.due(self._clock())
        self.queue.add_all(self._hot.timed())
        self.queue.add_all(self._state.expiring_breakers())
        if time.monotonic() - self._last_resync >= self._config.resync_interval_s:
            self.resync()

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._running.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self) -> None:
        next_tick = time.monotonic()
        while True:
            wait = next_tick - time.monotonic()
            due = self.queue.next_due()
            if due is not None:
                wait = min(wait, due - self._clock())
            if not self.queue and wait > 0:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that races a
                # wake-up, and stop() would then wait for this loop forever
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._work.wait()
            self._work.clear()
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + self._config.reconcile_interval_s
                self._tick()
            self.queue.due(self._clock())
            if not self._is_leader():
                self.queue.clear()  # the next leader starts with a full pass; so will this one
                self._pass = None
                continue
            try:
                while self.queue:
                    while self._state.applying:  # a re-list half applied: plan from all of it, not a blend
                        await self._state.idle.wait()
                    await self.reconcile_once(models=self.queue.take(self._batch()))
                    await asyncio.sleep(0)  # the API and the watches get the loop between batches
                    if time.monotonic() >= next_tick:  # time-driven work is not starved by a busy queue
                        next_tick = time.monotonic() + self._config.reconcile_interval_s
                        self._tick()
                    self.queue.due(self._clock())
            except asyncio.CancelledError:
                raise
            except Exception:
                self._on_error("reconcile")
                log.exception("reconcile batch failed; a full pass follows")
                await asyncio.sleep(self._config.retry_backoff_s)
                self.resync()

    async def reconcile_once(self, view: ClusterView | None = None, models: list[str] | None = None) -> Plan:
        """Plan ``models`` (default: all) from the current state and start every action not already
        running; publish their status."""
        fence = self._fence()  # raises once this scheduler does not lead: nothing of the round is done
        started = time.perf_counter()
        view = view or self._state.view()
        chosen = sorted(view.models() | self._state.status_models()) if models is None else models
        # read with the view, before any await: status says which spec revision it was planned from
        spec_revisions = {m: self._state.mod_revision(self._keys.model_spec(m)) for m in chosen}
        traffic_revisions = {m: self._state.mod_revision(self._keys.model_traffic(m)) for m in chosen}
        now = self._clock()
        settling = self._settling_now()
        backoff = {k: until for k, (until, _) in self._backoff.items() if until > now}
        extra = self._hot.update(view, chosen)
        result = plan(
            view,
            models=chosen,
            in_flight=self._flight,
            backoff=backoff,
            extra_copies=extra,
            placement_budget=PLACEMENTS_PER_BATCH if models is not None else None,
        )
        self.queue.add_all(result.deferred)  # planned in a later batch
        done = [m for m in chosen if m not in set(result.deferred)] if result.deferred else chosen
        self.reconciled += len(done)
        self.last_plan = result
        for action in result.actions:
            key = _key(action)
            if key not in self._running and key not in settling:
                if isinstance(action, ReplicaAction):
                    self._kinds[action.key] = kind_of(action)
                    self._flight.set(action.key, kind_of(action))
                # a rollback is guarded by the traffic revision it was planned from
                revision = traffic_revisions.get(action.model, 0) if isinstance(action, RollbackCanary) else 0
                self._running[key] = asyncio.create_task(self._run(key, action, view, revision, fence))
        took = time.perf_counter() - started
        per_model = took / max(1, len(done))
        # a costly batch sizes the next at once; cheap ones grow it back gradually
        self._per_model_s = (
            per_model if per_model > self._per_model_s else 0.8 * self._per_model_s + 0.2 * per_model
        )
        self._on_reconciled(len(done), took)
        revisions = {m: (spec_revisions.get(m, 0), traffic_revisions.get(m, 0)) for m in done}
        await self._publish_status(done, result.status, view, revisions, fence)
        if self._pass is not None:
            self._pass[1].difference_update(done)
            if not self._pass[1]:
                self._on_full_pass(time.monotonic() - self._pass[0])
                self._pass = None
        return result

    # -- actions ---------------------------------------------------------------------------------------
    async def _run(
        self, key: tuple[str, ...], action: Action, view: ClusterView, revision: int, fence: Fence
    ) -> None:
        etcd_key = self._etcd_key(action)
        before = self._state.mod_revision(etcd_key)
        written: int | None = None
        try:
            written = await self._run_guarded(action, view, revision, fence)
        finally:
            # Done, but until the mirror shows what it wrote the action stays in flight for planning:
            # a Load whose record the watch has not brought yet would look like a missing copy, and be
            # placed a second time elsewhere (then unloaded as an excess copy).
            if written is not None:
                # a known revision is waited for as long as the mirror takes; an unknown one for SETTLE_S
                until = math.inf if written else time.monotonic() + SETTLE_S
                self._settling[key] = _Settling(etcd_key, before, written, until, self._kinds.get(key))
                if not written:
                    self.queue.add_after(action.model, self._clock() + SETTLE_S)
            self._running.pop(key, None)
            self._kinds.pop(key, None)  # type: ignore[arg-type]
            if key not in self._settling:
                self._flight.discard(key)  # type: ignore[arg-type]
            if isinstance(action, UnloadReplica | ForgetReplica):
                # room freed (an eviction's, say): what waits for it is planned before the model it
                # came from, which would otherwise take it back
                self.queue.add_first(sorted(self._unsettled - {action.model}))
            self.queue.add(action.model)
            self._work.set()

    def _etcd_key(self, action: Action) -> str:
        if isinstance(action, PublishRouting):
            return self._keys.model_routing(action.model)
        if isinstance(action, RollbackCanary):
            return self._keys.model_traffic(action.model)
        return self._keys.replica(*action.key)

    def _settling_now(self) -> dict[tuple[str, ...], _Settling]:
        """Actions done whose writes the mirror does not show yet (dropping those it shows now)."""
        now = time.monotonic()
        for key, s in list(self._settling.items()):
            seen = self._state.mod_revision(s.etcd_key)
            # the mirror is past the write (whatever the key holds now came after it), or the key changed
            if seen != s.before or (s.written and self._state.revision >= s.written) or now >= s.until:
                del self._settling[key]
                if key not in self._kinds:
                    self._flight.discard(key)  # type: ignore[arg-type]
        return self._settling

    async def _run_guarded(
        self, action: Action, view: ClusterView, revision: int, fence: Fence
    ) -> int | None:
        """The action's written revision (0: unknown), or None when it failed."""
        async with self._slots:
            try:
                written = await self._executor.run(action, view, revision, fence)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(action, exc)
                return None
            else:
                self._on_action(kind_of(action) if isinstance(action, ReplicaAction) else "routing"
                                if isinstance(action, PublishRouting) else "rollback")  # fmt: skip
                if not isinstance(action, PublishRouting | RollbackCanary):
                    self._backoff.pop(action.key, None)
                if isinstance(action, LoadReplica):
                    self._errors.pop(action.model, None)
                    self._retrying.pop(action.model, None)
                return written

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
        self.queue.add_after(action.model, self._clock() + delay)  # decided again once its backoff ends
        if isinstance(action, LoadReplica):
            where = f"{action.model}/{action.version} on {action.worker}: {message}"
            if code in PERMANENT_LOAD_ERRORS:
                self._errors[action.model] = (code, where, self._clock())
            else:
                self._retrying[action.model] = f"{where}; retrying (elsewhere if another worker fits)"

    # -- status ----------------------------------------------------------------------------------------
    async def _publish_status(
        self,
        models: list[str],
        status: Mapping[str, ModelStatus],
        view: ClusterView,
        revisions: Mapping[str, tuple[int, int]],
        fence: Fence,
    ) -> None:
        if self._published_generation != self._state.generation:  # etcd listed afresh: trust only it
            self._published, self._published_generation = {}, self._state.generation
        writes: list[tuple[str, bytes | None]] = []
        for model in models:
            doc = self._status_doc(model, status.get(model), view)
            if doc is not None:
                # what the status was planned from: callers wait for their write to show here
                spec_revision, traffic_revision = revisions.get(model, (0, 0))
                doc = replace(doc, spec_revision=spec_revision, traffic_revision=traffic_revision)
                if doc.pending or doc.error or doc.retrying:
                    self._unsettled.add(model)
                else:
                    self._unsettled.discard(model)
            else:
                self._unsettled.discard(model)
            raw = None if doc is None else doc.to_json()
            if raw == self._state.raw(self._keys.model_status(model)):
                continue
            written = self._published.get(model)
            if written is not None and written[0] == raw and self._state.revision < written[1]:
                continue  # written already; the mirror has not caught up with it yet
            writes.append((model, raw))
        for i in range(0, len(writes), STATUS_TXN_OPS):
            chunk = writes[i : i + STATUS_TXN_OPS]
            keys = [self._keys.model_status(model) for model, _raw in chunk]
            ops = [
                Delete(k) if raw is None else Put(k, raw) for k, (_m, raw) in zip(keys, chunk, strict=True)
            ]
            try:
                result = await self._store.txn([fence.compare()], ops)
            except MCPError as exc:
                self._on_error("status")
                log.warning("could not publish the status of %d model(s): %s", len(chunk), exc.message)
                for model, _raw in chunk:
                    self.queue.add_after(model, self._clock() + self._config.retry_backoff_s)
                continue
            if not result.succeeded:
                self._on_fenced("status")
                log.warning("status not written: fenced, scheduler leader revision %d no longer leads",
                            fence.revision)  # fmt: skip
                return  # the rest would be too
            for model, raw in chunk:
                self._published[model] = (raw, result.revision)

    def _status_doc(self, model: str, status: ModelStatus | None, view: ClusterView) -> ModelStatusDoc | None:
        if status is None and model not in view.specs:
            return None
        doc = ModelStatusDoc(model)
        if status is not None:
            versions = {v: VersionCount(r, q) for v, (r, q) in status.versions.items()}
            doc = replace(
                doc,
                versions=versions,
                pending=status.pending,
                error=status.error,
                error_code=status.error_code,
            )
        failure = self._errors.get(model)
        # a load a worker refused for good is the cause: the placement error it leads to (the refused
        # copy's record still counts on that worker) says less
        if failure is not None and (not doc.error or doc.error_code == "RESOURCE_EXHAUSTED"):
            doc = replace(doc, error_code=failure[0], error=failure[1])
        elif doc.error_code == "RESOURCE_EXHAUSTED" and any(k[0] == model for k in self._running):
            # a load of it is still out: its answer (the worker's refusal, say) decides; not yet an error
            pending = f"{doc.pending or 'loading'}; meanwhile: {doc.error}"
            doc = replace(doc, pending=pending, error="", error_code="")
        rejected = self._state.rejections.get(self._keys.model_traffic(model))
        return replace(doc, retrying=self._retrying.get(model, ""), traffic_rejected=rejected or "")


def _key(action: Action) -> tuple[str, ...]:
    if isinstance(action, PublishRouting):
        return ("routing", action.model)
    if isinstance(action, RollbackCanary):
        return ("traffic", action.model)
    return action.key
