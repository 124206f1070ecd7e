"""The worker's dynamic batcher: per-model queues, one dispatcher task, batches run on threads.

Invariants:
- Nothing busy-polls (DESIGN §11 item 5). One dispatcher task sleeps on an ``asyncio.Event`` (a submit, a
  finished batch) or until the earliest ``BatchPolicy.next_wakeup()``; with every slot busy it wakes only
  for a finished batch or a queue deadline.
- Concatenation, the model and the split run in the executor, so the loop keeps serving while a batch
  computes; at most ``slots`` batches run at once. The exception is a model added with ``inline`` that
  proves fast: its batches run on the loop itself, with no thread to wake and no result to hand back,
  while each takes at most the dispatcher's ``inline_s`` (``mcp_worker.inline`` has the rules: a model
  that turns slow holds the loop for one batch). A decoupled model's batches never run inline.
- When several models have a ready batch, a free slot goes to the one ``StrideScheduler`` picks with
  weights from ``calculate_weights`` (DESIGN §6): every model keeps a share above zero.
- A slow model never holds every slot while another model is in use: a model starts a second batch at
  once only when a slot stays free for each other *active* model that runs none (active: it has queued
  requests or had one within ``ACTIVE_S``). Alone on the worker, a model may use every slot; beside a
  fast one, a 50 ms batch cannot make the fast model's next request wait for a slot.
- Every admitted request is answered exactly once: its rows of the batch outputs, or an ``MCPError``
  (the batch failed, its queue deadline passed, an emergency stop or shutdown), through the ``on_done``
  callback it was queued with (``enqueue``: no task per request) or the future ``submit`` awaits. A
  withdrawn request (a cancelled submit) leaves the queue at once; if its batch already runs, its rows
  are dropped.
- A request waits in the queue at most ``min(queue timeout of the model, its own deadline)``; one whose
  time ran out is dropped before it runs, counted, and answered not started, as is every refusal at
  admission (paused, unloading, stopped, queue full: "exceeds maximum queue size") and every request an
  emergency stop or shutdown answers while queued. Errors of a batch that ran are not marked.
- ``on_execute(key, request_ids)`` is called as a batch starts: the worker counts executions there.
- Requests that skip secondary outputs (breaker level 2) batch only with each other, and so do requests
  with the same request parameters (a backend may read them); a request with an ``emit`` (a decoupled
  model's) runs alone.
- A model is forgotten only once its queued and in-flight requests are done (``remove_model``), so an
  unload never fails a request that was admitted.

Metrics stay decoupled: ``metrics`` is any object shaped like ``BatchMetrics`` (the worker passes its
prometheus metrics); a missing attribute is skipped.

Tracing (on only with ``mcpcore.tracing`` set up): a request queued under a sampled trace context (the
tensor server attaches the router's, ``wire.PARAM_TRACEPARENT``) keeps that context and its queueing
time; nothing else is kept. Each such request gets a ``queue`` span (queued to its batch's start, or to
its expiry or failure, then an error), a child of the router's span; its batch gets one ``batch`` span
(attributes ``mcp.batch.size``, ``mcp.batch.rows``, ``mcp.model``), a child of the batch's first traced
request and linked to every traced request of the batch (each ``queue`` span links back to it), and
under it a ``compute`` span: the backend call, timed on the executor thread. Spans are made on the event
loop only; a batch with no traced request makes none. A batch runs with its log fields bound (model,
its requests' ids, the first traced one's trace id), on the executor thread too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np

from mcp_worker.batch_policy import BatchConfig, BatchPolicy, Request
from mcp_worker.buffers import BatchBuffers
from mcp_worker.inline import InlinePolicy
from mcp_worker.sharing import ModelShare, StrideScheduler, calculate_weights
from mcp_worker.totals import Phases, Totals
from mcpcore import logs, tracing
from mcpcore.errors import (
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    MCPError,
    Unavailable,
    error_class,
    not_started,
)

__all__ = ["BatchConfig", "BatchMetrics", "Dispatcher", "ModelQueue", "OnDone", "QueueStats", "RunBatch"]

log = logging.getLogger(__name__)

Tensors = dict[str, np.ndarray]
#: Runs one batch: blocking and thread-safe; inputs are concatenated along axis 0 when batching. Called
#: with keyword arguments only where a batch has them: ``skip``, ``parameters``, ``emit`` (see
#: ``Backend.infer``).
RunBatch = Callable[..., Tensors]

_RECENT = 128  # batches that QueueStats averages over
_ANSWER_CHUNK = 32  # a batch's answers per event-loop iteration (a whole batch of the usual size)
_ERROR_BACKOFF_S = 0.05  # after an unexpected dispatcher error, so a persistent one cannot spin
#: A model with a request this recently (seconds) keeps a slot free beside another model's batches.
ACTIVE_S = 1.0


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


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


class _BoundMetrics:
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


#: Takes a request's outputs, or the error that ends it; called once, on the event loop.
OnDone = Callable[[Tensors | BaseException], None]


@dataclass(eq=False, slots=True, kw_only=True)
class _Pending(Request):
    """A queued request with what the dispatcher needs to run and answer it."""

    request_id: str
    inputs: Tensors | None
    on_done: OnDone | None  # None once answered or withdrawn
    timeout_s: float | None
    skip: frozenset[str] = frozenset()
    parameters: Mapping[str, str] | None = None
    emit: Callable[[Tensors], None] | None = None
    parent: Any = None  # the sampled trace context it came under (a SpanContext), when traced
    queued_ns: int = 0  # wall clock, when traced


def _answer(req: _Pending, result: Tensors | BaseException) -> None:
    on_done, req.on_done = req.on_done, None
    req.inputs = None  # the heap may hold the request a while: not its tensors
    if on_done is None:  # a withdrawn request's answer goes nowhere
        return
    try:
        on_done(result)
    except Exception:  # its own taker's fault: the rest of its batch is still answered
        log.exception("request %s: its answer could not be taken", req.request_id)


def _split(outputs: object, rows: list[int] | None, key: str) -> list[Tensors]:
    """Each request's rows of the batch outputs (views, no copies); ``rows`` None: one unbatched request."""
    if not isinstance(outputs, Mapping):
        raise Internal(f"model {key}: run_batch returned {type(outputs).__name__}, not a dict of arrays")
    if rows is None:
        return [dict(outputs)]
    total = sum(rows)
    for name, arr in outputs.items():
        if not isinstance(arr, np.ndarray) or arr.ndim == 0 or arr.shape[0] != total:
            got = arr.shape if isinstance(arr, np.ndarray) else type(arr).__name__
            raise Internal(f"model {key}: output {name} is {got}, expected {total} rows for this batch")
    bounds = list(itertools.accumulate(rows, initial=0))
    return [{n: a[lo:hi] for n, a in outputs.items()} for lo, hi in itertools.pairwise(bounds)]


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
        metrics: _BoundMetrics,
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
        self._paused = False
        self._in_flight = self._requests_total = self._batches_total = self._errors_total = 0
        self.running = 0  # batches of this queue running now
        self.last_arrival = -float("inf")  # the dispatcher's clock at the latest enqueue
        self._recent: deque[tuple[int, int, float, float]] = deque(maxlen=_RECENT)
        self.totals = Totals()  # since load: ModelStatistics

    async def submit(
        self,
        request_id: str,
        inputs: Mapping[str, np.ndarray],
        *,
        priority: int | None = None,
        timeout_s: float | None = None,
        skip: frozenset[str] = frozenset(),
        parameters: Mapping[str, str] | None = None,
        emit: Callable[[Tensors], None] | None = None,
    ) -> Tensors:
        """Queue one request and wait for its outputs (``enqueue`` says what the arguments mean); a
        cancelled wait withdraws the request."""
        future: asyncio.Future[Tensors] = asyncio.get_running_loop().create_future()

        def done(result: Tensors | BaseException) -> None:
            if not future.done():
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)

        req = self.enqueue(
            request_id, inputs, done, priority=priority, timeout_s=timeout_s, skip=skip,
            parameters=parameters, emit=emit,
        )  # fmt: skip
        try:
            return await future
        except asyncio.CancelledError:  # the client is gone: free its place if it is still queued
            self.withdraw(req)
            raise

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
    ) -> _Pending:
        """Queue one request, no task needed: ``on_done`` gets its outputs or its error once, on the loop
        (a refusal at admission raises here instead). ``priority`` is a level (1 is served first; default
        from the config); ``timeout_s`` is the time the request has left (its deadline): it waits in the
        queue at most that, or the model's queue timeout when shorter. ``skip``: outputs not to compute;
        ``parameters``: the request's, for the backend; ``emit``: takes a decoupled model's answers (on
        the executor thread)."""
        level = self._admit(priority)
        rows, shape_key = self._describe(inputs)
        policy = self.config.default_queue_timeout_s
        timeout = policy if timeout_s is None else timeout_s if policy is None else min(policy, timeout_s)
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

        req = _Pending(
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

    def withdraw(self, req: _Pending) -> None:
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
        if self._paused:
            raise not_started(Unavailable(f"model {self.key} is paused; retry later or on another replica"))
        levels = self.config.priority_levels
        # Triton's convention: 0 (or none) is the default level, 1 the highest; a level past the
        # configured ones is served at the lowest, so clients written for other models keep working
        level = self.config.default_priority_level if not priority else min(priority, levels)
        if level < 1:
            raise InvalidArgument(
                f"priority level {priority} is not valid for model {self.key}: use 1..{levels}"
            )
        limit = self.config.max_queue_size
        if limit and len(self.policy) >= limit:
            raise not_started(
                Unavailable(
                    f"exceeds maximum queue size: the queue of model {self.key} holds {limit} requests "
                    "(max_queue_size); retry later or on another replica"
                )
            )
        return level

    def _describe(self, inputs: Mapping[str, np.ndarray]) -> tuple[int, Hashable]:
        """(rows, shape key); checks what batching needs: arrays that agree on the batch dim."""
        if not isinstance(inputs, Mapping) or not inputs:
            raise InvalidArgument(f"a request to model {self.key} needs at least one input")
        if not self.config.batched:
            return 1, None
        first = next(iter(inputs))
        parts = []
        for name, arr in inputs.items():
            if not isinstance(arr, np.ndarray) or arr.ndim == 0:
                raise InvalidArgument(f"input {name} of model {self.key}: needs an array with a batch dim")
            if arr.shape[0] != inputs[first].shape[0]:
                raise InvalidArgument(
                    f"inputs of model {self.key} disagree on the batch dim: {first} has "
                    f"{inputs[first].shape[0]} rows, {name} has {arr.shape[0]}"
                )
            parts.append((name, arr.dtype.str, arr.shape[1:]))
        rows, mbs = inputs[first].shape[0], self.config.max_batch_size
        if not 1 <= rows <= mbs:
            raise InvalidArgument(
                f"a request to model {self.key} has {rows} rows; it must have 1..{mbs} (max_batch_size)"
            )
        return rows, tuple(sorted(parts))

    def pause(self) -> None:
        """Refuse new requests (``Unavailable``); queued ones still run (drain)."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False

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
            assert isinstance(req, _Pending)
            waited, limit = _ms(now - req.arrival), _ms(req.timeout_s or 0.0)
            where = f"in the queue of {self.key}, over its {limit} timeout; it did not run"
            _answer(req, not_started(DeadlineExceeded(f"request {req.request_id} waited {waited} {where}")))
        if expired:
            self._queue_spans(cast(list[_Pending], expired), "its deadline passed in the queue")
        self._metrics.count_dropped(len(expired))
        self._left()

    def fail_queued(self, error: MCPError) -> list[str]:
        """Answer every queued request ``error`` (marked not started: none of them ran)."""
        not_started(error)
        reqs = cast(list[_Pending], self.policy.clear())
        for req in reqs:
            _answer(req, error)
        self._queue_spans(reqs, error.message)
        self._left()
        return [r.request_id for r in reqs]

    def _queue_spans(self, reqs: list[_Pending], error: str = "", batch: Any = None) -> None:
        """The traced requests' ``queue`` spans, ending now (``batch``: the span of the batch they start)."""
        tracer = self._dispatcher.tracer
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

    def batch_span(self, batch: list[_Pending]) -> Any:
        """A starting batch's span, and its traced requests' queue spans (None: none of them is traced)."""
        tracer = self._dispatcher.tracer
        parents = [r.parent for r in batch if r.parent is not None] if tracer is not None else []
        if not parents:
            return None
        assert tracer is not None
        attributes = {
            "mcp.model": self.model, "mcp.version": self.version, "mcp.batch.size": len(batch),
            "mcp.batch.rows": sum(r.rows for r in batch),
        }  # fmt: skip
        span = tracing.start_batch(tracer, "batch", parents, time.time_ns(), attributes=attributes)
        self._queue_spans(batch, batch=span)
        return span

    def begin(self, batch: list[_Pending], now: float) -> float:
        """Account a batch that starts; returns its mean queue time."""
        self._in_flight += len(batch)
        self.running += 1
        waits = [now - r.arrival for r in batch]
        self.totals.queued(waits)
        self._metrics.observe_batch(waits, sum(r.rows for r in batch), self.config.max_batch_size)
        self._left()
        return sum(waits) / len(waits)

    def finish(self, batch: list[_Pending], exec_s: float, queue_s: float) -> None:
        self._in_flight -= len(batch)
        self.running -= 1
        self._batches_total += 1
        self._recent.append((len(batch), sum(r.rows for r in batch), exec_s, queue_s))
        self._left()

    def work(self, batch: list[_Pending]) -> tuple[list[Tensors], Phases, int, int]:
        """Runs in the executor (or inline): concatenate along axis 0, run, split the outputs back by rows;
        returns each request's outputs, the time of each phase (accounted on the loop, ``executed``), the
        wall clock (ns) it began at and the CPU time (ns) its thread spent."""
        began = time.time_ns()
        cpu = time.thread_time_ns()
        started = time.perf_counter_ns()
        marks: list[int] = []
        first = batch[0]  # a batch shares these (they are part of the shape key)
        extra: dict[str, Any] = {}
        if first.skip:
            extra["skip"] = first.skip
        if first.parameters:
            extra["parameters"] = first.parameters
        if first.emit is not None:
            extra["emit"] = first.emit

        def run(x: Tensors) -> Any:
            marks.append(time.perf_counter_ns())
            try:
                return self._run_batch(x, **extra)
            finally:
                marks.append(time.perf_counter_ns())

        results = self._assemble_run_split(batch, run)
        done = time.perf_counter_ns()
        cpu = time.thread_time_ns() - cpu
        ran, finished = (marks[0], marks[1]) if len(marks) == 2 else (done, done)
        return results, Phases(ran - started, finished - ran, done - finished), began, cpu

    def executed(self, batch: list[_Pending], phases: Phases, *, inline: bool, cpu_ns: int) -> None:
        """A batch ran (on the loop, after ``work``; ``inline``: on the loop itself): its totals, and
        where the next one runs."""
        self.totals.executed(len(batch), sum(r.rows for r in batch), phases)
        self.inline.ran(inline, phases.input_ns + phases.infer_ns + phases.output_ns, cpu_ns)

    def runs_inline(self, batch: list[_Pending]) -> bool:
        """Whether ``batch`` runs on the loop (``mcp_worker.inline``): counted when it does."""
        if batch[0].emit is not None or not self.inline.take():
            return False
        self._metrics.count_inline()
        return True

    def _assemble_run_split(self, batch: list[_Pending], run: Callable[[Tensors], Any]) -> list[Tensors]:
        inputs = cast(list[Tensors], [r.inputs for r in batch])
        if not self.config.batched:
            return _split(run(inputs[0]), None, self.key)
        rows = [r.rows for r in batch]
        if len(batch) == 1:
            return _split(run(inputs[0]), rows, self.key)
        buffers = self._dispatcher.buffers
        if buffers is None or any(a.dtype.kind == "O" for a in inputs[0].values()):  # BYTES: objects
            merged = {n: np.concatenate([x[n] for x in inputs]) for n in inputs[0]}
            return _split(run(merged), rows, self.key)
        leases = []
        try:  # batch assembly in pool blocks: no fresh pages per batch
            merged = {}
            for name in inputs[0]:
                merged[name], lease = buffers.concatenate([x[name] for x in inputs])
                leases.append(lease)
            outputs = run(merged)
            if isinstance(outputs, Mapping):  # an output that views an input must outlive the blocks
                outputs = {
                    n: a.copy() if any(np.may_share_memory(a, m) for m in merged.values()) else a
                    for n, a in outputs.items()
                }
            return _split(outputs, rows, self.key)
        finally:
            for lease in leases:
                lease.release()

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


class Dispatcher:
    """Serves the model queues of one worker: ``slots`` batches at once, shared by weight."""

    def __init__(
        self,
        *,
        slots: int = 1,
        executor: concurrent.futures.Executor | None = None,
        clock: Callable[[], float] = time.monotonic,
        load_probe: Callable[[], float] | None = None,
        metrics: BatchMetrics | None = None,
        buffers: BatchBuffers | None = None,
        on_execute: Callable[[str, list[str]], None] | None = None,
        inline_s: float = 0.0,
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        if inline_s < 0:
            raise ValueError(f"inline_s must be >= 0, got {inline_s}")
        self.slots, self.clock = slots, clock
        self.inline_s = inline_s  # a model added with ``inline`` this fast runs on the loop; 0: none does
        self.buffers = buffers  # pool-backed batch assembly (None: numpy)
        self.on_execute = on_execute
        self.tracer = tracing.tracer(__name__)  # None: tracing is off (resolved once, not per request)
        self._own_executor = executor is None
        self._executor = executor or concurrent.futures.ThreadPoolExecutor(slots, "mcp-batch")
        self._load_probe, self._metrics = load_probe, metrics
        self._models: dict[str, ModelQueue] = {}
        self._stride = StrideScheduler()
        self._busy = 0
        self._running: dict[int, list[_Pending]] = {}
        self._batch_ids = itertools.count()
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._serve_task: asyncio.Task[None] | None = None
        self.stop_reason: str | None = None  # set: admits nothing more
        self.last_active = 0.0  # wall time of the last finished batch

    def add_model(
        self,
        key: str,
        config: BatchConfig,
        run_batch: RunBatch,
        share: ModelShare,
        *,
        labels: tuple[str, str] | None = None,
        max_running: int | None = None,
        inline: bool = False,
    ) -> ModelQueue:
        """Serve ``key`` (``model/version``: the metric labels unless ``labels`` says otherwise), at most
        ``max_running`` batches of it at once (None: as many as the slots allow); ``inline``: its batches
        may run on the loop once they prove fast (the module's docstring), for a backend that may run on
        any thread and whose run time no request chooses."""
        if key in self._models:
            raise ValueError(f"model {key} is already served by this dispatcher")
        if labels is None:
            model, slash, version = key.rpartition("/")
            labels = (model, version) if slash else (key, "")
        metrics = _BoundMetrics(self._metrics, *labels)
        queue = ModelQueue(
            self, key, config, run_batch=run_batch, share=share, metrics=metrics, max_running=max_running,
            inline=inline,
        )  # fmt: skip
        self._models[key] = queue
        return queue

    async def remove_model(self, key: str) -> None:
        """Stop admitting requests for ``key``, wait until its queued and running ones are done, forget it."""
        queue = self._models.get(key)
        if queue is None:
            return
        queue.closing = True
        await queue.drained.wait()
        if self._models.get(key) is queue:
            del self._models[key]
            self._stride.forget(key)

    def emergency_stop(self, reason: str) -> list[str]:
        """Admit nothing more; answer every queued request ``Unavailable`` (retryable) and return their ids.
        Batches already running finish and answer normally."""
        self.stop_reason = f"worker emergency stop: {reason}"
        error = Unavailable(f"{self.stop_reason}; retry on another worker")
        return [rid for queue in self._models.values() for rid in queue.fail_queued(error)]

    def in_flight_ids(self) -> list[str]:
        """Ids of the requests whose batch is running now."""
        return [r.request_id for batch in self._running.values() for r in batch]

    async def close(self) -> None:
        """Answer queued requests ``Unavailable``, let running batches finish, stop the dispatcher task."""
        if self.stop_reason is None:
            self.stop_reason = "worker shutting down"
        error = Unavailable(f"{self.stop_reason}; retry on another worker")
        for queue in self._models.values():
            queue.fail_queued(error)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._serve_task is not None:
            self._serve_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._serve_task
            self._serve_task = None
        if self._own_executor:
            self._executor.shutdown(wait=False)

    def wake(self) -> None:
        """Something changed (a request queued, a limit moved): let the dispatcher look again."""
        if self._serve_task is None or self._serve_task.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop yet: the first submit starts the dispatcher
                return
            # its own context: not that of the request whose submit started it (its log fields, its trace)
            self._serve_task = loop.create_task(
                self._serve(), name="mcp-batching", context=contextvars.Context()
            )
        self._wake.set()

    # --- the dispatcher task --------------------------------------------------------------------------

    async def _serve(self) -> None:
        while True:
            self._wake.clear()  # before looking: a wake-up during the step is not lost
            try:
                delay = self._step()
            except Exception:
                log.exception("batch dispatcher: unexpected error; continuing")
                count = getattr(self._metrics, "count_loop_error", None)
                if count is not None:
                    count("batching")
                delay = _ERROR_BACKOFF_S
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()

    def _step(self) -> float | None:
        """Expire, start what free slots can take; returns how long to sleep (None: until woken)."""
        now = self.clock()
        for queue in self._models.values():
            queue.expire(now)
        held: set[str] = set()
        while self._busy < self.slots:
            held = self._held(now)
            ready = [key for key, q in self._models.items() if key not in held and q.policy.ready(now)]
            if not ready:
                break
            queue = self._models[self._choose(ready)]
            batch = queue.policy.take_batch(now)
            if not batch:
                break
            self._start(queue, batch, now)  # type: ignore[arg-type]
        free = self._busy < self.slots  # no free slot: only deadlines (and finished batches) matter
        times = [
            t
            for key, queue in self._models.items()
            if (t := queue.policy.next_wakeup() if free and key not in held else queue.policy.next_expiry())
            is not None
        ]
        if free and held:  # a held model may go on once the models it keeps a slot for are quiet
            quiet = (q.last_arrival + ACTIVE_S for q in self._models.values() if not q.running)
            times += [t for t in quiet if t > now]
        return max(0.0, min(times) - now) if times else None

    def _held(self, now: float) -> set[str]:
        """The models that may not start another batch now: those running as many as they have instances
        (``max_running``); and, when the free slots are no more than the other active models that run
        none (they keep one each), every model running one already."""
        full = {
            k for k, q in self._models.items() if q.max_running is not None and q.running >= q.max_running
        }
        running = [key for key, q in self._models.items() if q.running]
        if not running:
            return full
        idle_active = sum(
            1
            for q in self._models.values()
            if not q.running and (len(q.policy) or now - q.last_arrival < ACTIVE_S)
        )
        return set(running) if self.slots - self._busy <= idle_active else full

    def _choose(self, ready: list[str]) -> str:
        load = self._busy / self.slots
        if self._load_probe is not None:
            try:
                load = float(self._load_probe())
            except Exception:
                log.exception("batch dispatcher: load probe failed; using the busy slot fraction")
        weights = calculate_weights([self._models[key].share for key in ready], load)
        return self._stride.pick(ready, dict(zip(ready, weights, strict=True)))

    def _start(self, queue: ModelQueue, batch: list[_Pending], now: float) -> None:
        if self.on_execute is not None:
            try:
                self.on_execute(queue.key, [r.request_id for r in batch])
            except Exception:
                log.exception("batch dispatcher: on_execute failed; the batch runs")
        self._busy += 1
        batch_id = next(self._batch_ids)
        self._running[batch_id] = batch
        queue_s = queue.begin(batch, now)
        span = queue.batch_span(batch) if self.tracer is not None else None
        task = asyncio.get_running_loop().create_task(self._execute(batch_id, queue, batch, queue_s, span))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute(
        self, batch_id: int, queue: ModelQueue, batch: list[_Pending], queue_s: float, span: Any
    ) -> None:
        started = time.perf_counter()
        trace_id = format(span.get_span_context().trace_id, "032x") if span is not None else ""
        # this task's own context: what the batch logs, here and on the executor thread, names it
        logs.bind(model=queue.model, request_id=",".join(r.request_id for r in batch), trace_id=trace_id)
        inline = queue.runs_inline(batch)
        try:
            if inline:
                results, phases, began, cpu_ns = queue.work(batch)
            else:
                results, phases, began, cpu_ns = await asyncio.get_running_loop().run_in_executor(
                    self._executor, contextvars.copy_context().run, queue.work, batch
                )
        except asyncio.CancelledError:
            if span is not None:
                tracing.end(span, "cancelled: the worker is stopping")
            for req in batch:
                _answer(req, Unavailable(f"worker shutting down while running {queue.key}; retry"))
            raise
        except Exception as exc:
            queue.inline.failed(inline)
            error = queue.batch_error(exc, len(batch))
            if span is not None:
                tracing.end(span, error.message)
            for req in batch:
                _answer(req, error)
            return
        finally:
            del self._running[batch_id]
            self._busy -= 1
            queue.finish(batch, time.perf_counter() - started, queue_s)
            self.last_active = time.time()
            self._wake.set()
        queue.executed(batch, phases, inline=inline, cpu_ns=cpu_ns)
        if span is not None and self.tracer is not None:
            ran = began + phases.input_ns
            tracing.record(
                self.tracer,
                "compute",
                span,
                ran,
                ran + phases.infer_ns,
                attributes={"mcp.model": queue.model},
            )
            tracing.end(span)
        await _answer_spread(batch, results)


async def _answer_spread(batch: list[_Pending], results: list[Tensors]) -> None:
    """Answer a batch ``_ANSWER_CHUNK`` requests per loop iteration. When every answer woke a reply task,
    64 answers in one iteration held the loop (chunks of 4 took worker loop lag p99 at c=64 from 14-15 to
    12-13 ms). Coalesced requests are answered without tasks, and chunks of 4 sent a batch's replies as
    a message per chunk: a whole batch of 32 in one message measured ~6% less worker CPU per request
    (alternating runs, normalised by the load generator's own CPU per request)."""
    for i, (req, out) in enumerate(zip(batch, results, strict=True)):
        _answer(req, out)
        if i % _ANSWER_CHUNK == _ANSWER_CHUNK - 1 and i + 1 < len(batch):
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:  # stopping: the rest get their outputs at once
                for rest, rest_out in zip(batch[i + 1 :], results[i + 1 :], strict=True):
                    _answer(rest, rest_out)
                raise
