"""Many simulated workers in one process, for the scheduler's scale bench (``make bench`` only).

Each simulated worker is what the scheduler sees of a real one: a record under a lease
(``/mcp/workers/<id>``, with an incarnation), a load report every ``--beat-s`` (one etcd put each, as a
real worker's heartbeat), and a WorkerControl gRPC endpoint of its own whose Load / Resume / Pause /
Unload write the replica record a real worker would (READY, RUNNING, PAUSED, removed). Nothing is
executed: the figures are the control plane's.

Prints one JSON line (``{"workers": N, "incarnation": ...}``) once every endpoint serves and every record
is written, then runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time

import grpc

from mcpapi.v2 import model_pb2, worker_pb2, worker_pb2_grpc
from mcpcore.etcd_store import EtcdStore
from mcpcore.keys import Keyspace
from mcpcore.lifecycle import ReplicaRecord, ReplicaState

GiB = 1 << 30
S = ReplicaState


class SimWorker(worker_pb2_grpc.WorkerControlServicer):
    def __init__(
        self, worker_id: str, store: EtcdStore, keys: Keyspace, incarnation: str, memory: int
    ) -> None:
        self.id = worker_id
        self._store = store
        self._keys = keys
        self._incarnation = incarnation
        self._memory = memory
        self._held: dict[tuple[str, str], int] = {}

    async def _record(
        self, model: str, version: str, state: ReplicaState, memory: int
    ) -> model_pb2.ReplicaStatus:
        """Write the record, and answer with its revision as a real worker does."""
        if memory:
            self._held[(model, version)] = memory  # what it was loaded with, as measured
        held = self._held.get((model, version), self._memory)
        info = {"incarnation": self._incarnation, "memory_bytes": held}
        record = ReplicaRecord(state, time.time(), reason="simulated", info=info)
        revision = await self._store.put(self._keys.replica(model, version, self.id), record.to_json())
        return model_pb2.ReplicaStatus(model=model, version=version, worker_id=self.id, revision=revision)

    async def Load(self, request, context):  # type: ignore[no-untyped-def]
        memory = request.spec.placement.memory_bytes
        return worker_pb2.LoadResponse(
            replica=await self._record(request.model, request.version, S.READY, memory)
        )

    async def Resume(self, request, context):  # type: ignore[no-untyped-def]
        return worker_pb2.ResumeResponse(
            replica=await self._record(request.model, request.version, S.RUNNING, 0)
        )

    async def Pause(self, request, context):  # type: ignore[no-untyped-def]
        return worker_pb2.PauseResponse(
            replica=await self._record(request.model, request.version, S.PAUSED, 0)
        )

    async def Unload(self, request, context):  # type: ignore[no-untyped-def]
        await self._store.delete(self._keys.replica(request.model, request.version, self.id))
        self._held.pop((request.model, request.version), None)
        return worker_pb2.UnloadResponse()


async def main_async(args: argparse.Namespace) -> None:
    keys = Keyspace(args.prefix)
    store = EtcdStore([args.etcd])
    await store.connect()
    lease = await store.grant_lease(10)
    keepalive = store.keep_alive(lease)
    servers = []
    ids = [f"sim-{i:03d}" for i in range(args.workers)]
    for worker_id in ids:
        server = grpc.aio.server()
        worker_pb2_grpc.add_WorkerControlServicer_to_server(
            SimWorker(worker_id, store, keys, args.incarnation, args.replica_bytes), server
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        record = {
            "worker_id": worker_id,
            "grpc": f"127.0.0.1:{port}",
            "zmq": "tcp://127.0.0.1:1",
            "memory_capacity_bytes": args.capacity_gib * GiB,
            "labels": {},
            "incarnation": args.incarnation,
        }
        await store.put(keys.worker(worker_id), json.dumps(record).encode(), lease=lease.id)
    print(json.dumps({"workers": len(ids), "incarnation": args.incarnation}), flush=True)

    async def beat() -> None:  # one put per worker per beat, spread over the beat
        gap = args.beat_s / len(ids)
        while True:
            for worker_id in ids:
                report = {"stopped": "", "last_beat": time.time(), "queue_depth": 0, "in_flight": 0}
                await store.put(keys.worker_load(worker_id), json.dumps(report).encode(), lease=lease.id)
                await asyncio.sleep(gap)

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    beats = asyncio.create_task(beat())
    await stop.wait()
    beats.cancel()
    await keepalive.stop()
    for server in servers:
        await server.stop(0)
    await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--etcd", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--workers", type=int, default=500)
    parser.add_argument("--incarnation", required=True)
    parser.add_argument("--capacity-gib", type=int, default=64)
    parser.add_argument("--replica-bytes", type=int, default=100 << 20)
    parser.add_argument("--beat-s", type=float, default=1.0)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
