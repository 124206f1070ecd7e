"""Request statistics: Prometheus metrics, windowed counts for the health service, demand for the scheduler.

Invariants:
- Recording a request is O(1) and touches no I/O: counts go into per-second buckets per model, error class.
- Labels and windowed counts exist only for models the router knows: a request naming an unknown model
  is counted under ``_unknown`` and kept in no window, so clients cannot mint label values or buckets.
- ``stats_publisher`` writes, every interval and under the router's lease, ``/mcp/stats/<router>/<m>`` (the
  counts over the last ``window_s``: requests, errors by class), ``/mcp/demand/<m>/<router>`` (requests
  that found no copy, bounded-load overflows) for models that had any, and ``/mcp/routers/<router>``
  (its addresses). The loop never dies (``mcpcore.windows``).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry

from mcpcore.keys import Keyspace
from mcpcore.metrics import RequestMetrics
from mcpcore.records import Demand, RouterRecord
from mcpcore.store import Store
from mcpcore.windows import WindowPublisher, Windows

__all__ = ["RETRY_REASONS", "UNKNOWN", "RequestStats", "RouterMetrics", "stats_publisher"]

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
    """Counts per model and second (``mcpcore.windows``), demand and overflows; read by the publisher,
    written by every request."""

    def __init__(
        self, metrics: RouterMetrics, *, window_s: float = 30.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.metrics = metrics
        self.windows = Windows(window_s=window_s, clock=clock)
        self._demand: dict[str, int] = defaultdict(int)
        self._overflow: dict[str, int] = defaultdict(int)

    def record(self, model: str, version: str, error: str | None, seconds: float, outcome: str) -> None:
        self.metrics.observe_request(model, version or "", "v2", outcome, seconds=seconds, error_class=error)
        if model != UNKNOWN:
            self.windows.record(model, error)

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

    def take_demand(self) -> dict[str, tuple[int, int]]:
        out = {
            m: (self._demand.pop(m, 0), self._overflow.pop(m, 0))
            for m in set(self._demand) | set(self._overflow)
        }
        return {m: v for m, v in out.items() if any(v)}


def stats_publisher(
    store: Store,
    keys: Keyspace,
    router_id: str,
    stats: RequestStats,
    endpoints: Callable[[], Mapping[str, str]],
    *,
    ttl: int = 10,
    interval_s: float = 1.0,
    on_error: Callable[[str], None] = lambda loop: None,
) -> WindowPublisher:
    """The router's windows, its demand docs and its presence record (``/mcp/routers/<id>``: its
    addresses, for ``mcpctl dump``), all under the router's stats lease."""

    def extra(now: float) -> dict[str, bytes]:
        docs = {
            keys.demand(model, router_id): Demand(model, router_id, requests, overflow, at=now).to_json()
            for model, (requests, overflow) in stats.take_demand().items()
        }
        if endpoints():
            key = keys.router(router_id)
            docs[key] = RouterRecord.parse(key, {**endpoints(), "at": now}).to_json()
        return docs

    return WindowPublisher(
        store, stats.windows, key_of=lambda model: keys.stats(router_id, model), source={"router": router_id},
        extra=extra, ttl=ttl, interval_s=interval_s, name="stats", on_error=on_error,
    )  # fmt: skip
