"""Scheduler figures for ``make bench``: reconcile time at scale, and LoadModel -> RUNNING latency."""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc

from mcp_scheduler import docs
from mcp_scheduler.plan import LoadReplica, plan
from mcp_scheduler.state import ClusterState
from mcp_scheduler.view import ModelSpecDoc
from mcpapi.v2 import control_pb2, control_pb2_grpc, model_pb2, worker_pb2
from mcpclient.localetcd import EtcdServer
from mcpcore.etcd_store import EtcdStore
from mcpcore.keys import Keyspace
from mcpcore.lifecycle import ReplicaRecord, ReplicaState

ROOT = Path(__file__).resolve().parents[1]
GiB, MiB = 1 << 30, 1 << 20


async def _fill(store: EtcdStore, keys: Keyspace, models: int, workers: int) -> None:
    for w in range(workers):
        record = {"worker_id": f"w{w}", "grpc": f"127.0.0.1:{20000 + w}", "zmq": "tcp://127.0.0.1:1",
                  "memory_capacity_bytes": 64 * GiB, "labels": {}}  # fmt: skip
        await store.put(keys.worker(f"w{w}"), json.dumps(record).encode())
        await store.put(
            keys.worker_load(f"w{w}"), json.dumps({"stopped": "", "last_beat": time.time()}).encode()
        )
    for m in range(models):
        spec = ModelSpecDoc(model=f"m{m:04d}", versions=("1",), replicas=1, memory_bytes=100 * MiB)
        await store.put(keys.model_spec(spec.model), docs.spec_to_json(spec))


async def _round(store: EtcdStore, keys: Keyspace) -> tuple[float, int]:
    started = time.perf_counter()
    state = ClusterState(store, keys)
    await state.start()
    result = plan(state.view())
    elapsed = time.perf_counter() - started
    await state.stop()
    return elapsed, len(result.actions)


async def _reconcile(endpoint: str, models: int, workers: int) -> dict[str, float]:
    keys = Keyspace(f"/bench{uuid.uuid4().hex[:6]}/mcp")
    async with EtcdStore([endpoint]) as store:
        await _fill(store, keys, models, workers)
        first_s, actions = await _round(store, keys)
        # converge as a perfect cluster would: every planned load RUNNING, every routing published
        state = ClusterState(store, keys)
        await state.start()
        for action in plan(state.view()).actions:
            if isinstance(action, LoadReplica):
                record = ReplicaRecord(ReplicaState.RUNNING, time.time(), info={"memory_bytes": 100 * MiB})
                await store.put(keys.replica(action.model, action.version, action.worker), record.to_json())
        await state.stop()
        for m in range(models):
            await store.put(keys.model_routing(f"m{m:04d}"), b'{"stable": "1"}')
        steady_s, steady_actions = await _round(store, keys)
    print(
        f"reconcile, {models} models on {workers} workers (etcd list + view + plan): first round "
        f"{first_s:.3f} s ({actions} actions), converged round {steady_s:.3f} s ({steady_actions} actions)"
    )
    return {
        "reconcile_1000_models_s": round(first_s, 4),
        "reconcile_1000_models_steady_s": round(steady_s, 4),
    }


def bench_reconcile(repo: Path, seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        etcd = EtcdServer(Path(tmp) / "etcd")
        etcd.start()
        try:
            return asyncio.run(_reconcile(etcd.endpoint, 1000, 10))
        finally:
            etcd.stop()


def bench_load_to_running(repo: Path, seconds: float) -> dict[str, float]:
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    from harness import SchedulerProcess, WorkerProcess  # noqa: PLC0415  (test tooling, only here)

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        etcd = EtcdServer(tmp / "etcd")
        etcd.start()
        prefix = f"/bench{uuid.uuid4().hex[:6]}/mcp"
        worker = WorkerProcess(tmp, etcd.endpoint, repo, prefix=prefix).start()
        scheduler = None
        try:
            control = worker.control()
            direct, through = [], []
            for _ in range(5):  # the baseline first: no scheduler may act on these replicas meanwhile
                t0 = time.perf_counter()
                control.Load(worker_pb2.LoadRequest(model="demo-mlp", version="1"), timeout=30)
                control.Resume(worker_pb2.ResumeRequest(model="demo-mlp", version="1"), timeout=30)
                direct.append(time.perf_counter() - t0)
                control.Unload(worker_pb2.UnloadRequest(model="demo-mlp", version="1"), timeout=30)
            scheduler = SchedulerProcess(tmp, etcd.endpoint, prefix=prefix).start()
            stub = control_pb2_grpc.ModelControlStub(grpc.insecure_channel(scheduler.endpoints["grpc"]))
            for _ in range(5):
                t0 = time.perf_counter()
                spec = model_pb2.ModelSpec(model="demo-mlp", versions=["1"], replicas=1)
                stub.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=60)
                through.append(time.perf_counter() - t0)
                stub.UnloadModel(control_pb2.UnloadModelRequest(model="demo-mlp"), timeout=60)
        finally:
            if scheduler is not None:
                scheduler.stop()
            worker.stop()
            etcd.stop()
    ms, base = statistics.median(through) * 1e3, statistics.median(direct) * 1e3
    print(f"LoadModel -> RUNNING, demo MLP: median {ms:.0f} ms through the scheduler vs {base:.0f} ms "
          f"calling the worker directly ({ms / base:.1f}x)")  # fmt: skip
    return {"load_to_running_ms": round(ms, 1), "load_to_running_direct_ms": round(base, 1)}
