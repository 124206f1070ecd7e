"""Our KServe V2 contract (protos/mcpapi/kserve) is wire compatible with Triton's, so tritonclient works.

Triton's classes live in a subprocess (tests/contract/triton_probe.py): both files define `inference.*`
in the default descriptor pool, and importing both into one process fails.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import subprocess
import sys
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from mcpapi.kserve import grpc_service_pb2 as kserve
from mcpapi.kserve import grpc_service_pb2_grpc as kserve_grpc
from mcpapi.kserve import model_config_pb2

PROBE = Path(__file__).with_name("triton_probe.py")
SERVICE = "inference.GRPCInferenceService"
OUR_RPCS = {
    "ServerLive",
    "ServerReady",
    "ModelReady",
    "ServerMetadata",
    "ModelMetadata",
    "ModelInfer",
    "ModelConfig",
    "ModelStatistics",
    "ModelStreamInfer",
    "SystemSharedMemoryStatus",
    "SystemSharedMemoryRegister",
    "SystemSharedMemoryUnregister",
    "CudaSharedMemoryStatus",
    "CudaSharedMemoryRegister",
    "CudaSharedMemoryUnregister",
    "TraceSetting",
    "LogSettings",
    "RepositoryIndex",
    "RepositoryModelLoad",
    "RepositoryModelUnload",
}

if importlib.util.find_spec("tritonclient") is None:
    pytest.skip("tritonclient is not installed (pip install -e '.[dev]')", allow_module_level=True)


def _load_probe() -> Any:
    spec = importlib.util.spec_from_file_location("triton_probe", PROBE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _probe(*args: str, stdin: str = "") -> Any:
    proc = subprocess.run(
        [sys.executable, str(PROBE), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, f"triton_probe {args[0]} failed:\n{proc.stderr}"
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def triton() -> dict[str, Any]:
    return _probe("describe")


@pytest.fixture(scope="module")
def ours() -> dict[str, Any]:
    return _load_probe().describe_all(kserve.DESCRIPTOR, model_config_pb2.DESCRIPTOR)


def test_package_and_service_name(ours: dict[str, Any]) -> None:
    assert ours["package"] == "inference"
    assert list(ours["services"]) == [SERVICE]
    assert set(ours["services"][SERVICE]) == OUR_RPCS


def test_every_message_and_field_matches_triton(ours: dict[str, Any], triton: dict[str, Any]) -> None:
    problems = []
    for name, message in sorted(ours["messages"].items()):
        theirs = triton["messages"].get(name)
        if theirs is None:
            problems.append(f"{name}: not in Triton's grpc_service.proto or model_config.proto")
            continue
        if message["map_entry"] != theirs["map_entry"]:
            problems.append(f"{name}: map entry {message['map_entry']}, Triton {theirs['map_entry']}")
        for field, desc in sorted(message["fields"].items()):
            if field not in theirs["fields"]:
                problems.append(f"{name}.{field}: not in Triton's message")
            elif desc != theirs["fields"][field]:
                problems.append(f"{name}.{field}: ours {desc}, Triton {theirs['fields'][field]}")
    assert not problems, "\n".join(problems)


def _received(ours: dict[str, Any]) -> set[str]:
    """Every message a client can send us: the RPCs' request types and what they contain."""
    todo = [rpc["input"] for rpc in ours["services"][SERVICE].values()]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in ours["messages"]:
            continue
        seen.add(name)
        todo += [f["type_name"] for f in ours["messages"][name]["fields"].values() if f["type_name"]]
        todo += [n for n in ours["messages"] if n.startswith(f"{name}.")]  # nested (map entries)
    return seen


def test_messages_we_receive_lack_no_triton_field(ours: dict[str, Any], triton: dict[str, Any]) -> None:
    # A field Triton has and we lack would be dropped (kept as unknown) by the router: tritonclient
    # would send it and we would silently ignore it. Within the messages a client sends, none may be
    # missing. Messages we only send (ModelConfig's parts) may leave fields out: a client reads them
    # as unset, which Triton's defaults mean too.
    received = _received(ours)
    assert "inference.ModelInferRequest.InferInputTensor" in received
    assert "inference.ModelConfig" not in received
    missing = [
        f"{name}.{field}"
        for name in sorted(received)
        for field in triton["messages"][name]["fields"]
        if field not in ours["messages"][name]["fields"]
    ]
    assert not missing, f"fields Triton defines and we do not: {missing}"


def test_every_enum_value_matches_triton(ours: dict[str, Any], triton: dict[str, Any]) -> None:
    for name, values in ours["enums"].items():
        assert values == triton["enums"].get(name), (
            f"{name}: ours {values}, Triton {triton['enums'].get(name)}"
        )


def test_every_rpc_matches_triton(ours: dict[str, Any], triton: dict[str, Any]) -> None:
    theirs = triton["services"][SERVICE]
    for rpc, desc in ours["services"][SERVICE].items():
        assert rpc in theirs, f"{rpc} is not a Triton RPC"
        assert desc == theirs[rpc], f"{rpc}: ours {desc}, Triton {theirs[rpc]}"


def _infer_request() -> kserve.ModelInferRequest:
    request = kserve.ModelInferRequest(model_name="demo-mlp", model_version="2", id="req-1")
    request.parameters["priority"].uint64_param = 2
    request.parameters["timeout"].int64_param = -1500
    request.parameters["tenant"].string_param = "blue"
    request.parameters["temperature"].double_param = 0.25
    request.parameters["binary_data_output"].bool_param = True
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[2, 64])
    tensor.parameters["layout"].string_param = "row-major"
    request.inputs.add(name="INPUT1", datatype="INT64", shape=[3])
    request.outputs.add(name="OUTPUT0").parameters["binary_data"].bool_param = True
    request.raw_input_contents.append(bytes(range(256)) * 2)  # not UTF-8: must survive as bytes
    request.raw_input_contents.append((7).to_bytes(8, "little") * 3)
    return request


def _typed_request() -> kserve.ModelInferRequest:
    request = kserve.ModelInferRequest(model_name="demo-mlp", id="req-2")
    contents = request.inputs.add(name="ALL", datatype="BYTES", shape=[2]).contents
    contents.bool_contents.extend([True, False])
    contents.int_contents.extend([-3, 4])
    contents.int64_contents.extend([-(2**40), 5])
    contents.uint_contents.extend([2**32 - 1, 0])
    contents.uint64_contents.extend([2**64 - 1, 1])
    contents.fp32_contents.extend([0.5, -2.0])
    contents.fp64_contents.extend([1e-300, 3.25])
    contents.bytes_contents.extend([b"\x00\xff", b"text"])
    return request


def _infer_response() -> kserve.ModelInferResponse:
    response = kserve.ModelInferResponse(model_name="demo-mlp", model_version="1", id="req-1")
    response.parameters["sequence_end"].bool_param = False
    output = response.outputs.add(name="OUTPUT0", datatype="FP32", shape=[2, 16])
    output.parameters["binary_data_size"].int64_param = 128
    output.contents.fp32_contents.append(1.5)
    response.raw_output_contents.append(b"\x00\x01\x02\x03" * 32)
    return response


def _load_request() -> kserve.RepositoryModelLoadRequest:
    request = kserve.RepositoryModelLoadRequest(repository_name="", model_name="demo-onnx")
    request.parameters["config"].string_param = '{"max_batch_size": 8}'
    request.parameters["file:1/model.onnx"].bytes_param = b"\x08\x07onnx"
    request.parameters["poll"].bool_param = True
    request.parameters["retries"].int64_param = 3
    return request


def _metadata_response() -> kserve.ModelMetadataResponse:
    response = kserve.ModelMetadataResponse(name="demo-mlp", versions=["1", "2"], platform="mcpmesh")
    response.inputs.add(name="INPUT0", datatype="FP32", shape=[-1, 64])
    response.outputs.add(name="OUTPUT0", datatype="FP32", shape=[-1, 16])
    return response


def _index_response() -> kserve.RepositoryIndexResponse:
    response = kserve.RepositoryIndexResponse()
    response.models.add(name="demo-mlp", version="1", state="READY")
    response.models.add(name="demo-slow", version="1", state="UNAVAILABLE", reason="worker w2 down")
    return response


@pytest.mark.parametrize(
    "message",
    [
        _infer_request(),
        _typed_request(),
        _infer_response(),
        _load_request(),
        _metadata_response(),
        _index_response(),
    ],
    ids=lambda m: type(m).__name__,
)
def test_round_trip_through_triton_classes(message: Any) -> None:
    # Ours -> bytes -> Triton's class must show the same values; Triton's class rebuilt from those
    # values -> bytes -> ours must give back the message we started from.
    sent = {"type": type(message).__name__, "b64": base64.b64encode(message.SerializeToString()).decode()}
    result = _probe("roundtrip", stdin=json.dumps(sent))
    assert result["dict"] == json_format.MessageToDict(message, preserving_proto_field_name=True)
    assert type(message).FromString(base64.b64decode(result["rebuilt_b64"])) == message


def test_infer_request_values_seen_by_triton() -> None:
    request = _infer_request()
    sent = {"type": "ModelInferRequest", "b64": base64.b64encode(request.SerializeToString()).decode()}
    seen = _probe("roundtrip", stdin=json.dumps(sent))["dict"]
    assert seen["model_name"] == "demo-mlp"
    assert seen["id"] == "req-1"
    assert seen["parameters"]["priority"] == {"uint64_param": "2"}
    assert seen["parameters"]["temperature"] == {"double_param": 0.25}
    assert seen["inputs"][0]["shape"] == ["2", "64"]
    assert seen["inputs"][0]["parameters"]["layout"] == {"string_param": "row-major"}
    assert [base64.b64decode(raw) for raw in seen["raw_input_contents"]] == list(request.raw_input_contents)


class _FakeRouter(kserve_grpc.GRPCInferenceServiceServicer):
    """Just enough of a KServe server to see what tritonclient sends; built on our generated code only."""

    def __init__(self) -> None:
        self.requests: list[kserve.ModelInferRequest] = []
        self.loads: list[kserve.RepositoryModelLoadRequest] = []
        self.unloads: list[str] = []

    def ServerLive(self, request, context):
        return kserve.ServerLiveResponse(live=True)

    def ServerReady(self, request, context):
        return kserve.ServerReadyResponse(ready=True)

    def ModelReady(self, request, context):
        return kserve.ModelReadyResponse(ready=request.name == "demo-mlp")

    def ServerMetadata(self, request, context):
        return kserve.ServerMetadataResponse(name="mcpmesh", version="0.1.0", extensions=["model_repository"])

    def ModelMetadata(self, request, context):
        return _metadata_response()

    def ModelInfer(self, request, context):
        if request.model_name != "demo-mlp":
            context.abort(grpc.StatusCode.NOT_FOUND, f"model {request.model_name!r} is not loaded")
        self.requests.append(request)
        rows = request.inputs[0].shape[0]
        raw = request.raw_input_contents[0]
        # OUTPUT0 = the first 16 FP32 values of each row: checks the bytes arrive in row-major order.
        out = b"".join(raw[r * 64 * 4 : r * 64 * 4 + 16 * 4] for r in range(rows))
        response = kserve.ModelInferResponse(model_name="demo-mlp", model_version="1", id=request.id)
        response.outputs.add(name="OUTPUT0", datatype="FP32", shape=[rows, 16])
        response.raw_output_contents.append(out)
        return response

    def RepositoryIndex(self, request, context):
        return _index_response()

    def RepositoryModelLoad(self, request, context):
        self.loads.append(request)
        return kserve.RepositoryModelLoadResponse()

    def RepositoryModelUnload(self, request, context):
        self.unloads.append(request.model_name)
        return kserve.RepositoryModelUnloadResponse()


@pytest.fixture
def fake_router():
    servicer = _FakeRouter()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    kserve_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(grace=None)


def test_tritonclient_works_against_our_service(fake_router) -> None:
    servicer, url = fake_router
    seen = _probe("client", url)

    assert seen["live"] and seen["ready"] and seen["model_ready"]
    assert seen["server_metadata"]["extensions"] == ["model_repository"]
    assert seen["model_metadata"]["inputs"][0] == {
        "name": "INPUT0",
        "datatype": "FP32",
        "shape": ["-1", "64"],
    }

    expected = [[float(r * 64 + c) for c in range(16)] for r in range(2)]
    assert seen["infer"] == {"id": "req-7", "dtype": "float32", "shape": [2, 16], "values": expected}
    (request,) = servicer.requests
    assert request.model_version == "1"
    assert request.parameters["priority"].uint64_param == 2
    assert request.parameters["tenant"].string_param == "blue"
    assert [o.name for o in request.outputs] == ["OUTPUT0"]

    assert [r.model_name for r in servicer.loads] == ["demo-onnx"]
    assert servicer.unloads == ["demo-onnx"]
    assert [m["name"] for m in seen["index"]["models"]] == ["demo-mlp", "demo-slow"]
    assert seen["error"]["status"] == "StatusCode.NOT_FOUND"
    assert "no-such-model" in seen["error"]["message"]
