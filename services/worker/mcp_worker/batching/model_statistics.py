"""Cumulative figures of one replica since it loaded: what KServe's ModelStatistics reports.

Kept as Triton keeps them: ``success``/``fail`` count requests answered by the model's queue and their time
from queueing to answer; ``queue`` their wait for a batch; ``compute_*`` each executed request's share of
its batch's phases (every request of a batch counts the whole batch time, as Triton counts it), split into
assembling the inputs, running the model and splitting the outputs; ``inference_count`` rows executed,
``execution_count`` batches; per batch size (in rows), executions and their phase times.

Invariants: counters only grow (a reload starts a new replica, and new totals); all updates happen on the
event loop (the executor thread only measures and returns its phase times), so no lock is needed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

__all__ = ["BatchTotals", "Phases", "Totals"]


@dataclass(frozen=True, slots=True)
class Phases:
    """One execution's phase times, in nanoseconds."""

    input_ns: int
    infer_ns: int
    output_ns: int


@dataclass(slots=True)
class BatchTotals:
    count: int = 0
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0


@dataclass(slots=True)
class Totals:
    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    fail_ns: int = 0
    queue_count: int = 0
    queue_ns: int = 0
    compute_count: int = 0
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    batches: dict[int, BatchTotals] = field(default_factory=dict)  # batch size in rows -> executions

    def answered(self, ok: bool, seconds: float) -> None:
        """One request answered (``ok``: with outputs) ``seconds`` after it was queued."""
        ns = int(seconds * 1e9)
        if ok:
            self.success_count += 1
            self.success_ns += ns
        else:
            self.fail_count += 1
            self.fail_ns += ns
        self.last_inference_ms = int(time.time() * 1000)

    def queued(self, waits_s: list[float]) -> None:
        """A batch started: how long each of its requests waited."""
        self.queue_count += len(waits_s)
        self.queue_ns += int(sum(waits_s) * 1e9)

    def executed(self, requests: int, rows: int, phases: Phases) -> None:
        """A batch of ``requests`` requests and ``rows`` rows ran, taking ``phases``."""
        self.compute_count += requests
        self.compute_input_ns += requests * phases.input_ns
        self.compute_infer_ns += requests * phases.infer_ns
        self.compute_output_ns += requests * phases.output_ns
        self.inference_count += rows
        self.execution_count += 1
        size = self.batches.get(rows)
        if size is None:
            size = self.batches[rows] = BatchTotals()
        size.count += 1
        size.input_ns += phases.input_ns
        size.infer_ns += phases.infer_ns
        size.output_ns += phases.output_ns
