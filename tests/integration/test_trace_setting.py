"""TraceSetting over both front doors of a real router, and the Triton trace file it writes for requests
that really went through the router and a worker (its own trace_file, from the router's configuration)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tritonclient.http as triton_http
from harness import small_mesh, wait_for

from mcpapi.kserve import grpc_service_pb2 as pb
from mcpapi.kserve import grpc_service_pb2_grpc as pb_grpc

X = np.ones((1, 64), np.float32)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory, etcd_endpoint, repo):
    tmp = tmp_path_factory.mktemp("trace")
    trace_file = tmp / "trace.json"
    with small_mesh(
        tmp, etcd_endpoint, repo, "demo-mlp", ["1"], router_flags={"trace_file": trace_file}
    ) as m:
        yield m, trace_file


def _http(url: str, method: str, path: str, doc: dict | None = None) -> tuple[int, dict]:
    body = None if doc is None else json.dumps(doc).encode()
    request = urllib.request.Request(f"http://{url}{path}", data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _grpc_setting(stub, model: str = "", **changes: list[str]) -> dict[str, list[str]]:
    request = pb.TraceSettingRequest(model_name=model)
    for key, values in changes.items():
        request.settings[key].value.extend(values)
    response = stub.TraceSetting(request, timeout=10)
    return {k: list(v.value) for k, v in response.settings.items()}


def _infer_grpc(stub) -> None:
    request = pb.ModelInferRequest(model_name="demo-mlp", id="g")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(X.tobytes())
    stub.ModelInfer(request, timeout=10)


def _infer_rest(url: str) -> None:
    doc = {
        "id": "r",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}],
    }
    assert _http(url, "POST", "/v2/models/demo-mlp/infer", doc)[0] == 200


def _traces(path) -> dict[int, list[dict]]:
    records: dict[int, list[dict]] = {}
    for record in json.loads(path.read_text()):
        records.setdefault(record["id"], []).append(record)
    return records


def test_requests_through_both_doors_are_traced_into_tritons_file(mesh):
    m, trace_file = mesh
    stub = pb_grpc.GRPCInferenceServiceStub(m.router.channel())
    url = m.router.endpoints["rest"]
    before = _grpc_setting(stub)
    assert before["trace_level"] == ["OFF"] and before["trace_file"] == [str(trace_file)]
    status, doc = _http(
        url,
        "POST",
        "/v2/trace/setting",
        {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "3"},
    )
    assert status == 200 and doc["trace_level"] == ["TIMESTAMPS"] and doc["trace_count"] == "3"
    _infer_grpc(stub)
    _infer_rest(url)
    _infer_grpc(stub)
    _infer_rest(url)  # past the count: not traced
    first = trace_file.with_name("trace.json.0")  # the count ran out: Triton writes what it collected
    wait_for(first.exists, what="the trace file")
    traces = _traces(first)
    assert len(traces) == 3
    for records in traces.values():
        head, *marks = records
        assert head["model_name"] == "demo-mlp" and head["model_version"] == -1  # no version asked for
        assert head["worker"] == m.worker.worker_id
        names = [r["timestamps"][0]["name"] for r in marks]
        assert names == ["REQUEST_START", "FORWARD_START", "FORWARD_END", "REQUEST_END"]
        stamps = [r["timestamps"][0]["ns"] for r in marks]
        assert stamps == sorted(stamps)
    assert sorted(r[0]["request_id"] for r in traces.values()) == ["g", "g", "r"]
    assert _grpc_setting(stub)["trace_count"] == ["0"]


def test_a_models_own_settings_trace_its_tensors(mesh):
    m, trace_file = mesh
    url = m.router.endpoints["rest"]
    client = triton_http.InferenceServerClient(url)
    global_before = client.get_trace_settings()
    settings = client.update_trace_settings(
        model_name="demo-mlp", settings={"trace_level": ["TENSORS"], "trace_rate": "1", "trace_count": "1"}
    )
    assert settings["trace_level"] == ["TENSORS"]
    assert client.get_trace_settings() == global_before  # the global ones stay
    _infer_rest(url)
    client.close()
    wait_for(lambda: _tensor_file(trace_file) is not None, what="the model's trace file")
    records = [r for t in _traces(_tensor_file(trace_file)).values() for r in t]
    tensors = {r["tensor"]["name"]: r for r in records if "tensor" in r}
    assert (
        tensors["INPUT0"]["activity"] == "TENSOR_QUEUE_INPUT"
        and tensors["INPUT0"]["tensor"]["shape"] == "1,64"
    )
    assert tensors["OUTPUT0"]["activity"] == "TENSOR_BACKEND_OUTPUT"
    assert len(tensors["OUTPUT0"]["tensor"]["data"].split(",")) == 16


def _tensor_file(trace_file):
    for path in sorted(trace_file.parent.glob("trace.json.*")):
        if '"tensor"' in path.read_text():
            return path
    return None


@pytest.mark.parametrize(
    ("changes", "grpc_code", "http", "words"),
    [
        (
            {"trace_file": ["/tmp/elsewhere.json"]},
            grpc.StatusCode.INVALID_ARGUMENT,
            400,
            "cannot be set over",
        ),
        ({"trace_rate": ["0"]}, grpc.StatusCode.INVALID_ARGUMENT, 400, "trace_rate must be"),
        ({"trace_level": ["OFF", "TENSORS"]}, grpc.StatusCode.INVALID_ARGUMENT, 400, "OFF stands alone"),
        ({"trace_mode": ["opentelemetry"]}, grpc.StatusCode.INVALID_ARGUMENT, 400, "triton mode only"),
        ({"colour": ["red"]}, grpc.StatusCode.INVALID_ARGUMENT, 400, "unknown trace setting 'colour'"),
    ],
    ids=["trace_file", "rate-0", "off-and-more", "opentelemetry", "unknown-key"],
)
def test_bad_settings_are_refused_by_both_doors_and_change_nothing(mesh, changes, grpc_code, http, words):
    m, _ = mesh
    stub = pb_grpc.GRPCInferenceServiceStub(m.router.channel())
    before = _grpc_setting(stub)
    with pytest.raises(grpc.RpcError) as info:
        _grpc_setting(stub, **changes)
    assert info.value.code() == grpc_code and words in info.value.details()
    status, doc = _http(m.router.endpoints["rest"], "POST", "/v2/trace/setting", changes)
    assert status == http and words in doc["error"]
    assert _grpc_setting(stub) == before


def test_a_model_the_cluster_does_not_have_is_not_found(mesh):
    m, _ = mesh
    stub = pb_grpc.GRPCInferenceServiceStub(m.router.channel())
    with pytest.raises(grpc.RpcError) as info:
        _grpc_setting(stub, model="no-such-model")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    status, doc = _http(m.router.endpoints["rest"], "GET", "/v2/models/no-such-model/trace/setting")
    assert status == 404 and "no-such-model is not loaded" in doc["error"]
