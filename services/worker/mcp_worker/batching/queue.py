"""One model version's queue: admission, the requests waiting for a batch, and its figures.

Invariants:
- Every admitted request is answered exactly once: its rows of the batch outputs, or an ``MCPError``
  (the batch failed, its queue deadline passed, an emergency stop or shutdown), through the ``on_done``
  callback it was queued with (``enqueue``, the one way in: no task per request). A withdrawn request
  leaves the queue at once; if its batch already runs, its rows are dropped.
- A request waits in the queue at most ``min(queue timeout of the model, its own deadline)``; one whose
  time ran out is dropped before it runs, counted, and answered not started, as is every refusal at
  admission (refused: paused, not serving; unloading, stopped, queue full: "exceeds maximum queue size")
  and every request an emergency stop or shutdown answers while queued. Errors of a batch that ran are
  not marked.
- Requests that skip secondary outputs (breaker level 2) batch only with each other, and so do requests
  with the same request parameters (a backend may read them); a request with an ``emit`` (a decoupled
  model's) runs alone, and never on the loop.
- Admission (priority level, rows and shape key, queue timeout) is ``admission``'s pure logic.
- Everything here runs on the event loop, except ``work`` (the executor thread, or the loop for an inline
  model).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from mcp_worker.batching import spans
from mcp_worker.batching.admission import describe, priority_level, queue_timeout
from mcp_worker.batching.compute_shares import ModelShare
from mcp_worker.batching.execution import execute
from mcp_worker.batching.inline import InlinePolicy
from mcp_worker.batching.metrics import BoundMetrics, QueueStats
from mcp_worker.batching.model_statistics import Phases, Totals
from mcp_worker.batching.policy import BatchConfig, BatchPolicy
from mcp_worker.batching.request import OnDone, Pending, RunBatch, Tensors, answer
from mcpcore import tracing
from mcpcore.errors import (
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    MCPError,
    Unavailable,
    error_class,
    not_started,
)

if TYPE_CHECKING:
    from mcp_worker.batching.dispatcher import Dispatcher

__all__ = ["ModelQueue"]

log = logging.getLogger(__name__)

_RECENT = 128  # batches that QueueStats averages over


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


class ModelQueue:
    """One model version's queue on a ``Dispatcher`` (made by ``Dispatcher.add_model``)."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        key: str,
        config: BatchConfig,
        *,
        run_batch: RunBatch,
        share: ModelShare,
        metrics: BoundMetrics,
        max_running: int | None = None,
        inline: bool = False,
    ) -> None:
        self.key, self.config, self.share = key, config, share
        self.max_running = max_running  # batches it may run at once (its instances); None: any
        model, slash, version = key.rpartition("/")
        self.model, self.version = (model, version) if slash else (key, "")
        self.policy = BatchPolicy.for_config(config)
        self.closing = False  # being removed: admits nothing more
        self.drained = asyncio.Event()  # set while nothing is queued or running
        self.drained.set()
        self._dispatcher, self._run_batch = dispatcher, run_batch
        self._metrics = metrics
        self.inline = InlinePolicy(int(dispatcher.inline_s * 1e9), allowed=inline)  # loop or threads
        self._refusal: str | None = None  # why it admits no new request (None: it admits)
        self._in_flight = self._requests_total = self._batches_total = self._errors_total = 0
        self.running = 0  # batches of this queue running now
        self.last_arrival = -float("inf")  # the dispatcher's clock at the latest enqueue
        self._recent: deque[tuple[int, int, float, float]] = deque(maxlen=_RECENT)
        self.totals = Totals()  # since load: ModelStatistics

    def enqueue(
        self,
        request_id: str,
        inputs: Mapping[str, np.ndarray],
        on_done: OnDone,
        *,
        priority: int | None = None,
        timeout_s: float | None = None,
        skip: frozenset[str] = frozenset(),
        parameters: Mapping[str, str] | None = None,
        emit: Callable[[Tensors], None] | None = None,
    ) -> Pending:
        """Queue one request, no task needed: ``on_done`` gets its outputs or its error once, on the loop
        (a refusal at admission raises here instead). ``priority`` is a level (1 is served first; default
        from the config); ``timeout_s`` is the time the request has left (its deadline): it waits in the
        queue at most that, or the model's queue timeout when shorter. ``skip``: outputs not to compute;
        ``parameters``: the request's, for the backend; ``emit``: takes a decoupled model's answers (on
        the executor thread)."""
        level = self._admit(priority)
        rows, shape_key = describe(self.config, self.key, inputs)
        timeout = queue_timeout(self.config, timeout_s)
        if skip:
            shape_key = (shape_key, skip)
        if parameters:
            shape_key = (shape_key, tuple(sorted(parameters.items())))
        if emit is not None:
            shape_key = (shape_key, emit)  # its own: never batched with another request
        if timeout is not None and timeout <= 0:
            self._metrics.count_dropped(1)
            raise not_started(
                DeadlineExceeded(f"request {request_id} reached the queue of {self.key} past its deadline")
            )
        clock = self._dispatcher.clock
        now = clock()
        totals = self.totals
        parent = tracing.sampled_parent() if self._dispatcher.tracer is not None else None

        def counted(result: Tensors | BaseException) -> None:
            totals.answered(not isinstance(result, BaseException), clock() - now)
            on_done(result)

        req = Pending(
            arrival=now,
            level=level,
            deadline=None if timeout is None else now + timeout,
            rows=rows,
            shape_key=shape_key,
            request_id=request_id,
            inputs=dict(inputs),
            on_done=counted,
            timeout_s=timeout,
            skip=skip,
            parameters=parameters,
            emit=emit,
            parent=parent,
            queued_ns=time.time_ns() if parent is not None else 0,
        )
        self.policy.push(req)
        self.last_arrival = now
        self._requests_total += 1
        self.drained.clear()
        self._left()
        self._dispatcher.wake()
        return req

    def withdraw(self, req: Pending) -> None:
        """Its sender gave up: it leaves the queue if still there, and its answer goes nowhere."""
        req.on_done = None
        if self.policy.remove(req):
            req.inputs = None
            self._left()

    def _admit(self, priority: int | None) -> int:
        """The request's priority level, if this queue admits it now."""
        if self._dispatcher.stop_reason is not None:
            raise not_started(Unavailable(f"{self._dispatcher.stop_reason}; retry on another worker"))
        if self.closing:
            raise not_started(Unavailable(f"model {self.key} is being unloaded; retry on another replica"))
        if self._refusal is not None:
            raise not_started(
                Unavailable(f"model {self.key} {self._refusal}; retry later or on another replica")
            )
        level = priority_level(self.config, self.key, priority)
        limit = self.config.max_queue_size
        if limit and len(self.policy) >= limit:
            raise not_started(
                Unavailable(
                    f"exceeds maximum queue size: the queue of model {self.key} holds {limit} requests "
                    "(max_queue_size); retry later or on another replica"
                )
            )
        return level

    def refuse(self, why: str) -> None:
        """Refuse new requests, not started (``Unavailable``: "model m/1 <why>; retry later ..."); queued
        ones still run (drain)."""
        self._refusal = why

    def admit(self) -> None:
        """Admit new requests again (a queue admits from the start)."""
        self._refusal = None

    def set_batch_ratio(self, ratio: float) -> None:
        """Scale the max batch size (breaker level 1: 0.5), at least 1; 1.0 restores it."""
        if not 0 < ratio <= 1:
            raise InvalidArgument(f"batch ratio for model {self.key} must be in (0, 1], got {ratio}")
        if self.config.batched:
            self.policy.set_max_batch_size(max(1, int(self.config.max_batch_size * ratio)))
            self._dispatcher.wake()

    def stats(self) -> QueueStats:
        recent, mbs = list(self._recent), self.config.max_batch_size
        n = len(recent) or 1
        return QueueStats(
            queue_depth=len(self.policy),
            in_flight=self._in_flight,
            requests_total=self._requests_total,
            batches_total=self._batches_total,
            mean_batch_size=sum(r[0] for r in recent) / n,
            batch_utilization=sum(min(1.0, r[1] / mbs) if mbs else 1.0 for r in recent) / n,
            mean_exec_s=sum(r[2] for r in recent) / n,
            mean_queue_s=sum(r[3] for r in recent) / n,
            errors_total=self._errors_total,
        )

    # --- the dispatcher's side (on the event loop, except ``work``) -----------------------------------

    def expire(self, now: float) -> None:
        expired = self.policy.expire(now)
        for req in expired:
            assert isinstance(req, Pending)
            waited, limit = _ms(now - req.arrival), _ms(req.timeout_s or 0.0)
            where = f"in the queue of {self.key}, over its {limit} timeout; it did not run"
            answer(req, not_started(DeadlineExceeded(f"request {req.request_id} waited {waited} {where}")))
        if expired:
            why = "its deadline passed in the queue"
            spans.queue_spans(self._dispatcher.tracer, cast(list[Pending], expired), why)
        self._metrics.count_dropped(len(expired))
        self._left()

    def fail_queued(self, error: MCPError) -> list[str]:
        """Answer every queued request ``error`` (marked not started: none of them ran)."""
        not_started(error)
        reqs = cast(list[Pending], self.policy.clear())
        for req in reqs:
            answer(req, error)
        spans.queue_spans(self._dispatcher.tracer, reqs, error.message)
        self._left()
        return [r.request_id for r in reqs]

    def begin(self, batch: list[Pending], now: float) -> float:
        """Account a batch that starts; returns its mean queue time."""
        self._in_flight += len(batch)
        self.running += 1
        waits = [now - r.arrival for r in batch]
        self.totals.queued(waits)
        self._metrics.observe_batch(waits, sum(r.rows for r in batch), self.config.max_batch_size)
        self._left()
        return sum(waits) / len(waits)

    def finish(self, batch: list[Pending], exec_s: float, queue_s: float) -> None:
        self._in_flight -= len(batch)
        self.running -= 1
        self._batches_total += 1
        self._recent.append((len(batch), sum(r.rows for r in batch), exec_s, queue_s))
        self._left()

    def batch_span(self, batch: list[Pending]) -> Any:
        """A starting batch's span (None: none of its requests is traced; ``mcp_worker.batching.spans``)."""
        return spans.batch_span(self._dispatcher.tracer, self.model, self.version, batch)

    def work(self, batch: list[Pending]) -> tuple[list[Tensors], Phases, int, int]:
        """Runs in the executor (or inline): ``mcp_worker.batching.execution.execute`` for this model."""
        buffers = self._dispatcher.buffers
        return execute(batch, self._run_batch, key=self.key, batched=self.config.batched, buffers=buffers)

    def executed(self, batch: list[Pending], phases: Phases, *, inline: bool, cpu_ns: int) -> None:
        """A batch ran (on the loop, after ``work``; ``inline``: on the loop itself): its totals, and
        where the next one runs."""
        self.totals.executed(len(batch), sum(r.rows for r in batch), phases)
        self.inline.ran(inline, phases.input_ns + phases.infer_ns + phases.output_ns, cpu_ns)

    def runs_inline(self, batch: list[Pending]) -> bool:
        """Whether ``batch`` runs on the loop (``mcp_worker.batching.inline``): counted when it does."""
        if batch[0].emit is not None or not self.inline.take():
            return False
        self._metrics.count_inline()
        return True

    def batch_error(self, exc: Exception, size: int) -> MCPError:
        if not isinstance(exc, MCPError) or error_class(exc) == "backend":
            self._errors_total += size  # the health service stops a worker whose model keeps failing
        if isinstance(exc, MCPError):
            return exc
        log.error("model %s: run_batch failed on a batch of %d requests", self.key, size, exc_info=exc)
        return Internal(
            f"model {self.key} failed on a batch of {size} requests ({type(exc).__name__}); "
            "the worker log has the details"
        )

    def _left(self) -> None:
        """After the queue or the running count changed: the depth gauge, and whether it drained."""
        self._metrics.set_depth(len(self.policy))
        if not len(self.policy) and not self._in_flight:
            self.drained.set()
