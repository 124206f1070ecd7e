"""Chaos soak (``make chaos``): workers killed and restarted under load for a while; no request may fail.

The suite keeps a short version of this (tests/integration/test_router.py kills one worker mid-stream);
this one runs ``MCP_CHAOS_SECONDS`` (default 120) of load against three workers, killing one (kill -9 or
SIGSTOP for a while) every few seconds and bringing a fresh one back, with the scheduler and health
service recovering replicas as they go.

The etcd outages of tests/integration/test_delivery.py (10 s there) run here for
``MCP_CHAOS_ETCD_OUTAGE_S`` (default 60): etcd frozen, then killed and restarted, under checked load.
"""

from __future__ import annotations

import os
import random
import signal
import time
import uuid

import grpc
import numpy as np
import pytest
from harness import (
    ClientLoad,
    HealthProcess,
    RouterProcess,
    SchedulerProcess,
    WorkerProcess,
    make_demo_repository,
    wait_for,
)
from meshload import CheckedLoad, Mesh

from mcpapi.v2 import control_pb2, control_pb2_grpc, inference_pb2, inference_pb2_grpc, model_pb2
from mcpcore import dtypes

pytestmark = pytest.mark.slow
SECONDS = float(os.environ.get("MCP_CHAOS_SECONDS", "120"))
OUTAGE_S = float(os.environ.get("MCP_CHAOS_ETCD_OUTAGE_S", "60"))
X = np.random.default_rng(5).random((1, 64), dtype=np.float32)


def _infer(stub: inference_pb2_grpc.InferenceStub, key: str) -> None:
    t = inference_pb2.Tensor(name="INPUT0", dtype=dtypes.wire_value("FP32"), shape=[1, 64], data=X.tobytes())
    stub.Infer(inference_pb2.InferRequest(model="demo-onnx", routing_key=key, inputs=[t]), timeout=30)


@pytest.mark.timeout(SECONDS + 300)
def test_no_request_fails_while_workers_die_and_come_back(tmp_path, etcd_endpoint):
    repo = make_demo_repository(tmp_path / "models")
    prefix = f"/chaos{uuid.uuid4().hex[:6]}/mcp"
    flags = {"lease_ttl_s": 1, "heartbeat_interval_s": 0.3}
    workers = [WorkerProcess(tmp_path, etcd_endpoint, repo, prefix=prefix, **flags).start() for _ in range(3)]
    scheduler = SchedulerProcess(tmp_path, etcd_endpoint, prefix=prefix, reconcile_interval_s=0.5).start()
    health = HealthProcess(tmp_path, etcd_endpoint, prefix=prefix, check_interval_s=0.2).start()
    router = RouterProcess(tmp_path, etcd_endpoint, prefix=prefix).start()
    rng = random.Random(7)
    try:
        control = control_pb2_grpc.ModelControlStub(scheduler.channel())
        spec = model_pb2.ModelSpec(model="demo-onnx", versions=["1"], replicas=2)
        control.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=60)
        stub = inference_pb2_grpc.InferenceStub(router.channel())
        wait_for(lambda: _ok(stub), what="the model routable")
        with ClientLoad(lambda key: _infer(stub, key)) as load:
            _chaos(
                rng,
                workers,
                lambda: WorkerProcess(tmp_path, etcd_endpoint, repo, prefix=prefix, **flags).start(),
            )
        assert load.failures == [], (
            f"{len(load.failures)} failed of {load.ok + len(load.failures)}: {load.failures[:5]}"
        )
        assert load.ok > 100
    finally:
        for proc in (router, health, scheduler, *workers):
            proc.stop()


def _chaos(rng: random.Random, workers: list[WorkerProcess], new_worker) -> None:  # type: ignore[no-untyped-def]
    """For SECONDS: every few seconds one live worker is killed or frozen a while, and a fresh one joins."""
    deadline = time.monotonic() + SECONDS
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(3, 6))  # the chaos schedule itself, not a synchronisation
        victim = rng.choice([w for w in workers if w.proc and w.proc.poll() is None])
        if rng.random() < 0.5:
            victim.kill()
        else:
            os.kill(victim.proc.pid, signal.SIGSTOP)
            time.sleep(rng.uniform(1.5, 3))
            os.kill(victim.proc.pid, signal.SIGCONT)
        workers.append(new_worker())


def _ok(stub: inference_pb2_grpc.InferenceStub) -> bool:
    try:
        _infer(stub, "probe")
        return True
    except grpc.RpcError:
        return False


@pytest.mark.timeout(2 * OUTAGE_S + 300)
@pytest.mark.parametrize("outage", ["frozen", "killed"])
def test_a_long_etcd_outage_is_invisible_to_clients(tmp_path, outage):
    """etcd frozen (SIGSTOP) or killed for OUTAGE_S under load: nothing fails, nothing runs twice, and the
    mesh is back at its replica counts with records that match the workers after it returns."""
    repo = make_demo_repository(tmp_path / "models")
    mesh = Mesh(tmp_path, repo)
    wanted = {"demo-mlp": 2, "demo-stateful": 2}
    try:
        for model, replicas in wanted.items():
            mesh.load(model, replicas)
        wait_for(lambda: mesh.consistent(wanted), 30, 0.1, "the mesh at its replica counts")
        channel = mesh.channel()
        with CheckedLoad(channel, "demo-mlp", repo) as mlp, CheckedLoad(channel, "demo-stateful", repo) as st:
            mlp.wait_ok(50)
            if outage == "frozen":
                os.kill(mesh.etcd.proc.pid, signal.SIGSTOP)
                time.sleep(OUTAGE_S)  # the fault's length
                os.kill(mesh.etcd.proc.pid, signal.SIGCONT)
            else:
                mesh.etcd.kill()
                time.sleep(OUTAGE_S)  # the fault's length
                mesh.etcd.start()
            wait_for(lambda: mesh.consistent(wanted), 60, 0.2, "the mesh back at its replica counts")
            mlp.wait_ok(100)
            st.wait_ok(100)
        for result in (mlp.result, st.result):
            assert (result.failures, result.wrong) == ([], []), result.failures[:5]
        assert mesh.duplicates("demo-stateful") == []
        print(f"etcd {outage} {OUTAGE_S:.0f}s: {mlp.result.ok} + {st.result.ok} answered, none failed")
    finally:
        mesh.close()
