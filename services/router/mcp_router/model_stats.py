"""KServe ModelStatistics over the mesh: every worker's replica totals (``WorkerControl.Stats``), summed
per model version.

Invariants:
- The figures are the workers' own (what each replica's queue counted since it loaded), so requests from
  every router and from direct clients are in them. A replica that reloads, or a worker that restarts,
  starts again from zero, as Triton's figures do when a model reloads.
- Only replicas the routing table holds RUNNING count: a version's figures are those of the workers that
  serve it now.
- One Stats call per worker concerned, all at once, each bounded by ``timeout_s``. A worker that does not
  answer is left out of the sum and named in the log and in ``on_missing``: a statistics call never fails
  for one slow worker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping

from mcp_router.dataplane import BatchSizeStats, Duration, ModelStats
from mcpapi.v2 import worker_pb2, worker_pb2_grpc
from mcpcore.tls import TLSConfig, aio_channel

__all__ = ["collect"]

log = logging.getLogger(__name__)


def _duration(d: worker_pb2.Duration) -> Duration:
    return Duration(d.count, d.ns)


async def _stats(
    address: str, model: str, timeout_s: float, tls: TLSConfig | None
) -> worker_pb2.StatsResponse:
    async with aio_channel(address, tls) as channel:
        stub = worker_pb2_grpc.WorkerControlStub(channel)
        return await stub.Stats(worker_pb2.StatsRequest(model=model), timeout=timeout_s)


async def collect(
    wanted: Mapping[tuple[str, str], Iterable[str]],
    addresses: Mapping[str, str],
    *,
    timeout_s: float = 2.0,
    tls: TLSConfig | None = None,
    on_missing: Callable[[str], None] = lambda worker: None,
) -> list[ModelStats]:
    """``wanted``: (model, version) -> the workers serving it; ``addresses``: worker -> gRPC address.
    Returns one entry per wanted version, in the order given (zeros where no worker answered)."""
    holders = {pair: set(workers) for pair, workers in wanted.items()}
    workers = sorted({w for ws in holders.values() for w in ws})
    models = {m for m, _ in holders}
    model_filter = next(iter(models)) if len(models) == 1 else ""
    calls = [_stats(addresses.get(w, ""), model_filter, timeout_s, tls) for w in workers]
    answers = await asyncio.gather(*calls, return_exceptions=True)
    sums: dict[tuple[str, str], list[worker_pb2.ReplicaTotals]] = {pair: [] for pair in holders}
    for worker, answer in zip(workers, answers, strict=True):
        if isinstance(answer, BaseException):
            on_missing(worker)
            log.warning("model statistics: worker %s did not answer (%s); left out", worker, answer)
            continue
        for entry in answer.models:
            pair = (entry.model, entry.version)
            if pair in holders and worker in holders[pair]:
                sums[pair].append(entry.totals)
    return [_sum(model, version, totals) for (model, version), totals in sums.items()]


def _sum(model: str, version: str, totals: list[worker_pb2.ReplicaTotals]) -> ModelStats:
    zero = Duration()
    success = fail = queue = c_in = c_infer = c_out = zero
    inferences = executions = last = 0
    batches: dict[int, list[Duration]] = {}
    for t in totals:
        success, fail, queue = (
            success + _duration(t.success),
            fail + _duration(t.fail),
            queue + _duration(t.queue),
        )
        c_in, c_infer = c_in + _duration(t.compute_input), c_infer + _duration(t.compute_infer)
        c_out = c_out + _duration(t.compute_output)
        inferences += t.inference_count
        executions += t.execution_count
        last = max(last, t.last_inference_ms)
        for b in t.batches:
            acc = batches.setdefault(b.batch_size, [zero, zero, zero])
            acc[0] += _duration(b.compute_input)
            acc[1] += _duration(b.compute_infer)
            acc[2] += _duration(b.compute_output)
    return ModelStats(
        name=model,
        version=version,
        last_inference_ms=last,
        inference_count=inferences,
        execution_count=executions,
        success=success,
        fail=fail,
        queue=queue,
        compute_input=c_in,
        compute_infer=c_infer,
        compute_output=c_out,
        batches=tuple(BatchSizeStats(size, *acc) for size, acc in sorted(batches.items())),
    )
