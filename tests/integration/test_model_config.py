"""Per-version truth through the real router: ModelMetadata and ModelConfig describe the version asked
for (versions compared as integers), and without a version the one a request without one goes to."""

from __future__ import annotations

import shutil

import grpc
import pytest
import yaml
from harness import small_mesh

from mcpapi.kserve import grpc_service_pb2 as kserve
from mcpapi.kserve import grpc_service_pb2_grpc as kserve_grpc
from mcpapi.v2 import inference_pb2, inference_pb2_grpc


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, etcd_endpoint, repo):
    tmp = tmp_path_factory.mktemp("config")
    models = tmp / "models"
    (models / "two").mkdir(parents=True)
    shutil.copy(repo / "keyring.json", models / "keyring.json")
    for version, batch in (("9", 4), ("10", 16)):  # "10" sorts before "9" as a string
        shutil.copytree(repo / "demo-mlp" / "1", models / "two" / version)
        path = models / "two" / version / "model.yaml"
        spec = yaml.safe_load(path.read_text())
        spec["max_batch_size"] = batch
        spec["dynamic_batching"]["preferred_batch_sizes"] = [batch]
        path.write_text(yaml.safe_dump(spec))
    with small_mesh(tmp, etcd_endpoint, models, "two", ["9", "10"]) as mesh:
        channel = mesh.router.channel()
        yield kserve_grpc.GRPCInferenceServiceStub(channel), inference_pb2_grpc.InferenceStub(channel)


def test_each_version_has_its_own_config_and_versions_are_integers(cluster):
    stub, _ = cluster
    for version, batch in (("9", 4), ("10", 16)):
        config = stub.ModelConfig(kserve.ModelConfigRequest(name="two", version=version), timeout=5).config
        assert config.max_batch_size == batch
        assert list(config.dynamic_batching.preferred_batch_size) == [batch]
        assert list(config.version_policy.specific.versions) == [9, 10]
    meta = stub.ModelMetadata(kserve.ModelMetadataRequest(name="two", version="9"), timeout=5)
    assert list(meta.versions) == ["9", "10"]  # integer order, not "10" < "9"


def test_without_a_version_the_config_is_the_routed_versions(cluster):
    stub, v2 = cluster
    routed = v2.Route(inference_pb2.RouteRequest(model="two"), timeout=5).version
    config = stub.ModelConfig(kserve.ModelConfigRequest(name="two"), timeout=5).config
    assert config.max_batch_size == {"9": 4, "10": 16}[routed]


def test_unknown_model_and_version_are_not_found(cluster):
    stub, _ = cluster
    for request, words in (
        (kserve.ModelConfigRequest(name="nope"), "model nope is not loaded"),
        (kserve.ModelConfigRequest(name="two", version="11"), "no version 11"),
    ):
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelConfig(request, timeout=5)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND and words in info.value.details()
