"""Placement respects the room a worker's GPU has for it (``device_room_bytes`` in its load report: the
device's memory less what other processes hold), end to end: a real scheduler process, a real etcd, and
two simulated workers (``bench/sim_workers.py``'s ``SimWorker``: the records and replica writes of a real
worker, no model code) served from this test.

The workers are simulated rather than real worker processes because a real worker rewrites its load report
every heartbeat from its own NVML readings (none on a CPU-only host): here the test writes each report, so
the figure the scheduler reads is the one the test chose. The worker's side (the figure a real worker
reports from NVML) is tests/unit/test_worker_device_room.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from pathlib import Path

import grpc
import pytest
from harness import SchedulerProcess

from mcpapi.v2 import control_pb2, control_pb2_grpc, model_pb2, worker_pb2_grpc
from mcpcore.etcd_store import EtcdStore
from mcpcore.keys import Keyspace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from sim_workers import SimWorker  # noqa: E402

MiB = 1 << 20
CAPACITY = 1024 * MiB  # both workers: equal capacity, so only the measurement tells them apart


def _spec(model: str, mib: int) -> model_pb2.ModelSpec:
    placement = model_pb2.PlacementConstraints(memory_bytes=mib * MiB)
    return model_pb2.ModelSpec(model=model, versions=["1"], replicas=1, placement=placement)


async def test_placement_goes_by_the_room_its_gpu_has_and_says_so_when_short(tmp_path, etcd_endpoint):
    prefix, incarnation = f"/t{uuid.uuid4().hex[:8]}/mcp", uuid.uuid4().hex[:12]
    keys = Keyspace(prefix)
    servers: list[grpc.aio.Server] = []
    scheduler = SchedulerProcess(tmp_path, etcd_endpoint, prefix=prefix, leader_ttl_s=2)
    async with EtcdStore([etcd_endpoint], timeout=5.0) as store:
        lease = await store.grant_lease(10)
        keepalive = store.keep_alive(lease)

        async def report(worker: str, room_mib: int) -> None:
            body = {"stopped": "", "last_beat": time.time(), "device_room_bytes": room_mib * MiB}
            await store.put(keys.worker_load(worker), json.dumps(body).encode(), lease=lease.id)

        try:
            # gpu-a sorts first, so on equal book figures it would win: others leave 100 MiB on its GPU
            for worker, room_mib in (("gpu-a", 100), ("gpu-b", 900)):
                server = grpc.aio.server()
                worker_pb2_grpc.add_WorkerControlServicer_to_server(
                    SimWorker(worker, store, keys, incarnation, 0), server
                )
                port = server.add_insecure_port("127.0.0.1:0")
                await server.start()
                servers.append(server)
                record = {
                    "worker_id": worker, "grpc": f"127.0.0.1:{port}", "zmq": "tcp://127.0.0.1:1",
                    "memory_capacity_bytes": CAPACITY, "labels": {}, "incarnation": incarnation,
                }  # fmt: skip
                await store.put(keys.worker(worker), json.dumps(record).encode(), lease=lease.id)
                await report(worker, room_mib)
            await asyncio.to_thread(scheduler.start)
            async with grpc.aio.insecure_channel(scheduler.endpoints["grpc"]) as channel:
                stub = control_pb2_grpc.ModelControlStub(channel)
                request = control_pb2.LoadModelRequest(spec=_spec("fits-b", 300))
                status = (await stub.LoadModel(request, timeout=30)).status
                assert [(r.worker_id, r.state) for r in status.replicas] == [("gpu-b", model_pb2.RUNNING)]

                # other processes take more of both GPUs: the book still shows room on both; gpu-b's
                # figure leaves out the 300 MiB its own copy holds (they stay its to count)
                await report("gpu-a", 50)
                await report("gpu-b", 400)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.LoadModel(control_pb2.LoadModelRequest(spec=_spec("too-big", 200)), timeout=30)
                assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                details = info.value.details()
                assert "cannot place too-big/1" in details
                assert "gpu-b has 100.0 MiB free (other processes leave 0.4 GiB on its GPU)" in details
                assert "gpu-a 50.0 MiB (other processes leave 50.0 MiB on its GPU)" in details
        finally:
            await asyncio.to_thread(scheduler.stop)
            for server in servers:
                await server.stop(0)
            await keepalive.stop()
            await store.revoke_lease(lease.id)
