"""The REST front door (KServe V2 over HTTP, Triton's REST API) on a real router, driven by Triton's own
``tritonclient.http`` and by plain HTTP for what a client library hides (status codes, error bodies,
the binary tensor data extension's framing)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid

import grpc
import numpy as np
import pytest
import tritonclient.http as triton_http
from harness import RouterProcess, mlp_reference, small_mesh, wait_for
from tritonclient.utils import InferenceServerException

from mcpapi.kserve import grpc_service_pb2 as pb
from mcpapi.kserve import grpc_service_pb2_grpc as pb_grpc

X = np.random.default_rng(5).standard_normal((3, 64), dtype=np.float32)
GRPC: dict[str, str] = {}  # the fixture's router's gRPC address, for the tests that compare both doors


@pytest.fixture(scope="module")
def rest(tmp_path_factory, etcd_endpoint, repo):
    tmp = tmp_path_factory.mktemp("rest")
    with small_mesh(tmp, etcd_endpoint, repo, "demo-mlp", ["1", "2"], repository=True) as mesh:
        url = mesh.router.endpoints["rest"]
        GRPC["router"] = mesh.router.endpoints["grpc"]
        client = triton_http.InferenceServerClient(url, network_timeout=30)
        yield url, client
        client.close()


def _http(url: str, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    request = urllib.request.Request(f"http://{url}{path}", data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def _input(x: np.ndarray, binary: bool) -> triton_http.InferInput:
    tensor = triton_http.InferInput("INPUT0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    return tensor


def test_health_and_metadata(rest):
    url, client = rest
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("demo-mlp", "2") and not client.is_model_ready("no-such-model")
    meta = client.get_server_metadata()
    assert meta["name"] == "mcpmesh" and "statistics" in meta["extensions"]
    model = client.get_model_metadata("demo-mlp", "1")
    assert model["versions"] == ["1", "2"]
    assert model["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 64]}]
    assert _http(url, "GET", "/v2/health/live")[0] == 200
    assert _http(url, "GET", "/v2/models/no-such-model/ready")[0] == 400  # false is 400, as Triton says


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_json_and_binary_match_the_reference(rest, repo, binary):
    _, client = rest
    outputs = [triton_http.InferRequestedOutput("OUTPUT0", binary_data=binary)]
    result = client.infer(
        "demo-mlp", [_input(X, binary)], model_version="1", outputs=outputs, request_id="a1"
    )
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), mlp_reference(repo, "demo-mlp", "1", X), rtol=1e-5)
    response = result.get_response()
    assert response["id"] == "a1" and response["model_version"] == "1"
    assert [o["name"] for o in response["outputs"]] == ["OUTPUT0"]


def test_config_and_statistics(rest):
    _, client = rest
    config = client.get_model_config("demo-mlp", "1")
    assert config["max_batch_size"] > 0 and config["input"][0]["dims"] == [64]  # numbers, as Triton's
    before = client.get_inference_statistics("demo-mlp", "1")["model_stats"][0]
    client.infer("demo-mlp", [_input(X, True)], model_version="1")
    after = client.get_inference_statistics("demo-mlp", "1")["model_stats"][0]
    success = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    assert success == 1 and after["inference_count"] - before["inference_count"] == 3
    assert {(s["name"], s["version"]) for s in client.get_inference_statistics()["model_stats"]} >= {
        ("demo-mlp", "1"),
        ("demo-mlp", "2"),
    }


def test_repository_index_load_and_unload(rest):
    _, client = rest
    index = client.get_model_repository_index()
    assert {"name": "demo-mlp", "version": "1", "state": "READY"} in index
    client.load_model("demo-onnx")
    assert client.is_model_ready("demo-onnx")
    client.unload_model("demo-onnx")
    wait_for(lambda: not client.is_model_ready("demo-onnx"), what="demo-onnx gone")


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/v2/models/no-such-model/infer", None, 404, "no-such-model is not loaded"),
        ("/v2/models/demo-mlp/versions/9/infer", None, 404, "no version 9"),
        ("/v2/models/demo-mlp/infer", {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 63],
                                                   "data": [0.0] * 63}]}, 400, "expected shape [-1, 64]"),
        ("/v2/models/demo-mlp/infer", {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64],
                                                   "data": [0.0] * 3}]}, 400, "3 values for shape [1, 64]"),
        ("/v2/models/demo-mlp/infer", {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1],
                                                   "data": ["x"]}]}, 400, "expected dtype FP32, got BYTES"),
        ("/v2/models/demo-mlp/infer", {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64],
                                                   "data": [0.0] * 64}],
                                       "outputs": [{"name": "NOPE"}]}, 400, "has no output(s) ['NOPE']"),
        ("/v2/models/demo-mlp/infer", {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64],
                                                   "data": [0.0] * 64}],
                                       "parameters": {"priority": -1}}, 400, "priority -1 is out of range"),
        ("/v2/models/no-such-model/config", None, 404, "no-such-model is not loaded"),
        # the same load parameters as gRPC's RepositoryModelLoad, read by the same code
        ("/v2/repository/models/demo-mlp/load", {"parameters": {"version": 2}}, 400,
         "'version' must be a string"),
        ("/v2/repository/models/demo-mlp/load", {"parameters": {"colour": "red"}}, 400,
         "unknown load parameter 'colour'"),
        ("/v2/repository/models/demo-mlp/load", {"parameters": {"config": "{}"}}, 400,
         "load parameter 'config' is not supported"),
        ("/v2/models/demo-mlp/infer", {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64],
                                                   "data": [0.0] * 64}],
                                       "parameters": {"tenant": {"a": 1}}}, 400,
         "parameter tenant must be a string, a number or a bool, not a JSON dict"),
    ],
)  # fmt: skip
def test_each_bad_request_gets_its_status_and_a_message(rest, path, body, status, words):
    url, _ = rest
    method = "GET" if path.endswith("config") else "POST"
    data = json.dumps(body or {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64],
                                           "data": [0.0] * 64}]}).encode()  # fmt: skip
    got, _, raw = _http(url, method, path, None if method == "GET" else data)
    assert got == status, raw
    assert words in json.loads(raw)["error"]


def test_malformed_bodies_are_400s_naming_the_fault(rest):
    url, _ = rest
    path = "/v2/models/demo-mlp/infer"
    got, _, raw = _http(url, "POST", path, b"{not json")
    assert got == 400 and "does not parse" in json.loads(raw)["error"]
    head = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64],
                                   "parameters": {"binary_data_size": 256}}]}).encode()  # fmt: skip
    short = {"Inference-Header-Content-Length": str(len(head))}
    got, _, raw = _http(url, "POST", path, head + b"\0" * 100, short)
    assert got == 400 and "binary data ends at byte 100; 256 are needed" in json.loads(raw)["error"]
    got, _, raw = _http(url, "POST", path, head + b"\0" * 260, short)
    assert got == 400 and "4 bytes of binary data belong to no input" in json.loads(raw)["error"]
    got, _, raw = _http(url, "POST", path, head, {"Inference-Header-Content-Length": "999999"})
    assert got == 400 and "Inference-Header-Content-Length is 999999" in json.loads(raw)["error"]
    got, _, raw = _http(url, "POST", path, b"[" * 100_000 + b"]" * 100_000)  # nested past the parser's depth
    assert got == 400 and "does not parse" in json.loads(raw)["error"]
    nested = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,64],"data":[1]}],"parameters":'
    for depth in (1000, 1020):  # past the standard library's depth, not orjson's: refused all the same
        got, _, raw = _http(url, "POST", path, nested + b'{"p":' * depth + b"1" + b"}" * (depth + 1))
        assert got == 400 and "does not parse" in json.loads(raw)["error"], raw
    huge = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [0, 10**20], "data": []}]}
    got, _, raw = _http(url, "POST", path, json.dumps(huge).encode())
    assert got == 400 and "the router takes tensors of at most" in json.loads(raw)["error"]
    got, _, raw = _http(url, "POST", "/v2/repository/models/demo-mlp/load", b'{"parameters": "x"}')
    assert got == 400 and "parameters must be a JSON object" in json.loads(raw)["error"]


def test_non_finite_numbers_and_text_past_ascii_cross_the_json_both_ways(rest, repo):
    """NaN and Infinity literals in a request are read; a model's non-finite outputs are written as NaN
    (as Triton's REST API writes them, never as null); a request id past ASCII comes back as sent; a
    finite reply is plain JSON."""
    url, _ = rest
    path = "/v2/models/demo-mlp/versions/1/infer"
    for rid, x in (("réq ✓ 1", X[:1].copy()), ("réq ✓ 2", X[:2].copy())):
        if rid.endswith("2"):
            x[0, 0], x[0, 1] = np.nan, np.inf  # row 0's outputs turn non-finite, row 1's stay as they were
        tensor = {"name": "INPUT0", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
        body = json.dumps({"id": rid, "inputs": [tensor]}).encode()  # NaN, Infinity as literals
        got, _, raw = _http(url, "POST", path, body, {"Content-Type": "application/json"})
        assert got == 200, raw
        assert b"null" not in raw and (b"NaN" in raw) == rid.endswith("2")
        doc = json.loads(raw)
        assert doc["id"] == rid
        [out] = [o for o in doc["outputs"] if o["name"] == "OUTPUT0"]
        values = np.array(out["data"], dtype=np.float32).reshape(out["shape"])
        want = mlp_reference(repo, "demo-mlp", "1", x)
        np.testing.assert_allclose(values, want, rtol=1e-5, equal_nan=True)
        assert np.isfinite(values[-1]).all()


def test_the_binary_extension_frames_the_reply(rest, repo):
    url, _ = rest
    tensor = {
        "name": "INPUT0",
        "datatype": "FP32",
        "shape": [3, 64],
        "parameters": {"binary_data_size": X.nbytes},
    }
    wanted = {"name": "OUTPUT0", "parameters": {"binary_data": True}}
    head = json.dumps({"inputs": [tensor], "outputs": [wanted]}).encode()
    got, headers, raw = _http(
        url, "POST", "/v2/models/demo-mlp/versions/1/infer", head + X.tobytes(),
        {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"},
    )  # fmt: skip
    assert got == 200
    cut = int(headers["Inference-Header-Content-Length"])
    doc = json.loads(raw[:cut])
    [out] = doc["outputs"]
    assert out["parameters"]["binary_data_size"] == len(raw) - cut == 3 * 16 * 4
    values = np.frombuffer(raw[cut:], dtype="<f4").reshape(out["shape"])
    np.testing.assert_allclose(values, mlp_reference(repo, "demo-mlp", "1", X), rtol=1e-5)


def test_a_body_over_the_limit_is_refused_413_and_the_router_stops_cleanly(tmp_path, etcd_endpoint):
    router = RouterProcess(tmp_path, etcd_endpoint, prefix=f"/t{uuid.uuid4().hex[:8]}/mcp",
                           scheduler="", rest_max_body_bytes=1024).start()  # fmt: skip
    try:
        got, _, raw = _http(router.endpoints["rest"], "POST", "/v2/models/m/infer", b"{" + b" " * 4096 + b"}")
        assert got == 413 and "over the 1024-byte limit" in json.loads(raw)["error"]
    finally:
        router.stop()
    assert router.proc.returncode == 0
    assert "failed; exiting anyway" not in router.log.read_text()  # both front doors drained and closed


def test_tritonclient_http_raises_with_the_status_text(rest):
    _, client = rest
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("no-such-model")
    assert "no-such-model" in info.value.message()


def test_log_settings_are_the_routers_own_level_over_both_doors(rest):
    _, client = rest
    assert client.get_log_settings()["log_verbose_level"] == 0
    try:
        assert client.update_log_settings({"log_verbose_level": 1})["log_verbose_level"] == 1
        stub = pb_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(GRPC["router"]))
        seen = stub.LogSettings(pb.LogSettingsRequest(), timeout=5).settings  # read only: the same process
        assert seen["log_verbose_level"].uint32_param == 1 and seen["log_info"].bool_param is True
        with pytest.raises(InferenceServerException, match="log_file is not supported"):
            client.update_log_settings({"log_file": "/tmp/router.log"})
        with pytest.raises(grpc.RpcError) as info:
            request = pb.LogSettingsRequest()
            request.settings["log_warning"].bool_param = False
            stub.LogSettings(request, timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "threshold" in info.value.details()
        assert client.get_log_settings()["log_verbose_level"] == 1  # the refused changes moved nothing
    finally:
        client.update_log_settings({"log_verbose_level": 0})


def test_the_server_name_is_a_setting_answered_by_both_doors(tmp_path, etcd_endpoint):
    """``server_name`` (Triton's clients print it; some tools look for "triton"): ServerMetadata answers it
    over gRPC and REST; a name that is empty or not printable stops the router at start, naming it."""
    prefix = f"/t{uuid.uuid4().hex[:8]}/mcp"
    router = RouterProcess(tmp_path, etcd_endpoint, prefix=prefix, scheduler="", server_name="triton").start()
    try:
        stub = pb_grpc.GRPCInferenceServiceStub(router.channel())
        assert stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=10).name == "triton"
        got, _, raw = _http(router.endpoints["rest"], "GET", "/v2")
        assert got == 200 and json.loads(raw)["name"] == "triton"
    finally:
        router.stop()
    (tmp_path / "bad").mkdir()
    bad = RouterProcess(tmp_path / "bad", etcd_endpoint, prefix=prefix, scheduler="", server_name="a\tb")
    with pytest.raises(RuntimeError, match="server_name: 1 to 256 printable characters"):
        bad.start()
