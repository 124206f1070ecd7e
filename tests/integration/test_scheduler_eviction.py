"""Room freed by an eviction goes to the model it was made for, not back to the model it came from.

A real scheduler process and two simulated workers (``bench/sim_workers.py``: records as a real worker
writes them) of 1 GiB each, full with a low-priority model's two copies. A high-priority model arrives:
one low copy is evicted, and the high one must be RUNNING soon after, within LoadModel's 20 s (the
scale runs' schedulers resync only every 10 minutes), while the low model waits. The rule behind it (room
freed: the models waiting for room are planned first, before the model it came from, which would take it
back) is pinned deterministically in tests/unit/test_reconciler_queue.py; here other events (the
model's own status write) may also requeue it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import grpc

from mcpapi.v2 import control_pb2, control_pb2_grpc, model_pb2

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from scheduler_scale_bench import Cluster  # noqa: E402

MiB = 1 << 20


def _spec(model: str, replicas: int, priority: int) -> model_pb2.ModelSpec:
    return model_pb2.ModelSpec(
        model=model, versions=["1"], replicas=replicas, priority=priority,
        placement=model_pb2.PlacementConstraints(memory_bytes=600 * MiB),
    )  # fmt: skip


def test_an_eviction_makes_room_for_the_model_it_was_for(tmp_path):
    cluster = Cluster(tmp_path, 2, capacity_gib=1)
    try:
        scheduler = cluster.scheduler()
        stub = control_pb2_grpc.ModelControlStub(grpc.insecure_channel(scheduler.endpoints["grpc"]))
        stub.LoadModel(control_pb2.LoadModelRequest(spec=_spec("low", 2, 0)), timeout=30)
        status = stub.LoadModel(control_pb2.LoadModelRequest(spec=_spec("high", 1, 10)), timeout=20).status
        assert [r.state for r in status.replicas] == [model_pb2.RUNNING]
        low = stub.GetModelStatus(control_pb2.GetModelStatusRequest(model="low"), timeout=10).status
        assert len(low.replicas) == 1 and "cannot place low/1" in low.pending  # it waits, it did not win
    finally:
        cluster.close()
