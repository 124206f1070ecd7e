"""The scheduler's mirror of etcd: one list-then-watch over the mesh's prefix, turned into ``ClusterView``s.

Invariants:
- The mirror is a dict of raw values by key, updated in revision order from one watch. Each applied batch
  is parsed once, as it arrives, into indexes (workers, specs, traffic, routing, replicas by key, by model
  and by worker, demand, breakers); ``view()`` hands them out without copying, so a view costs O(1) and
  reading one model costs what that model has. A value that does not parse is absent from the indexes.
- A large batch (the first list, a re-list after compaction or a restore) is applied ``apply_chunk`` keys
  per loop turn, never all at once; ``applying`` is true meanwhile (the reconciler waits for ``idle``:
  the indexes then hold part old, part new state) and the re-list is reported with its last chunk.
- Listeners (``listen``) hear, per applied batch, which models changed (their spec, traffic, routing,
  replicas, demand or breaker), which models' status documents changed, which workers changed in a way
  the planner reads (record, drain, stop; a load report that only moves the heartbeat, load figures or
  the room measured on its GPU is no change: the next planning reads it), and whether the mirror listed
  afresh. Router stats and other keys concern no model.
- Every value is read through its ``mcpcore.records`` type. An operator-written document that does not
  parse (spec, traffic, breaker) gets the mesh's one rule (``records.OperatorDocs``): logged, counted
  (``mcp_config_rejected_total``), the last good value stays in force, and the rejection is kept so status
  and ``mcpctl status`` can say why a write had no effect. A process-written document that does not parse
  is absent from the indexes.
- If the watch history was compacted, the mirror is rebuilt from a fresh list; a watch error backs off and
  resumes from the last revision applied (the store resumes across reconnects by itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from mcp_scheduler.view import ClusterView, ReplicaInfo, ReplicaKey, WorkerInfo
from mcpcore.errors import InvalidArgument
from mcpcore.keys import Keyspace
from mcpcore.mirror import PrefixMirror
from mcpcore.records import (
    BreakerDoc,
    Demand,
    LoadReport,
    ModelSpecDoc,
    ModelStatusDoc,
    ReplicaRecord,
    TrafficDoc,
    WorkerRecord,
    published_operator_docs,
)
from mcpcore.store import EventType, Store

__all__ = ["Changes", "ClusterState", "Subscription", "replica_info", "worker_info"]

log = logging.getLogger(__name__)


class Subscription:
    """A bounded queue of applied events; ``overflowed`` once its reader fell too far behind."""

    def __init__(self, maxsize: int = 10_000) -> None:
        self.queue: asyncio.Queue[tuple[EventType, str, bytes, int] | None] = asyncio.Queue(maxsize + 1)
        self._room = maxsize
        self.overflowed = False

    def offer(self, event: tuple[EventType, str, bytes, int]) -> bool:
        if self.queue.qsize() >= self._room:
            self.overflowed = True
            self.queue.put_nowait(None)  # wakes the reader, which then reports the overflow
            return False
        self.queue.put_nowait(event)
        return True


@dataclass
class Changes:
    """What one applied batch changed, for the reconciler's work queue."""

    models: set[str] = field(default_factory=set)  # spec, traffic, routing, replicas, demand or breaker
    statuses: set[str] = field(default_factory=set)  # the model's published status document
    workers: set[str] = field(default_factory=set)  # registered, gone, or changed as the planner sees it
    freed: set[str] = field(default_factory=set)  # workers where a replica record went away: room freed
    reload: bool = False  # the mirror listed etcd afresh: everything may have changed


class ClusterState:
    def __init__(
        self,
        store: Store,
        keys: Keyspace,
        *,
        on_rejected: Callable[[str], None] = lambda key: None,
        on_error: Callable[[str], None] = lambda loop: None,
        on_applied: Callable[[float], None] = lambda seconds: None,
        clock: Callable[[], float] = time.time,
        apply_chunk: int = 200,
        instance: str = "scheduler",
    ) -> None:
        self._keys = keys
        self.operator_docs, self.rejections_publisher = published_operator_docs(
            "scheduler",
            instance,
            store,
            keys.rejected("scheduler", instance),
            on_rejected=on_rejected,
            on_error=on_error,
            clock=clock,
        )
        self._on_error = on_error
        self._clock = clock
        self.mirror = PrefixMirror(
            store, keys.prefix + "/", on_change=self._changed, on_error=on_error, on_applied=on_applied,
            name="scheduler-state",
        )  # fmt: skip
        # the indexes a view hands out (see the module docstring)
        self._workers: dict[str, WorkerInfo] = {}
        self._specs: dict[str, ModelSpecDoc] = {}
        self._traffic: dict[str, TrafficDoc] = {}
        self._routing: dict[str, TrafficDoc] = {}
        self._replicas: dict[ReplicaKey, ReplicaInfo] = {}
        self._by_model: dict[str, set[ReplicaKey]] = {}
        self._by_worker: dict[str, set[ReplicaKey]] = {}
        self._demand: dict[str, dict[str, Demand]] = {}
        self._demand_view: dict[str, tuple[Demand, ...]] = {}
        self._breakers: dict[str, BreakerDoc] = {}
        self._statuses: set[str] = set()
        self._used: dict[str, int] = {}  # worker -> ClusterView.used_bytes, cleared as replicas/specs change
        self._status_docs: dict[str, tuple[int, ModelStatusDoc | None]] = {}  # model -> (revision, doc)
        self._drains: set[str] = set()
        self._generation = 0
        self._listeners: list[Callable[[Changes], None]] = []
        self._apply_chunk = apply_chunk
        self._pending: dict[str, None] = {}  # keys changed, not yet applied, in revision order
        self._pending_reload = False
        self._applier: asyncio.Task[None] | None = None
        self.idle = asyncio.Event()  # set while nothing is left to apply
        self.idle.set()
        self._waiters: set[asyncio.Future[None]] = set()
        self._subscribers: set[Subscription] = set()

    # -- change notification ---------------------------------------------------------------------------
    async def wait_change(self, timeout_s: float) -> None:
        """Return after the next applied change, or after ``timeout_s``."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await waiter
        finally:
            self._waiters.discard(waiter)

    def subscribe(self) -> Subscription:
        """Every applied event from now on (for WatchModels); ``unsubscribe`` when done."""
        sub = Subscription()
        self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscribers.discard(sub)

    def listen(self, listener: Callable[[Changes], None]) -> None:
        """Call ``listener`` after each applied batch with what it changed (it must not block)."""
        self._listeners.append(listener)

    def _notify(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        """List etcd and apply all of it (then watch in the background)."""
        await self.mirror.start()
        await self.idle.wait()
        self.rejections_publisher.start()

    @property
    def applying(self) -> bool:
        """A large batch (a re-list) is being applied: the indexes hold part old, part new state."""
        return not self.idle.is_set()

    async def stop(self) -> None:
        await self.rejections_publisher.stop()
        await self.mirror.stop()
        if self._applier is not None:
            self._applier.cancel()
            await asyncio.gather(self._applier, return_exceptions=True)

    @property
    def synced(self) -> asyncio.Event:
        return self.mirror.synced

    @property
    def revision(self) -> int:
        return self.mirror.revision

    @property
    def generation(self) -> int:
        """How many times the mirror listed etcd afresh (a reload after compaction or data loss)."""
        return self.mirror.generation

    @property
    def _raw(self) -> dict[str, bytes]:
        return self.mirror.values

    @property
    def _revisions(self) -> dict[str, int]:
        return self.mirror.revisions

    def _changed(self, keys: set[str]) -> None:
        """Apply a batch: at once when small (a watch batch), else ``apply_chunk`` keys per loop turn
        (a list of 40,000 keys, at start or after a re-list, would hold the loop for a second)."""
        for key in sorted(keys, key=lambda k: self._revisions.get(k, self.revision)):
            self._pending.pop(key, None)  # changed again: applied in its new place, in revision order
            self._pending[key] = None
        self._pending_reload |= self.mirror.generation != self._generation
        self._generation = self.mirror.generation
        if self._applier is not None:
            return  # the applier running takes these too, in order
        if len(self._pending) <= self._apply_chunk:
            self._apply_pending()
            return
        self.idle.clear()
        self._applier = asyncio.get_running_loop().create_task(
            self._apply_all(), name="scheduler-state-apply"
        )

    async def _apply_all(self) -> None:
        try:
            while self._pending:
                try:
                    self._apply_pending()
                except Exception:  # as the mirror does for a batch applied at once: log, count, go on
                    self._on_error("scheduler-state_apply")
                    log.exception("applying changed keys failed; the state goes on")
                await asyncio.sleep(0)
        finally:
            self._applier = None
            self.idle.set()

    def _apply_pending(self) -> None:
        keys = []
        for key in self._pending:
            if len(keys) == self._apply_chunk:
                break
            keys.append(key)
        for key in keys:
            del self._pending[key]
        changes = Changes()
        for key in keys:
            value = self._raw.get(key)
            self._check(key, value)
            if value is None:
                self._publish(EventType.DELETE, key, b"", self.revision)
            else:
                self._publish(EventType.PUT, key, value, self._revisions[key])
            self._index(key, changes)
        # a re-list is reported with its last chunk, once the indexes hold all of it
        if self._pending_reload and not self._pending:
            changes.reload, self._pending_reload = True, False
        for listener in self._listeners:
            listener(changes)
        self._notify()

    # -- indexes ---------------------------------------------------------------------------------------
    def _index(self, key: str, changes: Changes) -> None:
        """Bring the indexes up to date with ``key``'s current value (absent, or not parsing: removed)."""
        k = self._keys
        raw = self._raw.get(key)
        try:
            if (wk := k.parse_worker_key(key)) is not None:
                self._index_worker(wk[0], changes)
            elif (dw := k.parse_drain_key(key)) is not None:
                (self._drains.add if raw is not None else self._drains.discard)(dw)
                self._index_worker(dw, changes)
            elif (mk := k.parse_model_key(key)) is not None:
                self._index_model(key, *mk, raw, changes)
            elif (rid := k.parse_replica_key(key)) is not None:
                self._index_replica((rid.model, rid.version, rid.worker), raw, changes)
            elif (dk := k.parse_demand_key(key)) is not None:
                self._index_demand(key, *dk, raw, changes)
            elif (bm := k.parse_breaker_key(key)) is not None:
                good = self.operator_docs.get(key)
                if good is None:
                    self._breakers.pop(bm, None)
                else:
                    self._breakers[bm] = good
                changes.models.add(bm)
        except InvalidArgument as exc:  # a key name the keyspace accepts but a document parser refuses
            log.debug("ignoring %s: %s", key, exc.message)

    def _index_model(self, key: str, model: str, what: str, raw: bytes | None, changes: Changes) -> None:
        if what == "status":
            (self._statuses.add if raw is not None else self._statuses.discard)(model)
            changes.statuses.add(model)
            return
        target = {"spec": self._specs, "traffic": self._traffic, "routing": self._routing}.get(what)
        if target is None:
            return
        changes.models.add(model)
        if what == "spec":  # its declared memory counts for its replicas that measured none
            for rkey in self._by_model.get(model, ()):
                self._used.pop(rkey[2], None)
        if what == "routing":
            value = None if raw is None else _parsed_or_none(lambda: TrafficDoc.parse(key, raw))
        else:
            value = self.operator_docs.get(key)
        if value is None:
            target.pop(model, None)
        else:
            target[model] = value

    def _index_demand(self, key: str, model: str, router: str, raw: bytes | None, changes: Changes) -> None:
        reports = self._demand.setdefault(model, {})
        demand = _parsed_or_none(lambda: Demand.parse(key, raw)) if raw else None
        if demand is None:
            reports.pop(router, None)
        else:
            reports[router] = demand
        if reports:
            self._demand_view[model] = tuple(reports[r] for r in sorted(reports))
        else:
            self._demand.pop(model, None)
            self._demand_view.pop(model, None)
        changes.models.add(model)

    def _index_worker(self, worker: str, changes: Changes) -> None:
        k = self._keys
        record = self._raw.get(k.worker(worker))
        old = self._workers.get(worker)
        new = None
        if record is not None:
            load_key = k.worker_load(worker)
            load = self._raw.get(load_key)
            draining = worker in self._drains
            new = _parsed_or_none(lambda: worker_info(k.worker(worker), record, load_key, load, draining))
        if new is None:
            self._workers.pop(worker, None)
        else:
            self._workers[worker] = new
        if (old is None) != (new is None) or (
            old is not None
            and new is not None
            and replace(new, last_beat=old.last_beat, device_room_bytes=old.device_room_bytes) != old
        ):
            changes.workers.add(worker)

    def _index_replica(self, rkey: ReplicaKey, raw: bytes | None, changes: Changes) -> None:
        model, version, worker = rkey
        changes.models.add(model)
        self._used.pop(worker, None)
        key = self._keys.replica(model, version, worker)
        info = None
        if raw is not None:
            revision = self._revisions.get(key, 0)
            info = _parsed_or_none(lambda: replica_info(key, raw, revision))
        if info is None:
            if self._replicas.pop(rkey, None) is not None:
                changes.freed.add(worker)
                for index, name in ((self._by_model, model), (self._by_worker, worker)):
                    keys = index.get(name)
                    if keys is not None:
                        keys.discard(rkey)
                        if not keys:
                            del index[name]
            return
        self._replicas[rkey] = info
        self._by_model.setdefault(model, set()).add(rkey)
        self._by_worker.setdefault(worker, set()).add(rkey)

    def _publish(self, kind: EventType, key: str, value: bytes, revision: int) -> None:
        for sub in list(self._subscribers):
            if not sub.offer((kind, key, value, revision)):
                self._subscribers.discard(sub)  # a watcher that does not read is dropped, never waited for

    def _check(self, key: str, raw: bytes | None) -> None:
        """Apply the one rule to an operator-writable document as it arrives (the last good one stays)."""
        parsed = self._keys.parse_model_key(key)
        if parsed is not None and parsed[1] == "spec":
            self.operator_docs.apply(key, raw, ModelSpecDoc.parse, "spec")
        elif parsed is not None and parsed[1] == "traffic":
            self.operator_docs.apply(key, raw, TrafficDoc.parse, "traffic")
        elif self._keys.parse_breaker_key(key) is not None:
            self.operator_docs.apply(key, raw, BreakerDoc.parse, "breaker")

    @property
    def rejections(self) -> dict[str, str]:
        """Operator documents whose current value was rejected: key -> why."""
        return {key: r.reason for key, r in self.operator_docs.rejections.items()}

    # -- reading ---------------------------------------------------------------------------------------
    def raw(self, key: str) -> bytes | None:
        return self._raw.get(key)

    def mod_revision(self, key: str) -> int:
        return self._revisions.get(key, 0)

    def spec(self, model: str) -> ModelSpecDoc | None:
        return self.operator_docs.get(self._keys.model_spec(model))

    def status_models(self) -> set[str]:
        """Models with a published status key."""
        return set(self._statuses)

    def breaker_doc(self, model: str) -> BreakerDoc | None:
        """The model's breaker document in force (the last good one), if any."""
        return self._breakers.get(model)

    def expiring_breakers(self) -> list[str]:
        """Models whose breaker level was forced until a time (its expiry changes the level in force)."""
        return [m for m, b in self._breakers.items() if b.until]

    def status_doc(self, model: str) -> ModelStatusDoc | None:
        """The model's published status, parsed once per revision (callers must not change it)."""
        key = self._keys.model_status(model)
        raw = self._raw.get(key)
        if raw is None:
            self._status_docs.pop(model, None)
            return None
        revision = self._revisions.get(key, 0)
        hit = self._status_docs.get(model)
        if hit is not None and hit[0] == revision:
            return hit[1]
        doc = _parsed_or_none(lambda: ModelStatusDoc.parse(key, raw))
        self._status_docs[model] = (revision, doc)
        return doc

    def view(self) -> ClusterView:
        """The cluster as of the last applied batch; shares the indexes (read it before the next await)."""
        now = self._clock()
        breakers = {m: level for m, b in self._breakers.items() if (level := b.level_at(now))}
        return ClusterView(
            now=now,
            workers=self._workers,
            specs=self._specs,
            traffic=self._traffic,
            routing=self._routing,
            replicas=self._replicas,
            demand=self._demand_view,
            breakers=breakers,
        ).indexed(self._by_model, self._by_worker, self._used)


def _parsed_or_none(parse: Callable[[], Any]) -> Any:
    try:
        return parse()
    except InvalidArgument as exc:
        log.debug("ignoring a document that does not parse: %s", exc.message)
        return None


def worker_info(
    key: str, record_raw: bytes, load_key: str, load_raw: bytes | None, draining: bool
) -> WorkerInfo:
    """The planner's view of a worker: its record, its load report (if any) and whether it is drained."""
    record = WorkerRecord.parse(key, record_raw)
    load = None if load_raw is None else LoadReport.parse(load_key, load_raw)
    return WorkerInfo(
        id=record.worker_id,
        grpc=record.grpc,
        zmq=record.zmq,
        capacity_bytes=record.memory_capacity_bytes,
        labels=record.labels,
        stopped=bool(load and load.stopped),
        draining=draining or bool(record.draining),  # a drain key, or the worker stopping
        last_beat=load.last_beat if load else 0.0,
        incarnation=record.incarnation,
        device_room_bytes=load.device_room_bytes if load else None,
    )


def replica_info(key: str, raw: bytes, revision: int) -> ReplicaInfo:
    """The planner's view of a replica record (memory and incarnation from its ``info``)."""
    record = ReplicaRecord.parse(key, raw, revision=revision)
    rid = key.split("/")[-3:]
    return ReplicaInfo(
        model=rid[0],
        version=rid[1],
        worker=rid[2],
        state=record.state,
        since=record.since,
        reason=record.reason,
        revision=revision,
        memory_bytes=record.details.memory_bytes,
        incarnation=record.details.incarnation,
    )
