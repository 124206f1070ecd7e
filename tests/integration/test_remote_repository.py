"""A real worker process whose model repository is a URL: the published demo repository over HTTP
(``http.server`` in a thread) and in S3 (moto's server), loaded through the worker's gRPC Load and served
over ZeroMQ; a tampered file fails its load into ERROR while the models already loaded keep serving, and a
second load comes from the worker's cache.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from harness import TensorClient, WorkerProcess, etcd_get, load_and_run, make_demo_repository, mlp_reference
from repo_servers import S3_ENV, RepoHTTPServer, S3Server

from mcpapi.v2 import worker_pb2
from mcpcore.keys import Keyspace

X = np.random.default_rng(11).random((3, 64), dtype=np.float32)
W1 = "models/demo-mlp/1/weights.safetensors"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo_repository(tmp_path_factory.mktemp("demo") / "models")


@pytest.fixture
def served(demo: Path, tmp_path: Path) -> Iterator[tuple[RepoHTTPServer, Path]]:
    shutil.copytree(demo, tmp_path / "www" / "models")
    with RepoHTTPServer(tmp_path / "www") as server:
        yield server, tmp_path / "www" / "models"


def _worker(tmp_path: Path, etcd_endpoint: str, repository: str, **env: str) -> WorkerProcess:
    prefix = f"/t{uuid.uuid4().hex[:8]}/mcp"
    proc = WorkerProcess(
        tmp_path, etcd_endpoint, repository, prefix=prefix, repository_cache=tmp_path / "cache",
        keyring=tmp_path / "www" / "models" / "keyring.json",
    )  # fmt: skip
    proc.env.update(env)
    return proc


def test_worker_loads_from_http_caches_and_fails_a_tampered_model_into_error(
    served, tmp_path: Path, etcd_endpoint: str
) -> None:
    server, folder = served
    data = bytearray((folder / "demo-mlp/2/weights.safetensors").read_bytes())
    data[100] ^= 0x01
    (folder / "demo-mlp/2/weights.safetensors").write_bytes(bytes(data))  # after the manifest was written
    yaml_path = folder / "demo-onnx/1/model.yaml"
    yaml_path.write_text(yaml_path.read_text().replace("max_batch_size: 64", "max_batch_size: 32"))
    proc = _worker(tmp_path, etcd_endpoint, server.url + "models").start()
    try:
        control = proc.control()
        load_and_run(control, "demo-mlp", "1")
        with TensorClient(proc.endpoints["zmq"]) as client:
            got = client.infer("demo-mlp", {"INPUT0": X}, version="1").named()["OUTPUT0"]
            np.testing.assert_allclose(got, mlp_reference(folder, "demo-mlp", "1", X), rtol=1e-4, atol=1e-5)

            with pytest.raises(grpc.RpcError) as caught:
                control.Load(worker_pb2.LoadRequest(model="demo-mlp", version="2"), timeout=30)
            assert caught.value.code() == grpc.StatusCode.DATA_LOSS
            details = caught.value.details() or ""
            assert (
                f"{server.url}models/demo-mlp/2/weights.safetensors" in details and "manifest says" in details
            )
            record = etcd_get(etcd_endpoint, Keyspace(proc.prefix).replica("demo-mlp", "2", proc.worker_id))
            assert record is not None and record["state"] == "ERROR" and "manifest says" in record["reason"]
            # a model.yaml unlike its manifest: refused before anything is reserved, and ERROR too
            with pytest.raises(grpc.RpcError) as caught:
                control.Load(worker_pb2.LoadRequest(model="demo-onnx", version="1"), timeout=30)
            assert caught.value.code() == grpc.StatusCode.DATA_LOSS
            assert "models/demo-onnx/1/model.yaml" in (caught.value.details() or "")
            record = etcd_get(etcd_endpoint, Keyspace(proc.prefix).replica("demo-onnx", "1", proc.worker_id))
            assert record is not None and record["state"] == "ERROR" and "model.yaml" in record["reason"]
            # the model already loaded goes on serving
            again = client.infer("demo-mlp", {"INPUT0": X}, version="1").named()["OUTPUT0"]
            np.testing.assert_array_equal(again, got)

            # unload and load again: from the cache, nothing downloaded twice
            control.Unload(worker_pb2.UnloadRequest(model="demo-mlp", version="1"), timeout=30)
            load_and_run(control, "demo-mlp", "1")
            np.testing.assert_array_equal(
                client.infer("demo-mlp", {"INPUT0": X}, version="1").named()["OUTPUT0"], got
            )
        assert server.hits[W1] == 1 and server.hits["models/demo-mlp/1/model.yaml"] == 1
        assert server.hits["models/demo-mlp/1/manifest.json"] == 4  # config and load, twice
    finally:
        proc.stop()


def test_worker_loads_an_encrypted_model_from_s3(demo: Path, tmp_path: Path, etcd_endpoint: str) -> None:
    shutil.copytree(demo, tmp_path / "www" / "models")  # the keyring the worker reads
    with S3Server() as s3:
        s3.upload(demo, "fleet-models", "mesh", only=("index.json", "demo-mlp-enc/1"))
        proc = _worker(tmp_path, etcd_endpoint, "s3://fleet-models/mesh", **s3.env).start()
        try:
            load_and_run(proc.control(), "demo-mlp-enc", "1")
            with TensorClient(proc.endpoints["zmq"]) as client:
                got = client.infer("demo-mlp-enc", {"INPUT0": X}, version="1").named()["OUTPUT0"]
            np.testing.assert_allclose(got, mlp_reference(demo, "demo-mlp", "1", X), rtol=1e-4, atol=1e-5)
        finally:
            proc.stop()
    cached = list((tmp_path / "cache" / "sha256").iterdir())
    blob = (demo / "demo-mlp-enc/1/weights.safetensors.enc").read_bytes()
    assert any(p.read_bytes() == blob for p in cached)  # still encrypted in the cache
    assert S3_ENV["AWS_SECRET_ACCESS_KEY"] not in proc.log.read_text()
