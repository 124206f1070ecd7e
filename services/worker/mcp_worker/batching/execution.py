"""One batch's run, on an executor thread (or on the loop, for an inline model): concatenate the
requests' inputs along axis 0, run the model, split the outputs back by rows.

Invariants: each request gets views of its own rows, no copies; batches of 1 MiB and more are assembled in
pool blocks (``BatchBuffers``), and an output that views an input is copied before the blocks go back; an
output without a row per input row is ``Internal`` naming the model."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np

from mcp_worker.batching.buffers import BatchBuffers
from mcp_worker.batching.model_statistics import Phases
from mcp_worker.batching.request import Pending, RunBatch, Tensors
from mcpcore.errors import Internal

__all__ = ["execute"]


def execute(
    batch: list[Pending], run_batch: RunBatch, *, key: str, batched: bool, buffers: BatchBuffers | None
) -> tuple[list[Tensors], Phases, int, int]:
    """Run ``batch``: returns each request's outputs, the time of each phase (accounted on the loop), the
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
            return run_batch(x, **extra)
        finally:
            marks.append(time.perf_counter_ns())

    results = _assemble_run_split(batch, run, key, batched, buffers)
    done = time.perf_counter_ns()
    cpu = time.thread_time_ns() - cpu
    ran, finished = (marks[0], marks[1]) if len(marks) == 2 else (done, done)
    return results, Phases(ran - started, finished - ran, done - finished), began, cpu


def _assemble_run_split(
    batch: list[Pending], run: Callable[[Tensors], Any], key: str, batched: bool, buffers: BatchBuffers | None
) -> list[Tensors]:
    inputs = cast(list[Tensors], [r.inputs for r in batch])
    if not batched:
        return _split(run(inputs[0]), None, key)
    rows = [r.rows for r in batch]
    if len(batch) == 1:
        return _split(run(inputs[0]), rows, key)
    if buffers is None or any(a.dtype.kind == "O" for a in inputs[0].values()):  # BYTES: objects
        merged = {n: np.concatenate([x[n] for x in inputs]) for n in inputs[0]}
        return _split(run(merged), rows, key)
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
        return _split(outputs, rows, key)
    finally:
        for lease in leases:
            lease.release()


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
