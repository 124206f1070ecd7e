"""The error table through both front doors: each MCPError a client can cause is driven through a real
router's KServe V2 gRPC and REST doors, which must answer the class's gRPC status, the HTTP status
``mcpcore.transport.http_status.HTTP_STATUS`` gives it (README, "The router"), the same message, and
then go on serving as before (the index, the shared memory regions and a good inference are what they
were).

One row per fault in ``ROWS``; a class without one is in ``NO_ROW`` with the reason. Rows that need a
model the demo repository lacks get it here: weights that do not parse (DataLoss) and an ONNX export that
fails at run time (Internal). ResourceExhausted has no MCPError a client can reach (the batch bound keeps a
demo tensor far under the 16 MiB frame limit), so its row is gRPC's own message limit, which REST answers
413 as README says: the one row whose HTTP status is not the table's.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import safetensors.numpy
import yaml
from harness import make_demo_repository, mlp_reference, small_mesh, wait_for
from onnx import TensorProto, helper, numpy_helper

from mcpapi.kserve import grpc_service_pb2 as pb
from mcpapi.kserve import grpc_service_pb2_grpc as pb_grpc
from mcpapi.v2 import control_pb2, control_pb2_grpc, model_pb2
from mcpcore import errors
from mcpcore.errors import (
    AlreadyExists,
    DataLoss,
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    MCPError,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from mcpcore.transport.grpc_status import to_grpc
from mcpcore.transport.http_status import http_status

X = np.random.default_rng(11).standard_normal((2, 64), dtype=np.float32)
GRPC_LIMIT = 64 << 20  # the router's gRPC receive limit, and its default rest_max_body_bytes


# --- the repository: the demo models, and two a real repository can hold by mistake ----------------------


def add_corrupt_model(repo: Path) -> None:
    """``demo-corrupt``: demo-mlp/1 whose weights file is not safetensors (a truncated copy, say)."""
    shutil.copytree(repo / "demo-mlp" / "1", repo / "demo-corrupt" / "1")
    (repo / "demo-corrupt" / "1" / "weights.safetensors").write_bytes(b"\x08\x00not safetensors")


def add_batch_one_model(repo: Path) -> None:
    """``demo-batch1``: demo-mlp/1's OUTPUT0 as ONNX, with a Reshape to one row (an export that traced its
    batch size): it loads (the warm-up runs one row) and fails at run time on any other batch. The target is
    computed at run time, so the graph's declared output keeps a variable batch and passes the load-time
    signature check, as such an export's does."""
    w = safetensors.numpy.load_file(str(repo / "demo-mlp" / "1" / "weights.safetensors"))
    node = helper.make_node
    nodes = [
        node("MatMul", ["INPUT0", "fc1.weight"], ["fc1.mm"]),
        node("Add", ["fc1.mm", "fc1.bias"], ["fc1"]),
        node("Relu", ["fc1"], ["hidden"]),
        node("MatMul", ["hidden", "fc2.weight"], ["fc2.mm"]),
        node("Add", ["fc2.mm", "fc2.bias"], ["fc2"]),
        node("Shape", ["INPUT0"], ["in.shape"]),
        node("Div", ["in.shape", "in.shape"], ["ones"]),
        node("Mul", ["ones", "one.row"], ["target"]),  # [1, 16] whatever the batch
        node("Reshape", ["fc2", "target"], ["OUTPUT0"]),
    ]
    tensors = {k: w[k] for k in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")}
    tensors["one.row"] = np.array([1, 16], np.int64)
    graph = helper.make_graph(
        nodes,
        "demo-batch1",
        inputs=[helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 64])],
        outputs=[helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 16])],
        initializer=[numpy_helper.from_array(a, name=k) for k, a in tensors.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (repo / "demo-batch1" / "1").mkdir(parents=True)
    (repo / "demo-batch1" / "1" / "model.onnx").write_bytes(model.SerializeToString())
    config = yaml.safe_load((repo / "demo-onnx" / "1" / "model.yaml").read_text())
    config["outputs"] = [o for o in config["outputs"] if o["name"] == "OUTPUT0"]
    config["qos"] = {"latency_sensitivity": 0.8}  # no secondary output
    (repo / "demo-batch1" / "1" / "model.yaml").write_text(yaml.safe_dump(config))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = make_demo_repository(tmp_path_factory.mktemp("repo") / "models")
    add_corrupt_model(repo)
    add_batch_one_model(repo)
    return repo


@dataclass(frozen=True)
class Doors:
    stub: pb_grpc.GRPCInferenceServiceStub
    rest: str  # host:port
    control: control_pb2_grpc.ModelControlStub  # the scheduler's, for what an operator does


@pytest.fixture(scope="module")
def doors(tmp_path_factory, etcd_endpoint, repo) -> Iterator[Doors]:
    tmp = tmp_path_factory.mktemp("errors")
    with small_mesh(tmp, etcd_endpoint, repo, "demo-mlp", ["1", "2"], repository=True) as mesh:
        control = control_pb2_grpc.ModelControlStub(mesh.scheduler.channel())
        extra = ("demo-slow", "demo-batch1")
        for model in extra:
            spec = model_pb2.ModelSpec(model=model, versions=["1"], replicas=1)
            control.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=60)
        d = Doors(
            pb_grpc.GRPCInferenceServiceStub(mesh.router.channel()), mesh.router.endpoints["rest"], control
        )
        wait_for(lambda: all(_ready(d, m, "1") for m in extra), what=f"{extra} routed")
        yield d


def _ready(d: Doors, model: str, version: str) -> bool:
    return d.stub.ModelReady(pb.ModelReadyRequest(name=model, version=version), timeout=5).ready


# --- one call, as each door is asked it (built when sent, so no row's data is held from import on) ---


@dataclass(frozen=True)
class Http:
    method: str
    path: str
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Call:
    grpc: Callable[[pb_grpc.GRPCInferenceServiceStub], Any]  # makes the call on a stub
    http: Callable[[], Http]


def infer(
    model: str, version: str = "", x: np.ndarray = X, outputs: tuple[str, ...] = (), **params: int
) -> Call:
    def grpc_call(stub: pb_grpc.GRPCInferenceServiceStub) -> pb.ModelInferResponse:
        request = pb.ModelInferRequest(
            model_name=model, model_version=version, raw_input_contents=[x.tobytes()]
        )
        request.inputs.add(name="INPUT0", datatype="FP32", shape=x.shape)
        for name in outputs:
            request.outputs.add(name=name)
        for key, value in params.items():
            request.parameters[key].int64_param = value
        return stub.ModelInfer(request, timeout=30)

    def http() -> Http:
        tensor = {"name": "INPUT0", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
        body = {"inputs": [tensor], "outputs": [{"name": n} for n in outputs], "parameters": params}
        path = f"/v2/models/{model}{f'/versions/{version}' if version else ''}/infer"
        return Http("POST", path, json.dumps(body).encode())

    return Call(grpc_call, http)


def oversized(model: str) -> Call:
    """One input over the router's 64 MiB gRPC message limit (and REST body limit), as raw bytes."""
    size = GRPC_LIMIT + 256
    shape = [size // 256, 64]

    def grpc_call(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
        request = pb.ModelInferRequest(model_name=model, raw_input_contents=[bytes(size)])
        request.inputs.add(name="INPUT0", datatype="FP32", shape=shape)
        stub.ModelInfer(request, timeout=60)

    def http() -> Http:
        spec = {
            "name": "INPUT0",
            "datatype": "FP32",
            "shape": shape,
            "parameters": {"binary_data_size": size},
        }
        head = json.dumps({"inputs": [spec]}).encode()
        headers = {
            "Inference-Header-Content-Length": str(len(head)),
            "Content-Type": "application/octet-stream",
        }
        return Http("POST", f"/v2/models/{model}/infer", head + bytes(size), headers)

    return Call(grpc_call, http)


def load(model: str) -> Call:
    return Call(
        lambda s: s.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=model), timeout=60),
        lambda: Http("POST", f"/v2/repository/models/{model}/load", b""),
    )


def register(name: str, key: str, size: int) -> Call:
    request = pb.SystemSharedMemoryRegisterRequest(name=name, key=key, byte_size=size)
    body = json.dumps({"key": key, "offset": 0, "byte_size": size}).encode()
    return Call(
        lambda s: s.SystemSharedMemoryRegister(request, timeout=10),
        lambda: Http("POST", f"/v2/systemsharedmemory/region/{name}/register", body),
    )


def cuda_register(name: str) -> Call:
    request = pb.CudaSharedMemoryRegisterRequest(name=name, raw_handle=b"h" * 64, byte_size=8)
    body = json.dumps({"raw_handle": {"b64": "aGFuZGxl"}, "device_id": 0, "byte_size": 8}).encode()
    return Call(
        lambda s: s.CudaSharedMemoryRegister(request, timeout=10),
        lambda: Http("POST", f"/v2/cudasharedmemory/region/{name}/register", body),
    )


# --- what a row needs in place while its fault is driven ------------------------------------------------


@contextmanager
def paused(d: Doors, model: str, version: str) -> Iterator[None]:
    """An operator paused ``model/version``: declared, with no RUNNING replica."""
    d.control.PauseModel(control_pb2.PauseModelRequest(model=model, version=version), timeout=30)
    try:
        wait_for(lambda: not _ready(d, model, version), what=f"{model}/{version} paused")
        yield
    finally:
        d.control.ResumeModel(control_pb2.ResumeModelRequest(model=model, version=version), timeout=30)
        wait_for(lambda: _ready(d, model, version), timeout_s=30, what=f"{model}/{version} resumed")


@contextmanager
def registered(d: Doors, name: str) -> Iterator[None]:
    """Region ``name`` registered (over gRPC: one registry serves both doors) on a real POSIX object."""
    shm = shared_memory.SharedMemory(name=f"mcp-err-{uuid.uuid4().hex[:8]}", create=True, size=4096)
    try:
        d.stub.SystemSharedMemoryRegister(
            pb.SystemSharedMemoryRegisterRequest(name=name, key=f"/{shm.name}", byte_size=shm.size),
            timeout=10,
        )
        yield
    finally:
        d.stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(name=name), timeout=10)
        shm.close()
        shm.unlink()


def _nothing(d: Doors) -> AbstractContextManager[None]:
    return nullcontext()


@dataclass(frozen=True)
class Row:
    error: type[MCPError]
    cause: str  # the test id
    call: Call
    words: str  # what both messages say, that a person can act on
    during: Callable[[Doors], AbstractContextManager[None]] = _nothing
    same_text: bool = True  # both doors answer the very same message
    still: tuple[str, str] = ("demo-mlp", "1")  # a model/version that must serve afterwards
    http: int | None = None  # an HTTP status other than the table's, and why (see the row)


ROWS = [
    Row(InvalidArgument, "input-of-the-wrong-shape", infer("demo-mlp", "1", X[:, :63]),
        "model demo-mlp/1: input INPUT0: expected shape [-1, 64], got [2, 63]"),
    Row(NotFound, "unknown-model", infer("no-such-model"),
        "model no-such-model is not loaded; load it first"),
    Row(NotFound, "undeclared-version", infer("demo-mlp", "9"), "has no version 9; it declares ['1', '2']"),
    Row(Unavailable, "declared-version-not-running", infer("demo-mlp", "2"),
        "model demo-mlp version 2 has no RUNNING replica",
        during=partial(paused, model="demo-mlp", version="2"), still=("demo-mlp", "2")),
    Row(InvalidArgument, "cuda-shared-memory-on-a-router-without-cuda", cuda_register("g"),
        "failed to register CUDA shared memory region: 'g', GPUs not supported"),
    # the router's deadline ("did not answer within 20 ms") or the worker's queue ("waited 20.3 ms in the
    # queue ..., over its 20 ms timeout"), whichever sees it first: both name the timeout and the request
    Row(DeadlineExceeded, "timeout-under-the-slow-models-50-ms", infer("demo-slow", "1", timeout=20_000),
        "20 ms", same_text=False, still=("demo-slow", "1")),
    Row(AlreadyExists, "region-registered-twice", register("dup", "/mcp-err-other", 64),
        "shared memory region 'dup' is registered already; unregister it first",
        during=partial(registered, name="dup")),
    Row(PermissionDenied, "load-encrypted-model-on-a-worker-without-its-key", load("demo-mlp-enc"),
        "is encrypted with key id 'demo-key' but this worker has no keyring configured"),
    Row(DataLoss, "load-model-with-corrupt-weights", load("demo-corrupt"),
        "the weights are not a readable safetensors file"),
    Row(Internal, "model-that-fails-at-run-time", infer("demo-batch1", "1"),
        "model demo-batch1/1 (onnx backend): inference failed", still=("demo-batch1", "1")),
    # gRPC's own limit (grpc core answers before the router runs); REST refuses the body 413 (README)
    Row(ResourceExhausted, "message-over-64-MiB", oversized("demo-mlp"), str(GRPC_LIMIT), same_text=False,
        http=413),
]  # fmt: skip


def _http(url: str, call: Http) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"http://{url}{call.path}", call.body, dict(call.headers), method=call.method
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _state(d: Doors) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, int]]]:
    """What a fault must leave as it was: the repository index and the shared memory regions."""
    index = d.stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=10).models
    regions = d.stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest(), timeout=10).regions
    return (
        sorted((m.name, m.version, m.state) for m in index),
        sorted((r.name, r.key, r.byte_size) for r in regions.values()),
    )


def _serves(d: Doors, repo: Path, model: str, version: str) -> None:
    """One good request through each door, answered as the reference MLP would (every model here is
    demo-mlp/1's but demo-mlp/2)."""
    x = X[:1]
    want = mlp_reference(repo, "demo-mlp", version if model == "demo-mlp" else "1", x)
    call = infer(model, version, x, outputs=("OUTPUT0",))
    reply = call.grpc(d.stub)
    np.testing.assert_allclose(
        np.frombuffer(reply.raw_output_contents[0], "<f4").reshape(1, 16), want, rtol=1e-5
    )
    status, raw = _http(d.rest, call.http())
    assert status == 200, raw
    [out] = json.loads(raw)["outputs"]
    np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(1, 16), want, rtol=1e-5)


@pytest.mark.parametrize("row", [pytest.param(r, id=f"{r.error.__name__}-{r.cause}") for r in ROWS])
def test_each_error_gets_its_status_and_message_through_both_doors(doors, repo, row):
    with row.during(doors):
        before = _state(doors)
        with pytest.raises(grpc.RpcError) as info:
            row.call.grpc(doors.stub)
        status, raw = _http(doors.rest, row.call.http())
        wait_for(lambda: _state(doors) == before, what="the index and regions as they were")
    code, said = info.value.code(), info.value.details()
    assert code == to_grpc(row.error.code), f"{code.name}: {said}"
    assert status == (row.http or http_status(row.error.code)), raw
    answered = json.loads(raw)["error"]
    assert row.words in said and row.words in answered, (said, answered)
    if row.same_text:
        assert said == answered
    _serves(doors, repo, *row.still)
    if row.still != ("demo-mlp", "1"):
        _serves(doors, repo, "demo-mlp", "1")


#: Classes with no row, and why. A new MCPError class needs a row above or a line here.
NO_ROW = {
    "FailedPrecondition": "the router raises none; the worker's (a backend that cannot run there, e.g. cuda "
    "without pycuda) is not a permanent load error, so the scheduler tries other workers and a "
    "RepositoryModelLoad ends at its deadline; the scheduler's (unloading a version that takes traffic) "
    "needs a version, and the router's unload sends none",
    "Aborted": "a sequence whose worker is gone (ABORTED, HTTP 409) needs a worker restarted mid-sequence, "
    "which this module's one-worker mesh cannot spare: test_protocol_types' "
    "test_a_sequence_whose_worker_restarted_gets_an_error_in_band_never_a_silent_reroute drives it through "
    "both doors",
}


def test_every_error_class_has_a_row_or_a_reason():
    covered = {r.error.__name__ for r in ROWS} | set(NO_ROW)
    assert {c.__name__ for c in errors.CODE_TO_ERROR.values()} <= covered
