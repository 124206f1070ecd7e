"""Where a model runs, through a real worker, scheduler and router: an ONNX model that asks for a GPU
(``device: gpu``) on this machine, whose onnxruntime has no CUDA provider, runs on the CPU only when its
model.yaml allows it (``cpu_fallback: true``), and says so in its replica record; otherwise its load
fails with what to install. ``instance_count`` copies serve behind one queue and Triton's ModelConfig
shows them. (The CUDA provider itself runs in tests/gpu, on a GPU machine.)"""

from __future__ import annotations

import shutil

import grpc
import numpy as np
import pytest
import yaml
from harness import etcd_get, mlp_reference, small_mesh

from mcpapi.kserve import grpc_service_pb2 as kserve
from mcpapi.kserve import grpc_service_pb2_grpc as kserve_grpc
from mcpapi.kserve import model_config_pb2 as mc
from mcpapi.v2 import control_pb2, control_pb2_grpc, model_pb2
from mcpcore.keys import Keyspace

X = np.random.default_rng(3).standard_normal((3, 64)).astype(np.float32)


def _variant(repo, models, name: str, **settings) -> None:  # type: ignore[no-untyped-def]
    shutil.copytree(repo / "demo-onnx" / "1", models / name / "1")
    path = models / name / "1" / "model.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), **settings}))


@pytest.fixture(scope="module")
def mesh(tmp_path_factory, etcd_endpoint, repo):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("devices")
    models = tmp / "models"
    models.mkdir()
    shutil.copy(repo / "keyring.json", models / "keyring.json")
    _variant(repo, models, "onnx-gpu-or-cpu", device="gpu", cpu_fallback=True, instance_count=2)
    _variant(repo, models, "onnx-gpu-only", device="gpu")
    with small_mesh(tmp, etcd_endpoint, models, "onnx-gpu-or-cpu", ["1"]) as mesh:
        yield mesh


def _infer(channel: grpc.Channel, model: str) -> np.ndarray:
    request = kserve.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=list(X.shape))
    request.raw_input_contents.append(X.tobytes())
    request.outputs.add(name="OUTPUT0")
    reply = kserve_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert tensor.name == "INPUT0" and reply.outputs[0].name == "OUTPUT0"
    return np.frombuffer(reply.raw_output_contents[0], np.float32).reshape(reply.outputs[0].shape)


def test_a_gpu_model_allowed_to_fall_back_serves_on_the_cpu_and_says_why(mesh, repo, etcd_endpoint):  # type: ignore[no-untyped-def]
    np.testing.assert_allclose(
        _infer(mesh.router.channel(), "onnx-gpu-or-cpu"),
        mlp_reference(repo, "demo-mlp", "1", X),
        rtol=1e-4,
        atol=1e-5,
    )
    record = etcd_get(
        etcd_endpoint, Keyspace(mesh.worker.prefix).replica("onnx-gpu-or-cpu", "1", mesh.worker.worker_id)
    )
    config = record["info"]["config"]
    assert record["state"] == "RUNNING" and config["device"] == "cpu" and config["device_id"] is None
    assert "CUDAExecutionProvider" in config["cpu_fallback"] and config["instance_count"] == 2
    assert "runs on the CPU" in mesh.worker.log.read_text()  # the operator's warning
    stub = kserve_grpc.GRPCInferenceServiceStub(mesh.router.channel())
    triton = stub.ModelConfig(kserve.ModelConfigRequest(name="onnx-gpu-or-cpu"), timeout=5).config
    (group,) = triton.instance_group
    assert (group.count, group.kind) == (2, mc.ModelInstanceGroup.KIND_CPU)


def test_a_gpu_model_without_fallback_fails_its_load_saying_what_to_install(mesh):  # type: ignore[no-untyped-def]
    """Through the scheduler, as an operator loads it: LoadModel fails with the worker's words, and the
    worker goes on serving the rest."""
    control = control_pb2_grpc.ModelControlStub(mesh.scheduler.channel())
    spec = model_pb2.ModelSpec(model="onnx-gpu-only", versions=["1"], replicas=1)
    with pytest.raises(grpc.RpcError) as info:
        control.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # its one worker failed it: no other
    details = info.value.details()
    assert f"{mesh.worker.worker_id} failed to load it: load failed: " in details
    for words in ("device: gpu", "no CUDAExecutionProvider", "onnxruntime-gpu", "cpu_fallback: true"):
        assert words in details
    _infer(mesh.router.channel(), "onnx-gpu-or-cpu")
