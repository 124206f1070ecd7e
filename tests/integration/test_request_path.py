"""The request path through a real router, scheduler and workers: statuses, breaker level 2, weights, bounds.

Each test goes through a real entry point (the router's v2 and KServe gRPC, etcd keys, /metrics) and checks
the claim against the process that holds the truth (the worker's counters, the router's metrics).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import threading
import uuid
from collections import Counter
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml
from harness import (
    RouterProcess,
    SchedulerProcess,
    WorkerProcess,
    etcd_put,
    make_demo_repository,
    metric,
    mlp_reference,
    wait_for,
)

from mcpapi.kserve import grpc_service_pb2 as kserve
from mcpapi.kserve import grpc_service_pb2_grpc as kserve_grpc
from mcpapi.v2 import control_pb2, control_pb2_grpc, inference_pb2, inference_pb2_grpc, model_pb2
from mcpcore import dtypes
from mcpcore.etcd_store import EtcdStore
from mcpcore.keys import Keyspace
from mcpcore.transport.grpc_status import NOT_STARTED_METADATA

X = np.random.default_rng(3).random((2, 64), dtype=np.float32)


def add_limited_model(repo: Path) -> None:
    """``slow-limited``: demo-slow (50 ms a batch), at most 2 requests in flight per replica."""
    shutil.copytree(repo / "demo-slow", repo / "slow-limited")
    path = repo / "slow-limited" / "1" / "model.yaml"
    config = yaml.safe_load(path.read_text())
    config["max_ongoing_requests"] = 2
    path.write_text(yaml.safe_dump(config))


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = make_demo_repository(tmp_path_factory.mktemp("repo") / "models")
    add_limited_model(repo)
    return repo


@pytest.fixture(scope="module")
def mesh(tmp_path_factory, etcd_endpoint, repo):
    prefix = f"/t{uuid.uuid4().hex[:8]}/mcp"
    tmp = tmp_path_factory.mktemp("mesh")
    flags = {"lease_ttl_s": 2, "heartbeat_interval_s": 0.3}
    workers = [
        WorkerProcess(tmp, etcd_endpoint, repo, prefix=prefix, capacity=capacity, **flags).start()
        for capacity in (1, 3)
    ]
    scheduler = SchedulerProcess(tmp, etcd_endpoint, prefix=prefix, reconcile_interval_s=0.3).start()
    router = RouterProcess(tmp, etcd_endpoint, prefix=prefix, scheduler="").start()
    control = control_pb2_grpc.ModelControlStub(scheduler.channel())
    for model, versions, replicas in (
        ("demo-mlp", ["1", "2"], 2),
        ("demo-onnx", ["1"], 1),
        ("slow-limited", ["1"], 1),
    ):
        spec = model_pb2.ModelSpec(model=model, versions=versions, replicas=replicas)
        control.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=60)
    stub = inference_pb2_grpc.InferenceStub(router.channel())
    wait_for(lambda: _serves(stub, "demo-mlp") and _serves(stub, "slow-limited"), what="the routes")
    yield {"prefix": prefix, "keys": Keyspace(prefix), "workers": workers, "router": router,
           "control": control, "stub": stub, "etcd": etcd_endpoint}  # fmt: skip
    router.stop()
    scheduler.stop()
    for w in workers:
        w.stop()


def _request(model: str, x: np.ndarray = X, **kw) -> inference_pb2.InferRequest:  # type: ignore[no-untyped-def]
    dtype = dtypes.wire_value(dtypes.from_numpy(x.dtype))
    t = inference_pb2.Tensor(name="INPUT0", dtype=dtype, shape=x.shape, data=x.tobytes())
    return inference_pb2.InferRequest(model=model, inputs=[t], **kw)


def _outputs(reply: inference_pb2.InferResponse) -> dict[str, np.ndarray]:
    return {o.name: np.frombuffer(o.data, np.float32).reshape(tuple(o.shape)) for o in reply.outputs}


def _serves(stub, model: str) -> bool:  # type: ignore[no-untyped-def]
    try:
        stub.Infer(_request(model), timeout=10)
        return True
    except grpc.RpcError:
        return False


def test_statuses_say_what_the_client_got_wrong_and_count_nothing_against_breakers(mesh):
    stub, router = mesh["stub"], mesh["router"]
    found, invalid = grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT
    cases = [
        (_request("no-such-model"), found, "no-such-model is not loaded"),
        (_request("demo-mlp", version="7"), found, r"has no version 7; it declares \['1', '2'\]"),
        (_request("demo-mlp", x=X.astype(np.float64)), invalid, "expected dtype FP32"),  # said by the worker
    ]
    for request, code, match in cases:
        with pytest.raises(grpc.RpcError) as info:
            stub.Infer(request, timeout=10)
        assert info.value.code() == code and re.search(match, info.value.details()), info.value.details()
    # KServe's priority is 64-bit: one past the header's range is the client's mistake, not INTERNAL
    kstub = kserve_grpc.GRPCInferenceServiceStub(router.channel())
    req = kserve.ModelInferRequest(model_name="demo-mlp", model_version="1", raw_input_contents=[X.tobytes()])
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[2, 64])
    req.parameters["priority"].uint64_param = 1 << 40
    with pytest.raises(grpc.RpcError) as info:
        kstub.ModelInfer(req, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "priority" in info.value.details()
    # metric labels only name models that exist; the window the health service reads counts them as client
    text = router.metrics_text()
    assert "no-such-model" not in text and 'model="_unknown"' in text
    assert 'version="7"' not in text

    async def stats() -> dict:
        async with EtcdStore([mesh["etcd"]]) as store:
            kv = await store.get(mesh["keys"].stats(router.router_id, "demo-mlp"))
            return json.loads(kv.value) if kv else {}

    doc = wait_for(lambda: (s := asyncio.run(stats())) and s.get("client", 0) >= 3 and s, what="stats")
    assert doc["unavailable"] == doc["backend"] == doc["timeout"] == 0  # nothing server-side


def test_a_declared_version_that_is_not_running_is_unavailable(mesh):
    control, stub = mesh["control"], mesh["stub"]
    control.PauseModel(control_pb2.PauseModelRequest(model="demo-mlp", version="2"), timeout=30)
    try:
        ready = kserve_grpc.GRPCInferenceServiceStub(mesh["router"].channel()).ModelReady
        # the router learns of the pause from etcd: until then the worker answers "paused" (not started)
        wait_for(
            lambda: not ready(kserve.ModelReadyRequest(name="demo-mlp", version="2"), timeout=5).ready,
            what="the router to see demo-mlp/2 paused",
        )
        with pytest.raises(grpc.RpcError) as info:
            stub.Infer(_request("demo-mlp", version="2"), timeout=10)
        assert (
            info.value.code() == grpc.StatusCode.UNAVAILABLE and "no RUNNING replica" in info.value.details()
        )
        assert NOT_STARTED_METADATA in (info.value.trailing_metadata() or ())  # safe to send again
    finally:
        control.ResumeModel(control_pb2.ResumeModelRequest(model="demo-mlp", version="2"), timeout=30)


def test_breaker_level_2_drops_the_secondary_output_and_its_work(mesh, repo):
    stub, keys, workers = mesh["stub"], mesh["keys"], mesh["workers"]

    def macs() -> float:
        return sum(metric(w.metrics_text(), "mcp_worker_macs_total", model="demo-mlp") for w in workers)

    def outputs(model: str) -> dict[str, np.ndarray]:
        return _outputs(stub.Infer(_request(model, version="1"), timeout=10))

    full = outputs("demo-mlp")
    assert set(full) == {"OUTPUT0", "RANK0"} and set(outputs("demo-onnx")) == {"OUTPUT0", "RANK0"}
    before = macs()
    for _ in range(20):
        outputs("demo-mlp")
    per_request_full = (macs() - before) / 20
    etcd_put(mesh["etcd"], keys.breaker("demo-mlp"), {"level": 2, "reason": "drill"})
    etcd_put(mesh["etcd"], keys.breaker("demo-onnx"), {"level": 2, "reason": "drill"})
    try:
        wait_for(lambda: set(outputs("demo-mlp")) == {"OUTPUT0"}, what="RANK0 gone at level 2")
        wait_for(lambda: set(outputs("demo-onnx")) == {"OUTPUT0"}, what="RANK0 gone from the ONNX model")
        before = macs()
        for _ in range(20):
            primary = outputs("demo-mlp")
        per_request_level2 = (macs() - before) / 20
        np.testing.assert_allclose(primary["OUTPUT0"], mlp_reference(repo, "demo-mlp", "1", X), rtol=1e-5)
        named = stub.Infer(_request("demo-mlp", version="1", outputs=["OUTPUT0", "RANK0"]), timeout=10)
        assert [o.name for o in named.outputs] == ["OUTPUT0"]  # asked for by name: left out, not an error
        assert per_request_level2 == 2 * (64 * 256 + 256 * 16)  # only fc1 and fc2 ran
        assert per_request_full == per_request_level2 + 2 * (256 * 64 + 64 * 8)  # the head costs that much
    finally:
        etcd_put(mesh["etcd"], keys.breaker("demo-mlp"), {"level": 0})
        etcd_put(mesh["etcd"], keys.breaker("demo-onnx"), {"level": 0})
    wait_for(lambda: "RANK0" in outputs("demo-mlp"), what="RANK0 back at level 0")


def test_a_record_of_another_incarnation_routes_nothing_and_a_bad_worker_record_breaks_nothing(mesh):
    """Records are claims: a RUNNING record written by an earlier process under a worker's id (another
    incarnation) is not followed, and a worker record no socket could use is rejected, not fatal."""
    stub, keys, etcd = mesh["stub"], mesh["keys"], mesh["etcd"]
    router = mesh["router"]
    holders = {w.worker_id for w in mesh["workers"] if "slow-limited" in w.metrics_text()}
    other = next(w.worker_id for w in mesh["workers"] if w.worker_id not in holders)
    phantom = {"state": "RUNNING", "since": 0, "reason": "", "transitions": [],
               "info": {"incarnation": "an-earlier-process", "idempotent": True}}  # fmt: skip
    etcd_put(etcd, keys.replica("slow-limited", "1", other), phantom)
    etcd_put(etcd, keys.worker("bad-1"), {"zmq": "tcp://no-port", "grpc": "x:1"})
    etcd_put(etcd, keys.replica("demo-mlp", "1", "bad-1"), {**phantom, "info": {"incarnation": ""}})
    try:
        wait_for(
            lambda: metric(router.metrics_text(), "mcp_config_rejected_total", key="worker") >= 1,
            what="the bad worker record rejected",
        )
        route = inference_pb2.RouteRequest(model="slow-limited", version="1")
        for i in range(200):
            route.routing_key = f"k{i}"
            assert stub.Route(route, timeout=5).worker_id in holders  # never the phantom's worker
        assert set(_outputs(stub.Infer(_request("demo-mlp", version="1"), timeout=10))) == {
            "OUTPUT0",
            "RANK0",
        }
    finally:
        asyncio.run(_delete(etcd, keys.replica("slow-limited", "1", other), keys.worker("bad-1"),
                            keys.replica("demo-mlp", "1", "bad-1")))  # fmt: skip


async def _delete(endpoint: str, *keys: str) -> None:
    async with EtcdStore([endpoint]) as store:
        for key in keys:
            await store.delete(key)


def test_virtual_nodes_follow_each_workers_capacity(mesh):
    stub = mesh["stub"]
    small, big = (w.worker_id for w in mesh["workers"])  # capacity 1 and 3
    route = inference_pb2.RouteRequest(model="demo-mlp", version="1")
    picks: Counter[str] = Counter()
    for i in range(1000):
        route.routing_key = f"user-{i}"
        picks[stub.Route(route, timeout=5).worker_id] += 1
    assert set(picks) == {small, big}
    assert 0.65 <= picks[big] / 1000 <= 0.85, picks  # 3 of 4 units of capacity: ~75% of the keys


def test_max_ongoing_requests_refuses_the_overflow_fast_and_says_it_did_not_start(mesh):
    stub = mesh["stub"]
    results: list[str] = []
    lock = threading.Lock()

    def call() -> None:
        try:
            stub.Infer(_request("slow-limited", x=X[:1]), timeout=10)
            outcome = "OK"
        except grpc.RpcError as err:
            started = NOT_STARTED_METADATA not in (err.trailing_metadata() or ())
            outcome = f"{err.code().name}: {err.details()} (started: {started})"
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=call) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    refused = [r for r in results if r != "OK"]
    assert results.count("OK") >= 2 and refused, results  # 2 in flight per replica, one replica
    for r in refused:
        assert r.startswith("UNAVAILABLE: exceeds maximum queue size") and "max_ongoing_requests" in r, r
        assert r.endswith("(started: False)")
    overflow = metric(mesh["router"].metrics_text(), "mcp_router_overflow_total", model="slow-limited")
    assert overflow >= len(refused)  # the scheduler's signal for another copy


def test_a_reply_after_the_deadline_is_dropped_and_counted_and_the_next_gets_its_own(mesh, repo):
    stub, router = mesh["stub"], mesh["router"]
    late_before = metric(router.metrics_text(), "mcp_router_late_replies_total")
    with pytest.raises(grpc.RpcError) as info:  # 50 ms of work, 20 ms of time: the router gives up
        stub.Infer(_request("slow-limited", x=X[:1], timeout_us=20_000), timeout=10)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_for(
        lambda: metric(router.metrics_text(), "mcp_router_late_replies_total") > late_before,
        what="the late reply dropped and counted",
    )
    reply = stub.Infer(_request("slow-limited", x=X[1:2], request_id="again"), timeout=10)
    assert reply.request_id == "again"
    want = mlp_reference(repo, "demo-mlp", "1", X[1:2])
    np.testing.assert_allclose(_outputs(reply)["OUTPUT0"], want, rtol=1e-5, atol=1e-5)


def test_every_service_measures_its_event_loop(mesh):
    for proc in (mesh["router"], *mesh["workers"]):
        assert metric(proc.metrics_text(), "mcp_event_loop_lag_seconds_count") > 0
