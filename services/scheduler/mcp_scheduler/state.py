"""The scheduler's mirror of etcd: one list-then-watch over the mesh's prefix, turned into ``ClusterView``s.

Invariants:
- The mirror is a dict of raw values by key, updated in revision order from one watch; a view is parsed
  from it on demand, so the planner always sees one consistent revision.
- An operator-written document that does not parse (spec, traffic, breaker) is rejected: logged, counted
  (``mcp_config_rejected_total``) and ignored, and the last good value stays in force; the rejection is kept
  so status can say why a write had no effect.
- If the watch history was compacted, the mirror is rebuilt from a fresh list; a watch error backs off and
  resumes from the last revision applied (the store resumes across reconnects by itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from mcp_scheduler import docs
from mcp_scheduler.view import ClusterView, Demand, ModelSpecDoc, ReplicaInfo, TrafficDoc, WorkerInfo
from mcpcore.breaker import parse_breaker
from mcpcore.errors import InvalidArgument
from mcpcore.keys import Keyspace
from mcpcore.mirror import PrefixMirror
from mcpcore.store import EventType, Store

__all__ = ["ClusterState", "Subscription"]

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
    ) -> None:
        self._keys = keys
        self._on_rejected = on_rejected
        self._clock = clock
        self.mirror = PrefixMirror(
            store, keys.prefix + "/", on_change=self._changed, on_error=on_error, on_applied=on_applied,
            name="scheduler-state",
        )  # fmt: skip
        self._good: dict[str, Any] = {}  # key -> last good parsed operator document
        self._parsed: dict[str, tuple[int, Any]] = {}  # key -> (revision, parsed): views reuse it
        self.rejections: dict[str, str] = {}  # key -> why its current value was ignored
        self.changed = asyncio.Event()
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

    def _notify(self) -> None:
        self.changed.set()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.mirror.start()

    async def stop(self) -> None:
        await self.mirror.stop()

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
        for key in sorted(keys, key=lambda k: self._revisions.get(k, self.revision)):
            value = self._raw.get(key)
            if value is None:
                self._good.pop(key, None)
                self._parsed.pop(key, None)
                self.rejections.pop(key, None)
                self._publish(EventType.DELETE, key, b"", self.revision)
            else:
                self._check(key)
                self._publish(EventType.PUT, key, value, self._revisions[key])
        self._notify()

    def _publish(self, kind: EventType, key: str, value: bytes, revision: int) -> None:
        for sub in list(self._subscribers):
            if not sub.offer((kind, key, value, revision)):
                self._subscribers.discard(sub)  # a watcher that does not read is dropped, never waited for

    def _check(self, key: str) -> None:
        """Validate an operator-writable document as it arrives, keeping the last good one."""
        parsed = self._keys.parse_model_key(key)
        parse: Callable[[str, bytes], Any]
        if parsed is not None and parsed[1] in ("spec", "traffic"):
            model, what = parsed
            parse = docs.parse_spec if what == "spec" else docs.parse_traffic
        elif (breaker_model := self._keys.parse_breaker_key(key)) is not None:
            model, what, parse = breaker_model, "breaker", parse_breaker
        else:
            return
        try:
            self._good[key] = parse(model, self._raw[key])
            self.rejections.pop(key, None)
        except InvalidArgument as exc:
            message = (
                exc.message if isinstance(exc, InvalidArgument) else f"{what} of {model}: nested too deeply"
            )
            self.rejections[key] = message
            self._on_rejected(what)
            kept = "the last good value stays" if key in self._good else "nothing is in force"
            log.warning("rejected %s: %s (%s)", key, message, kept)

    # -- reading ---------------------------------------------------------------------------------------
    def raw(self, key: str) -> bytes | None:
        return self._raw.get(key)

    def mod_revision(self, key: str) -> int:
        return self._revisions.get(key, 0)

    def spec(self, model: str) -> ModelSpecDoc | None:
        return self._good.get(self._keys.model_spec(model))

    def status_models(self) -> set[str]:
        """Models with a published status key."""
        out = set()
        for key in self._raw:
            parsed = self._keys.parse_model_key(key)
            if parsed is not None and parsed[1] == "status":
                out.add(parsed[0])
        return out

    def status_doc(self, model: str) -> dict[str, Any] | None:
        raw = self._raw.get(self._keys.model_status(model))
        try:
            return None if raw is None else json.loads(raw)
        except ValueError:
            return None

    def _cached(self, key: str, parse: Callable[[], Any]) -> Any:
        revision = self._revisions.get(key, 0)
        hit = self._parsed.get(key)
        if hit is not None and hit[0] == revision:
            return hit[1]
        value = parse()
        self._parsed[key] = (revision, value)
        return value

    def view(self) -> ClusterView:
        k = self._keys
        workers: dict[str, WorkerInfo] = {}
        specs: dict[str, ModelSpecDoc] = {}
        traffic: dict[str, TrafficDoc] = {}
        routing: dict[str, TrafficDoc] = {}
        replicas: dict[tuple[str, str, str], ReplicaInfo] = {}
        demand: dict[str, list[Demand]] = {}
        breakers: dict[str, int] = {}
        now = self._clock()
        drains = {w for key in self._raw if (w := k.parse_drain_key(key)) is not None}
        for key, raw in self._raw.items():
            try:
                if (wk := k.parse_worker_key(key)) is not None:
                    if not wk[1]:
                        load = self._raw.get(k.worker_load(wk[0]))
                        workers[wk[0]] = docs.parse_worker(wk[0], raw, load, wk[0] in drains)
                elif (mk := k.parse_model_key(key)) is not None:
                    model, what = mk
                    if what == "spec" and key in self._good:
                        specs[model] = self._good[key]
                    elif what == "traffic" and key in self._good:
                        traffic[model] = self._good[key]
                    elif what == "routing":
                        routing[model] = self._cached(key, lambda m=model, r=raw: docs.parse_routing(m, r))
                elif (rid := k.parse_replica_key(key)) is not None:
                    revision = self._revisions.get(key, 0)
                    replicas[(rid.model, rid.version, rid.worker)] = self._cached(
                        key,
                        lambda i=rid, r=raw, rev=revision: docs.parse_replica(
                            i.model, i.version, i.worker, r, rev
                        ),
                    )
                elif (dk := k.parse_demand_key(key)) is not None:
                    demand.setdefault(dk[0], []).append(docs.parse_demand(dk[0], dk[1], raw))
                elif (bm := k.parse_breaker_key(key)) is not None and key in self._good:
                    breakers[bm] = self._good[key].level_at(now)
            except InvalidArgument as exc:
                log.debug("ignoring %s: %s", key, exc.message)
        return ClusterView(
            now=now,
            workers=workers,
            specs=specs,
            traffic=traffic,
            routing=routing,
            replicas=replicas,
            demand={m: tuple(ds) for m, ds in demand.items()},
            breakers={m: level for m, level in breakers.items() if level},
        )
