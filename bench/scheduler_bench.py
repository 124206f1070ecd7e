"""Scheduler figure for ``make bench``: LoadModel -> RUNNING latency, through the scheduler vs direct.

(Reconcile at scale is ``scheduler_scale_bench.py``: real scheduler processes, not the planner alone.)
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc

from mcp_devcluster.localetcd import EtcdServer
from mcpapi.v2 import control_pb2, control_pb2_grpc, model_pb2, worker_pb2

ROOT = Path(__file__).resolve().parents[1]
GiB, MiB = 1 << 30, 1 << 20


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
