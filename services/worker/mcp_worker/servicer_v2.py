"""``mcpapi.v2.WorkerControl``: a thin adapter from protobuf to ``ModelManager`` and back.

Validation of names and versions happens in the manager (``keys.check_*``); errors are ``MCPError``s that
the shared error mapping turns into statuses. Every call that changes state first passes the fence
(``mcpcore.fencing.FenceCheck``): a call from a deposed scheduler or health leader is refused before it
touches anything. No other logic lives here.
"""

from __future__ import annotations

import time

import grpc

from mcp_worker.batching.model_statistics import Totals
from mcp_worker.models import ModelManager
from mcp_worker.replica import LoadOverrides, Replica
from mcpapi.v2 import model_pb2, worker_pb2, worker_pb2_grpc
from mcpcore import dtypes
from mcpcore.errors import InvalidArgument
from mcpcore.fencing import FenceCheck

__all__ = ["WorkerControlServicer"]


def replica_status(replica: Replica) -> model_pb2.ReplicaStatus:
    return model_pb2.ReplicaStatus(
        model=replica.rid.model,
        version=replica.rid.version,
        worker_id=replica.rid.worker,
        state=model_pb2.ModelState.Value(replica.state.value),
        since_unix_ms=int(replica.since * 1000),
        reason=replica.reason,
        revision=replica.record.revision if replica.record else 0,
    )


def _overrides(request: worker_pb2.LoadRequest) -> LoadOverrides | None:
    if not request.HasField("spec"):
        return None
    spec = request.spec
    return LoadOverrides(
        memory_bytes=spec.placement.memory_bytes if spec.HasField("placement") else 0,
        max_batch_size=spec.batching.max_batch_size if spec.HasField("batching") else 0,
        max_queue_delay_us=(
            spec.batching.max_queue_delay_us
            if spec.HasField("batching") and spec.batching.max_queue_delay_us
            else None
        ),
        priority=spec.priority or None,
        latency_sensitivity=spec.qos.latency_sensitivity if spec.HasField("qos") else None,
    )


def _tensors(specs) -> list[model_pb2.TensorMetadata]:  # type: ignore[no-untyped-def]
    return [
        model_pb2.TensorMetadata(name=t.name, dtype=dtypes.wire_value(t.dtype), shape=list(t.shape))
        for t in specs
    ]


class WorkerControlServicer(worker_pb2_grpc.WorkerControlServicer):
    def __init__(self, manager: ModelManager, fence: FenceCheck) -> None:
        self._m = manager
        self._fence = fence

    async def Load(self, request, context: grpc.aio.ServicerContext):  # type: ignore[no-untyped-def]
        await self._fence.check(context.invocation_metadata(), f"Load {request.model}/{request.version}")
        if request.model_path:
            raise InvalidArgument(
                "model_path is not accepted by this worker: models load from its repository only "
                "(<repository>/<model>/<version>)"
            )
        replica = await self._m.load(request.model, request.version, _overrides(request))
        return worker_pb2.LoadResponse(
            replica=replica_status(replica),
            memory_bytes=replica.memory_bytes,
            inputs=_tensors(replica.config.inputs),
            outputs=_tensors(replica.config.outputs),
        )

    async def Unload(self, request, context):  # type: ignore[no-untyped-def]
        await self._fence.check(context.invocation_metadata(), f"Unload {request.model}/{request.version}")
        return worker_pb2.UnloadResponse(
            replica=replica_status(await self._m.unload(request.model, request.version))
        )

    async def Pause(self, request, context):  # type: ignore[no-untyped-def]
        await self._fence.check(context.invocation_metadata(), f"Pause {request.model}/{request.version}")
        replica = await self._m.pause(request.model, request.version)
        return worker_pb2.PauseResponse(
            replica=replica_status(replica), queued=replica.queue.stats().queue_depth
        )

    async def Resume(self, request, context):  # type: ignore[no-untyped-def]
        await self._fence.check(context.invocation_metadata(), f"Resume {request.model}/{request.version}")
        return worker_pb2.ResumeResponse(
            replica=replica_status(await self._m.resume(request.model, request.version))
        )

    async def EmergencyStop(self, request, context):  # type: ignore[no-untyped-def]
        await self._fence.check(context.invocation_metadata(), "EmergencyStop")
        held = [replica_status(r) for r in self._m.replicas()]
        checkpoint = await self._m.emergency_stop(request.reason)
        for status in held:
            status.state = model_pb2.ERROR
        return worker_pb2.EmergencyStopResponse(
            checkpoint_path=checkpoint["path"],
            in_flight=len(checkpoint["in_flight"]),
            last_active_unix_ms=int(checkpoint["last_active"] * 1000),
            replicas=held,
        )

    async def Stats(self, request, context):  # type: ignore[no-untyped-def]
        models = []
        for replica in self._m.replicas():
            if request.model and replica.rid.model != request.model:
                continue
            q = replica.queue.stats()
            models.append(
                worker_pb2.ModelVersionStats(
                    model=replica.rid.model,
                    version=replica.rid.version,
                    state=model_pb2.ModelState.Value(replica.state.value),
                    queue_depth=q.queue_depth,
                    batch_utilization=q.batch_utilization,
                    memory_bytes=replica.memory_bytes,
                    mean_exec_us=int(q.mean_exec_s * 1e6),
                    in_flight=q.in_flight,
                    max_batch_size=replica.max_batch_size,  # in force: a breaker may halve it
                    requests_total=q.requests_total,
                    totals=_totals(replica.queue.totals),
                )
            )
        return worker_pb2.StatsResponse(
            worker_id=self._m.worker_id,
            models=models,
            memory_capacity_bytes=self._m.budget.capacity,
            memory_used_bytes=self._m.budget.used,
            as_of_unix_ms=int(time.time() * 1000),
        )


def _totals(t: Totals) -> worker_pb2.ReplicaTotals:
    d = worker_pb2.Duration
    return worker_pb2.ReplicaTotals(
        success=d(count=t.success_count, ns=t.success_ns),
        fail=d(count=t.fail_count, ns=t.fail_ns),
        queue=d(count=t.queue_count, ns=t.queue_ns),
        compute_input=d(count=t.compute_count, ns=t.compute_input_ns),
        compute_infer=d(count=t.compute_count, ns=t.compute_infer_ns),
        compute_output=d(count=t.compute_count, ns=t.compute_output_ns),
        inference_count=t.inference_count,
        execution_count=t.execution_count,
        last_inference_ms=t.last_inference_ms,
        batches=[
            worker_pb2.BatchSizeTotals(
                batch_size=size,
                compute_input=d(count=b.count, ns=b.input_ns),
                compute_infer=d(count=b.count, ns=b.infer_ns),
                compute_output=d(count=b.count, ns=b.output_ns),
            )
            for size, b in sorted(t.batches.items())
        ],
    )
