"""The worker's batch dispatcher: one task serves every model queue, batches run on threads.

Invariants:
- Nothing busy-polls (DESIGN §11 item 5). One dispatcher task sleeps on an ``asyncio.Event`` (a request, a
  finished batch) or until the earliest ``BatchPolicy.next_wakeup()``; with every slot busy it wakes only
  for a finished batch or a queue deadline.
- Concatenation, the model and the split run in the executor, so the loop keeps serving while a batch
  computes; at most ``slots`` batches run at once. The exception is a model added with ``inline`` that
  proves fast: its batches run on the loop itself, with no thread to wake and no result to hand back,
  while each takes at most the dispatcher's ``inline_s`` (``mcp_worker.batching.inline`` has the rules: a
  model that turns slow holds the loop for one batch).
- When several models have a ready batch, a free slot goes to the one ``StrideScheduler`` picks with
  weights from ``calculate_weights`` (DESIGN §6): every model keeps a share above zero.
- A slow model never holds every slot while another model is in use: a model starts a second batch at
  once only when a slot stays free for each other *active* model that runs none (active: it has queued
  requests or had one within ``ACTIVE_S``). Alone on the worker, a model may use every slot.
- ``on_execute(key, request_ids)`` is called as a batch starts: the worker counts executions there.
- A model is forgotten only once its queued and in-flight requests are done (``remove_model``), so an
  unload never fails a request that was admitted.
- A batch runs with its log fields bound (model, its requests' ids, the first traced one's trace id), on
  the executor thread too; its spans are ``mcp_worker.batching.spans``'.
- A batch's answers go out ``_ANSWER_CHUNK`` per loop iteration, so a large batch does not hold the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

from mcp_worker.batching import spans
from mcp_worker.batching.buffers import BatchBuffers
from mcp_worker.batching.compute_shares import ModelShare, StrideScheduler, calculate_weights
from mcp_worker.batching.metrics import BatchMetrics, BoundMetrics
from mcp_worker.batching.policy import BatchConfig
from mcp_worker.batching.queue import ModelQueue
from mcp_worker.batching.request import Pending, RunBatch, Tensors, answer
from mcpcore import logs, tracing
from mcpcore.errors import Unavailable

__all__ = ["ACTIVE_S", "Dispatcher"]

log = logging.getLogger(__name__)

_ANSWER_CHUNK = 32  # a batch's answers per event-loop iteration (a whole batch of the usual size)
_ERROR_BACKOFF_S = 0.05  # after an unexpected dispatcher error, so a persistent one cannot spin
#: A model with a request this recently (seconds) keeps a slot free beside another model's batches.
ACTIVE_S = 1.0


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
        self.tracer = tracing.tracer("mcp_worker.batching")  # None: off (resolved once, not per request)
        self._own_executor = executor is None
        self._executor = executor or concurrent.futures.ThreadPoolExecutor(slots, "mcp-batch")
        self._load_probe, self._metrics = load_probe, metrics
        self._models: dict[str, ModelQueue] = {}
        self._stride = StrideScheduler()
        self._busy = 0
        self._running: dict[int, list[Pending]] = {}
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
        metrics = BoundMetrics(self._metrics, *labels)
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
            except RuntimeError:  # no loop yet: the first request starts the dispatcher
                return
            # its own context: not that of the request whose enqueue started it (its log fields, its trace)
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

    def _start(self, queue: ModelQueue, batch: list[Pending], now: float) -> None:
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
        self, batch_id: int, queue: ModelQueue, batch: list[Pending], queue_s: float, span: Any
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
                answer(req, Unavailable(f"worker shutting down while running {queue.key}; retry"))
            raise
        except Exception as exc:
            queue.inline.failed(inline)
            error = queue.batch_error(exc, len(batch))
            if span is not None:
                tracing.end(span, error.message)
            for req in batch:
                answer(req, error)
            return
        finally:
            del self._running[batch_id]
            self._busy -= 1
            queue.finish(batch, time.perf_counter() - started, queue_s)
            self.last_active = time.time()
            self._wake.set()
        queue.executed(batch, phases, inline=inline, cpu_ns=cpu_ns)
        if span is not None and self.tracer is not None:
            spans.compute_span(self.tracer, span, queue.model, began, phases)
        await _answer_spread(batch, results)


async def _answer_spread(batch: list[Pending], results: list[Tensors]) -> None:
    """Answer a batch ``_ANSWER_CHUNK`` requests per loop iteration: a large batch's answers, each of which
    may send a reply, do not hold the loop in one go."""
    for i, (req, out) in enumerate(zip(batch, results, strict=True)):
        answer(req, out)
        if i % _ANSWER_CHUNK == _ANSWER_CHUNK - 1 and i + 1 < len(batch):
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:  # stopping: the rest get their outputs at once
                for rest, rest_out in zip(batch[i + 1 :], results[i + 1 :], strict=True):
                    answer(rest, rest_out)
                raise
