"""A real router with a real scheduler and real workers against a real etcd."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml
from harness import (
    ClientLoad,
    RouterProcess,
    SchedulerProcess,
    WorkerProcess,
    etcd_put,
    metric,
    mlp_reference,
    wait_for,
)

from mcpapi.v1 import inference_pb2 as v1
from mcpapi.v1 import inference_pb2_grpc as v1_grpc
from mcpapi.v2 import control_pb2, control_pb2_grpc, inference_pb2, inference_pb2_grpc, model_pb2
from mcpcore import dtypes
from mcpcore.etcd_store import EtcdStore
from mcpcore.keys import Keyspace

X = np.random.default_rng(11).random((3, 64), dtype=np.float32)


def tensor(name: str, arr: np.ndarray) -> inference_pb2.Tensor:
    return inference_pb2.Tensor(
        name=name, dtype=dtypes.wire_value(dtypes.from_numpy(arr.dtype)), shape=arr.shape, data=arr.tobytes()
    )


def infer(stub, model: str, x: np.ndarray = X, **kw) -> tuple[str, np.ndarray]:
    reply = stub.Infer(
        inference_pb2.InferRequest(model=model, inputs=[tensor("INPUT0", x)], **kw), timeout=30
    )
    out = reply.outputs[0]
    return reply.version, np.frombuffer(out.data, np.float32).reshape(tuple(out.shape))


@pytest.fixture(scope="module")
def mesh(tmp_path_factory, etcd_endpoint, repo):
    prefix = f"/t{uuid.uuid4().hex[:8]}/mcp"
    tmp = tmp_path_factory.mktemp("mesh")
    workers = [
        WorkerProcess(
            tmp, etcd_endpoint, repo, prefix=prefix, lease_ttl_s=2, heartbeat_interval_s=0.3
        ).start()
        for _ in range(2)
    ]
    scheduler = SchedulerProcess(tmp, etcd_endpoint, prefix=prefix, reconcile_interval_s=0.5).start()
    router = RouterProcess(tmp, etcd_endpoint, prefix=prefix, scheduler=scheduler.endpoints["grpc"]).start()
    control = control_pb2_grpc.ModelControlStub(scheduler.channel())
    load = [
        model_pb2.ModelSpec(model="demo-mlp", versions=["1", "2"], replicas=1, fallback_version="1"),
        model_pb2.ModelSpec(model="demo-onnx", versions=["1"], replicas=2),
    ]
    for spec in load:
        control.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=60)
    keys = Keyspace(prefix)
    stub = inference_pb2_grpc.InferenceStub(router.channel())
    wait_for(lambda: _serving(stub, "demo-mlp") and _serving(stub, "demo-onnx"), what="routes in the router")
    yield {
        "prefix": prefix,
        "keys": keys,
        "workers": workers,
        "router": router,
        "control": control,
        "stub": stub,
        "scheduler_addr": scheduler.endpoints["grpc"],
    }
    router.stop()
    scheduler.stop()
    for w in workers:
        w.stop()


def _serving(stub, model: str) -> bool:
    try:
        infer(stub, model)
        return True
    except grpc.RpcError:
        return False


def test_v2_and_v1_infer_return_the_models_outputs(mesh, repo):
    version, out = infer(mesh["stub"], "demo-mlp", version="1")
    assert version == "1"
    np.testing.assert_allclose(out, mlp_reference(repo, "demo-mlp", "1", X), rtol=1e-5, atol=1e-5)
    v1_stub = v1_grpc.InferenceStub(mesh["router"].channel())
    reply = v1_stub.Infer(
        v1.InferRequest(
            model="demo-onnx",
            inputs=[v1.Tensor(name="INPUT0", dtype="FP32", shape=X.shape, data=X.tobytes())],
        ),
        timeout=30,
    )
    out = np.frombuffer(reply.outputs[0].data, np.float32).reshape(tuple(reply.outputs[0].shape))
    np.testing.assert_allclose(out, mlp_reference(repo, "demo-mlp", "1", X), rtol=1e-5, atol=1e-5)
    route = mesh["stub"].Route(inference_pb2.RouteRequest(model="demo-onnx", routing_key="user-1"), timeout=5)
    assert route.worker_id in {w.worker_id for w in mesh["workers"]} and route.data_endpoint.startswith(
        "tcp://"
    )


def test_bad_requests_get_clear_statuses(mesh):
    stub = mesh["stub"]
    cases = [
        (dict(model="no-such"), grpc.StatusCode.NOT_FOUND, "no-such"),
        (
            dict(model="demo-mlp", inputs=[tensor("INPUT0", X.astype(np.float64))]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "FP32",
        ),
        (
            dict(
                model="demo-mlp",
                inputs=[inference_pb2.Tensor(name="INPUT0", dtype=11, shape=[3, 64], data=b"\0" * 7)],
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "needs 768",
        ),
    ]
    for fields, code, match in cases:
        fields.setdefault("inputs", [tensor("INPUT0", X)])
        with pytest.raises(grpc.RpcError) as info:
            stub.Infer(inference_pb2.InferRequest(**fields), timeout=10)
        assert info.value.code() == code and match in info.value.details(), info.value.details()


def test_canary_gets_its_share_and_keys_are_sticky(mesh):
    control, stub = mesh["control"], mesh["stub"]
    split = model_pb2.TrafficSplit(stable="1", canary="2", canary_percent=10)
    control.SetTraffic(control_pb2.SetTrafficRequest(model="demo-mlp", traffic=split), timeout=10)
    wait_for(
        lambda: any(infer(stub, "demo-mlp", routing_key=f"probe-{i}")[0] == "2" for i in range(200)),
        what="the canary in force",
    )
    keys = [f"user-{i}" for i in range(1000)]
    with ThreadPoolExecutor(8) as pool:  # concurrent calls on the one channel: the router's real shape

        def version(key: str) -> str:
            return infer(stub, "demo-mlp", x=X[:1], routing_key=key)[0]

        versions = dict(zip(keys, pool.map(version, keys), strict=True))
        share = Counter(versions.values())["2"] / len(versions)
        assert 0.07 <= share <= 0.13, share
        again = dict(zip(keys[:200], pool.map(version, keys[:200]), strict=True))
    assert again == {k: versions[k] for k in keys[:200]}  # sticky: a key keeps its version
    control.SetTraffic(
        control_pb2.SetTrafficRequest(model="demo-mlp", traffic=model_pb2.TrafficSplit(stable="1")),
        timeout=10,
    )


def test_a_flip_written_with_etcdctl_is_applied(mesh, etcd_endpoint):
    keys, stub = mesh["keys"], mesh["stub"]
    etcd_put(etcd_endpoint, keys.model_traffic("demo-mlp"), b'{"stable": "2"}')
    wait_for(lambda: infer(stub, "demo-mlp")[0] == "2", what="version 2 in service")
    etcd_put(etcd_endpoint, keys.model_traffic("demo-mlp"), b'{"stable": "1"}')
    wait_for(lambda: infer(stub, "demo-mlp")[0] == "1", what="version 1 back in service")


def test_breaker_level_3_sends_traffic_to_the_fallback_and_typos_change_nothing(mesh, etcd_endpoint):
    keys, stub, router = mesh["keys"], mesh["stub"], mesh["router"]
    etcd_put(etcd_endpoint, keys.model_traffic("demo-mlp"), b'{"stable": "2"}')
    wait_for(lambda: infer(stub, "demo-mlp")[0] == "2", what="version 2 in service")
    etcd_put(etcd_endpoint, keys.breaker("demo-mlp"), json.dumps({"level": 3, "reason": "drill"}).encode())
    wait_for(lambda: infer(stub, "demo-mlp")[0] == "1", what="the fallback version in service")
    etcd_put(etcd_endpoint, keys.breaker("demo-mlp"), b'{"level": 3')  # a typo: not JSON
    etcd_put(etcd_endpoint, keys.breaker("demo-mlp"), b'{"level": 7}')  # out of range
    wait_for(
        lambda: re.search(r'mcp_config_rejected_total\{key="breaker"\} ([2-9]|\d\d)', router.metrics_text()),
        what="both rejections counted",
    )
    assert all(infer(stub, "demo-mlp")[0] == "1" for _ in range(20))  # the last good level stays
    etcd_put(etcd_endpoint, keys.breaker("demo-mlp"), b'{"level": 0}')
    wait_for(lambda: infer(stub, "demo-mlp")[0] == "2", what="the breaker closed")
    etcd_put(etcd_endpoint, keys.model_traffic("demo-mlp"), b'{"stable": "1"}')


def test_stats_reach_etcd_for_the_health_service(mesh, etcd_endpoint):
    keys, router = mesh["keys"], mesh["router"]
    infer(mesh["stub"], "demo-onnx")  # its own request: the window (stats_window_s) forgets old ones

    async def read() -> dict | None:
        async with EtcdStore([etcd_endpoint]) as store:
            kv = await store.get(keys.stats(router.router_id, "demo-onnx"))
            doc = None if kv is None else json.loads(kv.value)
            return doc if doc and doc["requests"] >= 1 else None

    doc = wait_for(lambda: asyncio.run(read()), what="stats published")
    assert {"timeout", "resource", "backend", "client"} <= set(doc)


def test_a_worker_killed_mid_stream_loses_no_request(tmp_path, etcd_endpoint, repo):
    prefix = f"/t{uuid.uuid4().hex[:8]}/mcp"
    workers = [
        WorkerProcess(
            tmp_path, etcd_endpoint, repo, prefix=prefix, lease_ttl_s=1, heartbeat_interval_s=0.3
        ).start()
        for _ in range(2)
    ]
    scheduler = SchedulerProcess(tmp_path, etcd_endpoint, prefix=prefix, reconcile_interval_s=0.5).start()
    router = RouterProcess(tmp_path, etcd_endpoint, prefix=prefix).start()
    try:
        control = control_pb2_grpc.ModelControlStub(scheduler.channel())
        control.LoadModel(
            control_pb2.LoadModelRequest(
                spec=model_pb2.ModelSpec(model="demo-onnx", versions=["1"], replicas=2)
            ),
            timeout=60,
        )
        stub = inference_pb2_grpc.InferenceStub(router.channel())
        wait_for(lambda: _serving(stub, "demo-onnx"), what="the route")
        with ClientLoad(lambda key: infer(stub, "demo-onnx", x=X[:1], routing_key=key)) as load:
            wait_for(lambda: load.ok > 200, what="traffic flowing")
            workers[0].kill()
            before = load.ok
            wait_for(lambda: load.ok > before + 300, timeout_s=30, what="traffic after the kill")
        assert load.failures == []
    finally:
        router.stop()
        scheduler.stop()
        for w in workers:
            w.stop()


@pytest.mark.parametrize(("model", "version"), [("demo-mlp", "1"), ("demo-onnx", "")])
def test_tritonclient_works_against_the_router_unchanged(mesh, repo, model, version):
    """Triton's own client, in its own process (its service_pb2 and ours share the 'inference' names)."""
    args = [
        sys.executable,
        str(Path(__file__).with_name("triton_client_script.py")),
        mesh["router"].endpoints["grpc"],
    ]
    args += ["--model", model, "--version", version]
    args += ["--repo-model", "demo-slow"] if model == "demo-onnx" else ["--no-repository"]

    def refused_by_workers() -> float:
        return sum(
            metric(w.metrics_text(), "mcp_requests_total", api_version="zmq", outcome="INVALID_ARGUMENT")
            for w in mesh["workers"]
        )

    refused_before = refused_by_workers()
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    batch = np.array(report["input"], dtype=np.float32)
    expected = mlp_reference(repo, "demo-mlp", "1", batch)  # demo-onnx/1 is the same MLP as demo-mlp/1
    np.testing.assert_allclose(
        np.array(report["infer"]["values"], np.float32), expected, rtol=1e-5, atol=1e-5
    )
    assert report["infer"]["model_name"] == model and report["infer"]["shape"] == [4, 16]
    errors = report["errors"]
    assert "NOT_FOUND" in errors["unknown_model"]["status"]
    assert "INVALID_ARGUMENT" in errors["bytes_input"]["status"]
    assert "INVALID_ARGUMENT" in errors["unknown_output"]["status"]
    assert "has no output(s) ['NO_SUCH_OUTPUT']" in errors["unknown_output"]["message"]
    assert "INVALID_ARGUMENT" in errors["unknown_input"]["status"]
    assert "expects inputs ['INPUT0']" in errors["unknown_input"]["message"]
    assert "INVALID_ARGUMENT" in errors["wrong_shape"]["status"]
    assert "expected shape [-1, 64], got [4, 63]" in errors["wrong_shape"]["message"]
    assert refused_by_workers() == refused_before  # every one refused by the router, before any hop
    if model == "demo-onnx":
        assert report["repository"]["after_unload"]["ready"] is False
    _assert_model_config(report, repo, model, version or "1")
    _assert_statistics(report, model, version or "1")
    stream = report["streaming"]  # ModelStreamInfer: each answer its own, the bad one in-band
    assert set(stream["ok"]) == {"s0", "s1", "s2"}
    for rid, values in stream["ok"].items():
        batch = np.array(stream["inputs"][rid], dtype=np.float32)
        expected = mlp_reference(repo, "demo-mlp", "1", batch)
        np.testing.assert_allclose(np.array(values, np.float32), expected, rtol=1e-5, atol=1e-5)
    assert len(stream["errors"]) == 1 and "has no output(s) ['NO_SUCH_OUTPUT']" in stream["errors"][0]


def _assert_statistics(report, model: str, version: str) -> None:  # type: ignore[no-untyped-def]
    """Triton's statistics, summed from the workers, moved by what the script ran between two reads:
    its 2 successful requests of 4 + 1 rows, each queued and computed, none failed."""

    def entry(stats):  # type: ignore[no-untyped-def]
        [only] = [s for s in stats["model_stats"] if s["name"] == model and s["version"] == version]
        return only

    before, after = entry(report["statistics_before"]), entry(report["statistics_after"])

    def grew(*path: str) -> int:
        def get(doc):  # type: ignore[no-untyped-def]
            for key in path:
                doc = doc.get(key, {})
            return int(doc or 0)

        return get(after) - get(before)

    assert grew("inference_stats", "success", "count") == 2  # bad requests never reached a worker
    assert grew("inference_stats", "fail", "count") == 0
    assert grew("inference_count") == 5
    assert 1 <= grew("execution_count") <= grew("inference_stats", "success", "count")
    assert grew("inference_stats", "queue", "count") == grew("inference_stats", "success", "count")
    assert grew("inference_stats", "queue", "ns") > 0 and grew("inference_stats", "compute_infer", "ns") > 0
    assert grew("inference_stats", "success", "ns") >= grew("inference_stats", "compute_infer", "ns") > 0
    assert int(after["last_inference"]) > 0
    assert any(int(b["batch_size"]) >= 1 for b in after["batch_stats"])
    names = {(s["name"], s["version"]) for s in report["statistics_all"]["model_stats"]}
    assert (model, version) in names and ("demo-mlp", "2") in names  # every serving version
    assert "NOT_FOUND" in report["statistics_unknown_version"]["status"]


def _assert_model_config(report, repo, model: str, version: str) -> None:  # type: ignore[no-untyped-def]
    """Triton's ModelConfig, as tritonclient parsed it, says what the version's model.yaml says."""
    spec = yaml.safe_load((repo / model / version / "model.yaml").read_text())
    config = report["model_config"]["config"]
    assert config["name"] == model
    assert int(config.get("max_batch_size", 0)) == spec["max_batch_size"]
    assert [(i["name"], i["data_type"], [int(d) for d in i["dims"]]) for i in config["input"]] == [
        ("INPUT0", "TYPE_FP32", [64])  # the batch dimension left out, as Triton's dims do
    ]
    assert ("OUTPUT0", "TYPE_FP32", [16]) in [
        (o["name"], o["data_type"], [int(d) for d in o["dims"]]) for o in config["output"]
    ]
    batching, declared = config["dynamic_batching"], spec["dynamic_batching"]
    assert int(batching.get("max_queue_delay_microseconds", 0)) == declared["max_queue_delay_us"]
    assert [int(n) for n in batching.get("preferred_batch_size", [])] == declared.get(
        "preferred_batch_sizes", []
    )
    assert int(batching["default_queue_policy"]["max_queue_size"]) == declared["max_queue_size"]
    assert version in config["version_policy"]["specific"]["versions"]
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert config["backend"] == {"onnx": "onnxruntime"}.get(spec["backend"], spec["backend"])
    assert "NOT_FOUND" in report["unknown_model_config"]["status"]
    assert "NOT_FOUND" in report["unknown_version_config"]["status"]
    assert "no version 99" in report["unknown_version_config"]["message"]


def test_mcpctl_operates_the_cluster(mesh):
    """The operator CLI as a real subprocess against the real scheduler and router."""
    addr = [
        "--scheduler",
        mesh["scheduler_addr"],
        "--router",
        mesh["router"].endpoints["grpc"],
        "--health",
        "127.0.0.1:1",
    ]

    def mcpctl(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "mcpclient.mcpctl", *addr, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    status = mcpctl("status")
    assert status.returncode == 0, status.stderr
    assert "demo-mlp" in status.stdout and "RUNNING" in status.stdout and "did not answer" in status.stdout
    infer = mcpctl("infer", "demo-onnx", "--key", "k1")
    assert infer.returncode == 0 and infer.stdout.startswith("demo-onnx/1 on ")
    assert ["OUTPUT0", "FP32", "[1,", "16]"] in [line.split()[:4] for line in infer.stdout.splitlines()]
    route = json.loads(mcpctl("-o", "json", "route", "demo-onnx", "--key", "k1").stdout)
    assert route["version"] == "1" and route["endpoint"].startswith("tcp://")
    bad = mcpctl("traffic", "demo-onnx", "1", "--canary", "1", "--percent", "10")
    assert bad.returncode == 1 and "canary" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    missing = mcpctl("infer", "no-such-model")
    assert missing.returncode == 1 and "no-such-model" in missing.stderr


@pytest.mark.parametrize(
    ("protocol", "shm"), [("grpc", False), ("http", False), ("grpc", True)], ids=["grpc", "http", "grpc-shm"]
)
def test_perf_analyzer_measures_the_router(mesh, protocol, shm):
    """Triton's perf_analyzer (installed by make setup) starts against the router and measures it: it
    reads the model's metadata and config first, then runs a bounded closed loop with no errors, and
    reads the server's side from the statistics."""
    perf_analyzer = Path(__file__).resolve().parents[2] / "tools" / "perf_analyzer"
    endpoint = mesh["router"].endpoints["grpc" if protocol == "grpc" else "rest"]
    command = [str(perf_analyzer), "-m", "demo-mlp", "-i", protocol, "-u", endpoint]
    command += ["--concurrency-range", "4", "--measurement-interval", "500", "--max-trials", "4"]
    command += ["--stability-percentage", "100"]  # a short bounded run: what matters is that it runs
    if shm:  # inputs and outputs in system shared memory regions perf_analyzer registers with the router
        command += ["--shared-memory", "system"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    throughput = re.search(r"Throughput: ([0-9.]+) infer/sec", out)
    assert throughput is not None and float(throughput.group(1)) > 0, out[-3000:]
    assert "error" not in out.lower(), out[-3000:]
    served = re.search(r"Successful request count: ([0-9]+)", out)
    assert served is not None and int(served.group(1)) > 0, out[-3000:]
