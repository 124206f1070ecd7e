"""The worker's replica transitions run through the lifecycle's hooks (DESIGN.md section 5): warm-up on
READY, admission on RUNNING, memory release on IDLE. A real worker process and a real etcd, driven over
gRPC control and ZeroMQ tensors; each claim is checked against what the worker does."""

from __future__ import annotations

import uuid

import grpc
import numpy as np
import pytest
import yaml
from harness import TensorClient, WorkerProcess, etcd_get, make_demo_repository
from onnx import TensorProto, helper, numpy_helper

from mcpapi.v2 import worker_pb2
from mcpcore import wire
from mcpcore.errors import Unavailable
from mcpcore.keys import Keyspace

X = np.random.default_rng(3).random((2, 64), dtype=np.float32)
MiB = 1 << 20


def _warm_up_fails(target) -> None:  # type: ignore[no-untyped-def]
    """An ONNX model that loads (its signature fits model.yaml) but fails on every run, the warm-up's
    first: it reshapes 4 values per row into rows of 3."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["INPUT0", "shape"], ["OUTPUT0"])],
        "warm-up-fails",
        inputs=[helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 4])],
        outputs=[helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 3])],
        initializer=[numpy_helper.from_array(np.array([-1, 3], np.int64), name="shape")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what the worker's onnxruntime reads (tools/make_models.py's)
    target.mkdir(parents=True)
    (target / "model.onnx").write_bytes(model.SerializeToString())
    doc = {
        "backend": "onnx",
        "max_batch_size": 8,
        "inputs": [{"name": "INPUT0", "dtype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "OUTPUT0", "dtype": "FP32", "shape": [-1, 3]}],
        "memory_bytes": MiB,
        "weights": "model.onnx",
    }
    (target / "model.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


@pytest.fixture(scope="module")
def worker(tmp_path_factory, etcd_endpoint):
    repo = make_demo_repository(tmp_path_factory.mktemp("repo") / "models")
    _warm_up_fails(repo / "warm-up-fails" / "1")
    # room for one demo-onnx version (4 MiB declared) and the small model, not for two demo-onnx
    proc = WorkerProcess(
        tmp_path_factory.mktemp("worker"), etcd_endpoint, repo, prefix=f"/t{uuid.uuid4().hex[:8]}/mcp",
        memory_capacity_bytes=6 * MiB,
    ).start()  # fmt: skip
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def control(worker):
    return worker.control()


@pytest.fixture
def client(worker):
    with TensorClient(worker.endpoints["zmq"]) as c:
        yield c


def _record(worker, etcd_endpoint, model: str, version: str = "1") -> dict:  # type: ignore[no-untyped-def]
    record = etcd_get(etcd_endpoint, Keyspace(worker.prefix).replica(model, version, worker.worker_id))
    assert record is not None
    return record


def _used(control) -> int:  # type: ignore[no-untyped-def]
    return control.Stats(worker_pb2.StatsRequest(), timeout=10).memory_used_bytes


def test_a_replica_takes_requests_only_while_running(worker, etcd_endpoint, control, client):
    control.Load(worker_pb2.LoadRequest(model="demo-onnx", version="1"), timeout=30)
    assert _record(worker, etcd_endpoint, "demo-onnx")["state"] == "READY"
    client.send("demo-onnx", {"INPUT0": X}, version="1")
    reply = client.recv().header  # loaded and warmed up, not admitted: not started, a router may retry
    assert reply.status_code == int(Unavailable.code) and reply.flags & wire.FLAG_RETRYABLE
    assert "not serving yet" in reply.status_message

    control.Resume(worker_pb2.ResumeRequest(model="demo-onnx", version="1"), timeout=10)
    assert client.infer("demo-onnx", {"INPUT0": X}, version="1").named()["OUTPUT0"].shape == (2, 16)

    control.Pause(worker_pb2.PauseRequest(model="demo-onnx", version="1"), timeout=10)
    with pytest.raises(Unavailable, match="demo-onnx/1 is paused"):
        client.infer("demo-onnx", {"INPUT0": X}, version="1")
    control.Unload(worker_pb2.UnloadRequest(model="demo-onnx", version="1"), timeout=30)


def test_a_failed_warm_up_keeps_the_replica_out_of_ready(worker, etcd_endpoint, control):
    before = _used(control)
    with pytest.raises(grpc.RpcError) as failed:
        control.Load(worker_pb2.LoadRequest(model="warm-up-fails", version="1"), timeout=30)
    assert failed.value.code() == grpc.StatusCode.INTERNAL
    assert "warm-up-fails" in (failed.value.details() or "")
    record = _record(worker, etcd_endpoint, "warm-up-fails")
    assert record["state"] == "ERROR" and record["reason"].startswith("load failed")
    assert [t["to"] for t in record["transitions"]] == ["LOADING", "ERROR"]  # never READY
    stats = control.Stats(worker_pb2.StatsRequest(), timeout=10)
    assert stats.memory_used_bytes == before and not [m for m in stats.models if m.model == "warm-up-fails"]


def test_an_unload_releases_the_memory_it_held(worker, etcd_endpoint, control):
    before = _used(control)
    control.Load(worker_pb2.LoadRequest(model="demo-onnx", version="1"), timeout=30)
    assert _used(control) >= before + 4 * MiB
    with pytest.raises(grpc.RpcError) as full:  # a second copy does not fit beside the first
        control.Load(worker_pb2.LoadRequest(model="demo-onnx", version="2"), timeout=30)
    assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    control.Unload(worker_pb2.UnloadRequest(model="demo-onnx", version="1"), timeout=30)
    assert _record(worker, etcd_endpoint, "demo-onnx")["state"] == "IDLE" and _used(control) == before
    control.Load(worker_pb2.LoadRequest(model="demo-onnx", version="2"), timeout=30)  # it fits now
    control.Unload(worker_pb2.UnloadRequest(model="demo-onnx", version="2"), timeout=30)
