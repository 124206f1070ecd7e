"""ModelStatistics' collection from workers (``mcp_router.model_stats``) over real gRPC: summed per
version, and a worker that does not answer is left out, counted, and does not fail the call."""

from __future__ import annotations

import asyncio
import time

import grpc.aio
import pytest

from mcp_router import model_stats
from mcpapi.v2 import worker_pb2, worker_pb2_grpc


def _totals(success: int, rows: int, infer_ns: int) -> worker_pb2.ReplicaTotals:
    d = worker_pb2.Duration
    return worker_pb2.ReplicaTotals(
        success=d(count=success, ns=10 * infer_ns),
        queue=d(count=success, ns=infer_ns),
        compute_infer=d(count=success, ns=infer_ns),
        inference_count=rows,
        execution_count=1,
        last_inference_ms=1_000 + success,
        batches=[worker_pb2.BatchSizeTotals(batch_size=rows, compute_infer=d(count=1, ns=infer_ns))],
    )


class _Worker(worker_pb2_grpc.WorkerControlServicer):
    def __init__(self, models: list[worker_pb2.ModelVersionStats], *, hang: bool = False) -> None:
        self.models, self.hang, self.asked = models, hang, []

    async def Stats(self, request, context):  # type: ignore[no-untyped-def]
        self.asked.append(request.model)
        if self.hang:
            await asyncio.sleep(30)
        return worker_pb2.StatsResponse(models=self.models)


@pytest.fixture
async def workers():
    servers, addresses, servicers = [], {}, {}
    specs = {
        "w1": _Worker([worker_pb2.ModelVersionStats(model="m", version="1", totals=_totals(3, 5, 100))]),
        "w2": _Worker(
            [
                worker_pb2.ModelVersionStats(model="m", version="1", totals=_totals(2, 2, 50)),
                worker_pb2.ModelVersionStats(model="m", version="2", totals=_totals(7, 7, 70)),
            ]
        ),
        "frozen": _Worker([], hang=True),
    }
    for name, servicer in specs.items():
        server = grpc.aio.server()
        worker_pb2_grpc.add_WorkerControlServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        addresses[name], servicers[name] = f"127.0.0.1:{port}", servicer
    yield addresses, servicers
    for server in servers:
        await server.stop(None)


async def test_totals_are_summed_per_version_over_the_workers_that_serve_it(workers):
    addresses, servicers = workers
    wanted = {("m", "1"): ["w1", "w2"], ("m", "2"): ["w2"]}
    one, two = await model_stats.collect(wanted, addresses, timeout_s=5)
    assert (one.name, one.version, two.version) == ("m", "1", "2")
    assert one.success.count == 5 and one.success.ns == 10 * (100 + 50)
    assert one.inference_count == 7 and one.execution_count == 2 and one.last_inference_ms == 1_003
    assert [(b.batch_size, b.compute_infer.count) for b in one.batches] == [(2, 1), (5, 1)]
    assert two.success.count == 7 and two.compute_infer.ns == 70
    assert servicers["w1"].asked == ["m"]  # one model asked for: the workers report only it


async def test_a_replica_the_table_does_not_route_to_is_not_counted(workers):
    addresses, _ = workers
    [one] = await model_stats.collect({("m", "1"): ["w1"]}, addresses, timeout_s=5)
    assert one.success.count == 3  # w2 also holds m/1, but the table does not route to it


async def test_a_worker_that_does_not_answer_is_left_out_and_counted(workers):
    addresses, _ = workers
    missing: list[str] = []
    started = time.monotonic()
    [one] = await model_stats.collect(
        {("m", "1"): ["w1", "frozen"]}, addresses, timeout_s=0.5, on_missing=missing.append
    )
    assert time.monotonic() - started < 5
    assert one.success.count == 3 and missing == ["frozen"]


async def test_a_worker_without_an_address_is_left_out(workers):
    addresses, _ = workers
    missing: list[str] = []
    [one] = await model_stats.collect(
        {("m", "2"): ["w2", "gone"]}, addresses, timeout_s=1, on_missing=missing.append
    )
    assert one.success.count == 7 and missing == ["gone"]
