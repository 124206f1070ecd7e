"""System shared memory through a real router, over gRPC and REST: inputs read from and outputs written
into a client's POSIX shared memory region; every bad registration or reference is a clear client error;
CUDA shared memory is UNAVAILABLE."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from multiprocessing import shared_memory

import grpc
import numpy as np
import pytest
from harness import mlp_reference, small_mesh

from mcpapi.kserve import grpc_service_pb2 as pb
from mcpapi.kserve import grpc_service_pb2_grpc as pb_grpc

X = np.random.default_rng(9).standard_normal((2, 64), dtype=np.float32)
OUT_BYTES = 2 * 16 * 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, etcd_endpoint, repo):
    with small_mesh(tmp_path_factory.mktemp("shm"), etcd_endpoint, repo, "demo-mlp", ["1"]) as mesh:
        stub = pb_grpc.GRPCInferenceServiceStub(mesh.router.channel())
        yield stub, mesh.router.endpoints["rest"], mesh.router.endpoints["grpc"]


@pytest.fixture
def region():
    """A POSIX shared memory object holding X, with room for the output after it."""
    shm = shared_memory.SharedMemory(
        name=f"mcp-test-{uuid.uuid4().hex[:8]}", create=True, size=X.nbytes + 4096
    )
    shm.buf[: X.nbytes] = X.tobytes()
    yield shm
    shm.close()
    shm.unlink()


def _shm_params(message, region: str, size: int, offset: int = 0) -> None:  # type: ignore[no-untyped-def]
    message.parameters["shared_memory_region"].string_param = region
    message.parameters["shared_memory_byte_size"].int64_param = size
    if offset:
        message.parameters["shared_memory_offset"].int64_param = offset


def _request(name: str, *, in_size: int = X.nbytes, out_size: int = OUT_BYTES) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="demo-mlp", model_version="1")
    _shm_params(request.inputs.add(name="INPUT0", datatype="FP32", shape=[2, 64]), name, in_size)
    _shm_params(request.outputs.add(name="OUTPUT0"), name, out_size, offset=X.nbytes)
    return request


def _http(url: str, path: str, body: dict | None = None, method: str = "POST"):  # type: ignore[no-untyped-def]
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{url}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_grpc_reads_inputs_and_writes_outputs_in_the_region(cluster, region, repo):
    stub, _, _ = cluster
    key = f"/{region.name}"
    stub.SystemSharedMemoryRegister(
        pb.SystemSharedMemoryRegisterRequest(name="r1", key=key, byte_size=region.size), timeout=5
    )
    try:
        status = stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest(name="r1"), timeout=5)
        assert (status.regions["r1"].key, status.regions["r1"].byte_size) == (key, region.size)
        reply = stub.ModelInfer(_request("r1"), timeout=10)
        assert [tuple(o.shape) for o in reply.outputs] == [(2, 16)]
        assert list(reply.raw_output_contents) == [b""]  # in the region, not in the reply
        out = np.frombuffer(region.buf[X.nbytes : X.nbytes + OUT_BYTES], dtype="<f4").reshape(2, 16)
        np.testing.assert_allclose(out, mlp_reference(repo, "demo-mlp", "1", X), rtol=1e-5)
    finally:
        stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(name="r1"), timeout=5)
    assert not stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest(), timeout=5).regions


def test_rest_shares_the_regions_and_writes_outputs_there(cluster, region, repo):
    stub, url, _ = cluster
    key = f"/{region.name}"
    assert (
        _http(url, "/v2/systemsharedmemory/region/r2/register", {"key": key, "byte_size": region.size})[0]
        == 200
    )
    try:
        # registered over REST, seen over gRPC: one registry for both front doors
        assert "r2" in stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest(), timeout=5).regions
        into = {"shared_memory_region": "r2", "shared_memory_byte_size": X.nbytes}
        out_to = {
            "shared_memory_region": "r2",
            "shared_memory_byte_size": OUT_BYTES,
            "shared_memory_offset": X.nbytes,
        }
        tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [2, 64], "parameters": into}
        body = {"inputs": [tensor], "outputs": [{"name": "OUTPUT0", "parameters": out_to}]}
        status, doc = _http(url, "/v2/models/demo-mlp/versions/1/infer", body)
        assert status == 200 and doc["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [2, 16]}]
        out = np.frombuffer(region.buf[X.nbytes : X.nbytes + OUT_BYTES], dtype="<f4").reshape(2, 16)
        np.testing.assert_allclose(out, mlp_reference(repo, "demo-mlp", "1", X), rtol=1e-5)
        assert _http(url, "/v2/systemsharedmemory/status", method="GET") == (
            200,
            [{"name": "r2", "key": key, "offset": 0, "byte_size": region.size}],
        )
    finally:
        assert _http(url, "/v2/systemsharedmemory/region/r2/unregister")[0] == 200


def test_bad_registrations_and_references_are_client_errors(cluster, region):
    stub, url, _ = cluster
    key = f"/{region.name}"

    def register(name: str, key: str, size: int, offset: int = 0) -> grpc.StatusCode:
        request = pb.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=offset, byte_size=size)
        try:
            stub.SystemSharedMemoryRegister(request, timeout=5)
        except grpc.RpcError as err:
            return err.code()
        return grpc.StatusCode.OK

    assert register("bad", "/../../etc/passwd", 16) == grpc.StatusCode.INVALID_ARGUMENT
    assert register("bad", "no-slash", 16) == grpc.StatusCode.INVALID_ARGUMENT
    assert register("bad", "/no-such-object-here", 16) == grpc.StatusCode.INVALID_ARGUMENT
    assert register("bad", key, region.size + 1) == grpc.StatusCode.INVALID_ARGUMENT  # past the end
    assert register("r3", key, region.size) == grpc.StatusCode.OK
    try:
        assert register("r3", key, region.size) == grpc.StatusCode.ALREADY_EXISTS
        for request, words in (
            (_request("nope"), "region 'nope' is not registered"),
            (_request("r3", in_size=X.nbytes - 4), "shared_memory_byte_size 508 but shape [2, 64] needs 512"),
            (_request("r3", out_size=8), "output OUTPUT0 is 128 bytes but its region gives it 8"),
        ):
            with pytest.raises(grpc.RpcError) as info:
                stub.ModelInfer(request, timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in info.value.details()
        status, doc = _http(url, "/v2/systemsharedmemory/region/r3/register", {"key": key, "byte_size": 16})
        assert status == 400 and "registered already" in doc["error"]
        status, doc = _http(url, "/v2/systemsharedmemory/region/x/register", {"key": 7})
        assert status == 400 and "register needs" in doc["error"]
    finally:
        stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(name="r3"), timeout=5)


# What every shared-memory example of Triton's does first (tritonclient's protos clash with ours in one
# process: it runs in its own).
TRITON_CUDA_SHM = """
import sys, tritonclient.grpc as g, tritonclient.http as h
grpc_client, http_client = g.InferenceServerClient(sys.argv[1]), h.InferenceServerClient(sys.argv[2])
grpc_client.unregister_cuda_shared_memory()
http_client.unregister_cuda_shared_memory()
print(len(grpc_client.get_cuda_shared_memory_status().regions), http_client.get_cuda_shared_memory_status())
"""


def test_cuda_shared_memory_answers_as_triton_built_without_gpus(cluster, region):
    """Triton's CPU build: status lists none, unregister succeeds with nothing registered (every
    shared-memory example of Triton's calls it first), register is refused INVALID_ARGUMENT in Triton's
    words, and a named status is NOT_FOUND; over gRPC, REST and tritonclient alike."""
    stub, url, address = cluster
    assert not stub.CudaSharedMemoryStatus(pb.CudaSharedMemoryStatusRequest(), timeout=5).regions
    stub.CudaSharedMemoryUnregister(pb.CudaSharedMemoryUnregisterRequest(), timeout=5)
    stub.CudaSharedMemoryUnregister(pb.CudaSharedMemoryUnregisterRequest(name="g"), timeout=5)
    with pytest.raises(grpc.RpcError) as info:
        stub.CudaSharedMemoryStatus(pb.CudaSharedMemoryStatusRequest(name="g"), timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert info.value.details() == "Unable to find cuda shared memory region: 'g'"
    register = pb.CudaSharedMemoryRegisterRequest(name="g", raw_handle=b"x" * 64, device_id=0, byte_size=8)
    with pytest.raises(grpc.RpcError) as info:
        stub.CudaSharedMemoryRegister(register, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(
        "failed to register CUDA shared memory region: 'g', GPUs not supported"
    )
    assert "SystemSharedMemoryRegister" in info.value.details()  # what to do instead

    assert _http(url, "/v2/cudasharedmemory/status", method="GET") == (200, [])
    assert _http(url, "/v2/cudasharedmemory/unregister", {}) == (200, None)
    assert _http(url, "/v2/cudasharedmemory/region/g/unregister") == (200, None)
    status, doc = _http(url, "/v2/cudasharedmemory/region/g/status", method="GET")
    assert status == 404 and doc["error"] == "Unable to find cuda shared memory region: 'g'"
    status, doc = _http(
        url, "/v2/cudasharedmemory/region/g/register", {"raw_handle": {"b64": ""}, "byte_size": 8}
    )
    assert status == 400 and doc["error"].startswith("failed to register CUDA shared memory region: 'g'")

    stub.SystemSharedMemoryRegister(  # a system region of that name: Triton says which kind it is
        pb.SystemSharedMemoryRegisterRequest(name="sys", key=f"/{region.name}", byte_size=16), timeout=5
    )
    try:
        status, doc = _http(url, "/v2/cudasharedmemory/region/sys/status", method="GET")
        assert status == 404 and "registered as system shared memory, not CUDA" in doc["error"]
        assert _http(url, "/v2/cudasharedmemory/unregister", {}) == (200, None)
        assert _http(url, "/v2/systemsharedmemory/region/sys/status", method="GET")[0] == 200  # untouched
    finally:
        stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(name="sys"), timeout=5)

    done = subprocess.run([sys.executable, "-c", TRITON_CUDA_SHM, address, url], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0 and done.stdout.split() == ["0", "[]"], done.stderr[-2000:]
