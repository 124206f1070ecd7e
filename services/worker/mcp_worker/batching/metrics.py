"""What the batcher reports: each queue's recent figures (``QueueStats``) and the prometheus metrics it
feeds (``BatchMetrics``: any object shaped like it, the worker passes its own; a missing one is skipped)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["BatchMetrics", "BoundMetrics", "QueueStats"]


@dataclass(frozen=True)
class QueueStats:
    queue_depth: int
    in_flight: int
    requests_total: int
    batches_total: int
    mean_batch_size: float  # requests per batch, over recent batches
    batch_utilization: float  # rows / max_batch_size, over recent batches
    mean_exec_s: float
    mean_queue_s: float
    errors_total: int = 0  # requests failed by the model itself (backend faults, not bad input)


class BatchMetrics(Protocol):
    """Prometheus metrics labelled ``(model, version)``; any of them may be missing or None."""

    batch_size: Any  # histogram: requests per batch (mcp_batch_size)
    batch_utilization: Any  # histogram: rows / max_batch_size (mcp_batch_utilization_ratio)
    queue_depth: Any  # gauge (mcp_queue_depth)
    queue_delay: Any  # histogram: seconds queued (mcp_queue_delay_seconds)
    deadline_dropped: (
        Any  # counter: requests dropped unrun, their time out (mcp_worker_deadline_dropped_total)
    )
    inline_batches: Any  # counter: batches run on the event loop (mcp_worker_inline_batches_total)


class BoundMetrics:
    """The metrics' children for one (model, version), resolved once; missing ones are skipped."""

    def __init__(self, metrics: BatchMetrics | None, model: str, version: str) -> None:
        def child(attr: str) -> Any:
            metric = getattr(metrics, attr, None)
            return None if metric is None else metric.labels(model, version)

        self.batch_size = child("batch_size")
        self.batch_utilization = child("batch_utilization")
        self.queue_depth = child("queue_depth")
        self.queue_delay = child("queue_delay")
        self.deadline_dropped = child("deadline_dropped")
        self.inline_batches = child("inline_batches")

    def observe_batch(self, waits: list[float], rows: int, max_batch_size: int) -> None:
        if self.queue_delay is not None:
            for w in waits:
                self.queue_delay.observe(w)
        if self.batch_size is not None:
            self.batch_size.observe(len(waits))
        if self.batch_utilization is not None and max_batch_size:
            self.batch_utilization.observe(rows / max_batch_size)

    def set_depth(self, depth: int) -> None:
        if self.queue_depth is not None:
            self.queue_depth.set(depth)

    def count_dropped(self, n: int) -> None:
        if self.deadline_dropped is not None and n:
            self.deadline_dropped.inc(n)

    def count_inline(self) -> None:
        if self.inline_batches is not None:
            self.inline_batches.inc()
