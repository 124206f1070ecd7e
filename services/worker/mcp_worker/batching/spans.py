"""Traces of queued requests and their batches (on only with ``mcpcore.tracing`` set up).

A request queued under a sampled trace context (the tensor server attaches the router's,
``wire.PARAM_TRACEPARENT``) keeps that context and its queueing time; nothing else is kept. Each such
request gets a ``queue`` span (queued to its batch's start, or to its expiry or failure, then an error), a
child of the router's span; its batch gets one ``batch`` span (attributes ``mcp.batch.size``,
``mcp.batch.rows``, ``mcp.model``), a child of the batch's first traced request and linked to every traced
request of the batch (each ``queue`` span links back to it), and under it a ``compute`` span: the backend
call, timed on the executor thread. Spans are made on the event loop only; a batch with no traced request
makes none.
"""

from __future__ import annotations

import time
from typing import Any

from mcp_worker.batching.model_statistics import Phases
from mcp_worker.batching.request import Pending
from mcpcore import tracing

__all__ = ["batch_span", "compute_span", "queue_spans"]


def queue_spans(tracer: Any, reqs: list[Pending], error: str = "", batch: Any = None) -> None:
    """The traced requests' ``queue`` spans, ending now (``batch``: the span of the batch they start)."""
    if tracer is None:
        return
    now = time.time_ns()
    links = () if batch is None else (batch.get_span_context(),)
    for req in reqs:
        if req.parent is not None:
            attributes = {"mcp.request_id": req.request_id}
            tracing.record(
                tracer, "queue", req.parent, req.queued_ns, now, attributes=attributes, links=links,
                error=error,
            )  # fmt: skip


def batch_span(tracer: Any, model: str, version: str, batch: list[Pending]) -> Any:
    """A starting batch's span, and its traced requests' queue spans (None: none of them is traced)."""
    parents = [r.parent for r in batch if r.parent is not None] if tracer is not None else []
    if not parents:
        return None
    attributes = {
        "mcp.model": model, "mcp.version": version, "mcp.batch.size": len(batch),
        "mcp.batch.rows": sum(r.rows for r in batch),
    }  # fmt: skip
    span = tracing.start_batch(tracer, "batch", parents, time.time_ns(), attributes=attributes)
    queue_spans(tracer, batch, batch=span)
    return span


def compute_span(tracer: Any, span: Any, model: str, began_ns: int, phases: Phases) -> None:
    """A batch that ran: its ``compute`` span (the backend call), then the end of its ``batch`` span."""
    ran = began_ns + phases.input_ns
    tracing.record(tracer, "compute", span, ran, ran + phases.infer_ns, attributes={"mcp.model": model})
    tracing.end(span)
