"""Request statistics: Prometheus metrics, windowed counts for the health service, demand for the scheduler.

Invariants:
- Recording a request is O(1) and touches no I/O: counts go into per-second buckets per model, error class.
- Labels and windowed counts exist only for models the router knows: a request naming an unknown model
  is counted under ``_unknown`` and kept in no window, so clients cannot mint label values or buckets.
- ``StatsPublisher`` writes, every interval and under the router's lease, ``/mcp/stats/<router>/<m>`` (the
  counts over the last ``window_s``: requests, errors by class) and ``/mcp/demand/<m>/<router>`` (requests
  that found no copy, bounded-load overflows) for models that had any. The loop never dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from mcpcore.errors import MCPError
from mcpcore.keys import Keyspace
from mcpcore.metrics import RequestMetrics
from mcpcore.store import Store

__all__ = ["RETRY_REASONS", "UNKNOWN", "RequestStats", "RouterMetrics", "StatsPublisher"]

log = logging.getLogger(__name__)
CLASSES = ("timeout", "resource", "backend", "unavailable", "client")
UNKNOWN = "_unknown"
#: Why a request was sent again (``mcp_router_retries_total{reason}``): never sent (link down, draining
#: or full), answered "not started" or "draining" by the worker, or resent once after its worker vanished
#: (idempotent models only).
RETRY_REASONS = ("not_sent", "not_started", "draining", "may_have_started")


class RouterMetrics(RequestMetrics):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.breaker_level = self.standard("mcp_breaker_level")
        self.retries = self.counter(
            "mcp_router_retries_total", "Requests sent again to another worker, by reason.", ("reason",)
        )
        for reason in RETRY_REASONS:
            self.retries.labels(reason)
        self.overflows = self.counter(
            "mcp_router_overflow_total",
            "Requests that found every copy of their model full (max_ongoing_requests).",
            ("model",),
        )
        self.may_have_started = self.counter(
            "mcp_router_may_have_started_total",
            "Requests failed UNAVAILABLE because their worker vanished after they may have started "
            "(not idempotent, or resent once already).",
            ("model",),
        )
        self.late_replies = self.counter(
            "mcp_router_late_replies_total",
            "Replies that came after the router gave up on their request; dropped by id.",
        )
        self.stats_missing = self.counter(
            "mcp_router_stats_unanswered_total",
            "Workers left out of a ModelStatistics answer because they did not answer in time.",
            ("worker",),
        )


class RequestStats:
    """Counts per model and second; read by the publisher, written by every request."""

    def __init__(
        self, metrics: RouterMetrics, *, window_s: float = 30.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.metrics = metrics
        self.window_s = window_s
        self._clock = clock
        # model -> second -> [requests, errors by class...]
        self._buckets: dict[str, dict[int, list[int]]] = defaultdict(dict)
        self._demand: dict[str, int] = defaultdict(int)
        self._overflow: dict[str, int] = defaultdict(int)

    def record(self, model: str, version: str, error: str | None, seconds: float, outcome: str) -> None:
        self.metrics.observe_request(model, version or "", "v2", outcome, seconds=seconds, error_class=error)
        if model == UNKNOWN:
            return
        second = int(self._clock())
        bucket = self._buckets[model].get(second)
        if bucket is None:
            bucket = self._buckets[model][second] = [0] * (1 + len(CLASSES))
        bucket[0] += 1
        if error is not None:
            bucket[1 + CLASSES.index(error) if error in CLASSES else 3] += 1

    def retried(self, reason: str) -> None:
        self.metrics.retries.labels(reason).inc()

    def may_have_started(self, model: str) -> None:
        self.metrics.may_have_started.labels(model).inc()

    def stats_missing(self, worker: str) -> None:
        self.metrics.stats_missing.labels(worker).inc()

    def demand(self, model: str) -> None:
        self._demand[model] += 1

    def overflow(self, model: str) -> None:
        self._overflow[model] += 1
        self.metrics.overflows.labels(model).inc()

    def window(self, model: str) -> dict[str, int]:
        """Counts over the last window: ``{"requests": n, "timeout": n, ...}``; drops older buckets."""
        now = int(self._clock())
        oldest = now - math.ceil(self.window_s)
        buckets = self._buckets.get(model, {})
        for second in [s for s in buckets if s < oldest]:
            del buckets[second]
        totals = [sum(col) for col in zip(*buckets.values(), strict=False)] or [0] * (1 + len(CLASSES))
        return {"requests": totals[0], **{c: totals[1 + i] for i, c in enumerate(CLASSES)}}

    def models(self) -> list[str]:
        return [m for m, b in self._buckets.items() if b]

    def take_demand(self) -> dict[str, tuple[int, int]]:
        out = {
            m: (self._demand.pop(m, 0), self._overflow.pop(m, 0))
            for m in set(self._demand) | set(self._overflow)
        }
        return {m: v for m, v in out.items() if any(v)}


class StatsPublisher:
    def __init__(
        self,
        store: Store,
        keys: Keyspace,
        router_id: str,
        stats: RequestStats,
        *,
        ttl: int = 10,
        interval_s: float = 1.0,
        on_error: Callable[[str], None] = lambda loop: None,
    ) -> None:
        self._store, self._keys, self._id, self._stats = store, keys, router_id, stats
        self._ttl, self._interval, self._on_error = ttl, interval_s, on_error
        self._lease_id = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="router-stats")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._lease_id:
            with contextlib.suppress(MCPError):
                await self._store.revoke_lease(self._lease_id)

    async def _run(self) -> None:
        while True:
            try:
                await self.publish_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._on_error("stats")
                self._lease_id = 0  # maybe expired while etcd was away: take a new one next time
                log.warning("could not publish stats (%s); serving goes on", exc)
            await asyncio.sleep(self._interval)

    async def publish_once(self) -> None:
        if not self._lease_id:
            self._lease_id = (await self._store.grant_lease(self._ttl)).id
        else:
            await self._store.refresh_lease(self._lease_id)
        now = time.time()
        for model in self._stats.models():
            doc = {
                "router": self._id,
                "window_s": self._stats.window_s,
                "at": now,
                **self._stats.window(model),
            }
            await self._store.put(self._keys.stats(self._id, model), _json(doc), lease=self._lease_id)
        for model, (requests, overflow) in self._stats.take_demand().items():
            doc = {"requests": requests, "overflow": overflow, "at": now}
            await self._store.put(self._keys.demand(model, self._id), _json(doc), lease=self._lease_id)


def _json(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
