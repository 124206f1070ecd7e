"""BYTES and BF16 tensors, request parameters, decoupled streaming and sequences, end to end: Triton's own
``tritonclient`` (gRPC in a subprocess, ``triton_types_script.py``; HTTP here) and plain HTTP and gRPC
against a real router, scheduler and worker, with the builtin demo models ``demo-strlen`` and
``demo-stream`` and a BF16 copy of ``demo-mlp``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as triton_http
import yaml
from harness import WorkerProcess, make_demo_repository, mlp_reference, small_mesh, wait_for

from mcpapi.kserve import grpc_service_pb2 as pb
from mcpapi.kserve import grpc_service_pb2_grpc as pb_grpc
from mcpapi.v2 import control_pb2, control_pb2_grpc, model_pb2

TEXT = np.array([b"hello", "h\u00e9llo".encode(), b"", b"\xff\x00bin"], dtype=object)
MODELS = {"demo-stream": "1", "mlp-bf16": "1", "demo-mlp": "1"}  # besides demo-strlen, small_mesh's own
SCRIPT = Path(__file__).with_name("triton_types_script.py")


def _script(url: str, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), url, *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _bf16_copy(repo) -> None:
    """mlp-bf16/1: demo-mlp/1's weights and graph, computed and served in BF16."""
    src, dst = repo / "demo-mlp" / "1", repo / "mlp-bf16" / "1"
    dst.mkdir(parents=True)
    shutil.copy(src / "weights.safetensors", dst / "weights.safetensors")
    config = yaml.safe_load((src / "model.yaml").read_text())
    for tensor in (*config["inputs"], *config["outputs"]):
        tensor["dtype"] = "BF16"
    config.pop("fallback_version", None)
    (dst / "model.yaml").write_text(yaml.safe_dump(config))


def _load(channel: grpc.Channel, router: grpc.Channel, model: str, version: str) -> None:
    spec = model_pb2.ModelSpec(model=model, versions=[version], replicas=1)
    control_pb2_grpc.ModelControlStub(channel).LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=60)
    stub = pb_grpc.GRPCInferenceServiceStub(router)
    wait_for(
        lambda: stub.ModelReady(pb.ModelReadyRequest(name=model, version=version), timeout=5).ready,
        timeout_s=30,
        what=f"{model}/{version} routed",
    )


@pytest.fixture(scope="module")
def mesh(tmp_path_factory, etcd_endpoint):
    tmp = tmp_path_factory.mktemp("types")
    repo = make_demo_repository(tmp / "models")
    _bf16_copy(repo)
    with small_mesh(tmp, etcd_endpoint, repo, "demo-strlen", ["1"]) as m:
        for model, version in MODELS.items():
            _load(m.scheduler.channel(), m.router.channel(), model, version)
        yield m, repo, tmp, etcd_endpoint


@pytest.fixture(scope="module")
def report(mesh):
    """Every tritonclient.grpc case, run once against the module's router."""
    return _script(mesh[0].router.endpoints["grpc"], "types")


@pytest.fixture(scope="module")
def http_client(mesh):
    client = triton_http.InferenceServerClient(mesh[0].router.endpoints["rest"], network_timeout=30)
    yield client
    client.close()


def _post(url: str, path: str, doc: dict) -> tuple[int, dict]:
    body = json.dumps(doc).encode()
    request = urllib.request.Request(f"http://{url}{path}", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _latin1(values) -> list[str]:
    return [bytes(v).decode("latin-1") for v in values]


# --- BYTES -----------------------------------------------------------------------------------------------


def test_bytes_go_both_ways_over_grpc(report):
    assert report["strlen"] == {
        "length": [5, 6, 0, 5], "length_datatype": "INT64", "echo": _latin1(TEXT),  # NUL and 0xff too
    }  # fmt: skip


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_bytes_go_both_ways_over_http(http_client, binary):
    text = TEXT[:3] if not binary else TEXT  # JSON carries strings: UTF-8 only
    x = triton_http.InferInput("TEXT", [len(text)], "BYTES")
    x.set_data_from_numpy(text, binary_data=binary)
    outputs = [triton_http.InferRequestedOutput(n, binary_data=binary) for n in ("LENGTH", "ECHO")]
    result = http_client.infer("demo-strlen", [x], outputs=outputs)
    assert result.as_numpy("LENGTH").tolist() == [len(t) for t in text]
    echo = [v.encode() if isinstance(v, str) else bytes(v) for v in result.as_numpy("ECHO")]  # JSON: str
    assert echo == text.tolist()


def test_bytes_in_plain_json_and_an_output_json_cannot_carry_goes_binary(mesh, http_client):
    url = mesh[0].router.endpoints["rest"]
    status, doc = _post(
        url,
        "/v2/models/demo-strlen/infer",
        {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [2], "data": ["ab", "h\u00e9"]}]},
    )
    assert status == 200
    outputs = {o["name"]: o for o in doc["outputs"]}
    assert outputs["LENGTH"]["data"] == [2, 3] and outputs["ECHO"]["data"] == ["ab", "h\u00e9"]
    # JSON asked for, but 0xff is no UTF-8: that output comes back as binary data, not mangled
    x = triton_http.InferInput("TEXT", [1], "BYTES")
    x.set_data_from_numpy(np.array([b"\xff"], dtype=object), binary_data=True)
    out = triton_http.InferRequestedOutput("ECHO", binary_data=False)
    assert http_client.infer("demo-strlen", [x], outputs=[out]).as_numpy("ECHO").tolist() == [b"\xff"]
    status, doc = _post(
        url,
        "/v2/models/demo-strlen/infer",
        {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": [7]}]},
    )
    assert status == 400 and "BYTES data are strings, got int" in doc["error"]


def test_malformed_bytes_are_refused_at_the_router_naming_the_fault(mesh):
    stub = pb_grpc.GRPCInferenceServiceStub(mesh[0].router.channel())
    request = pb.ModelInferRequest(model_name="demo-strlen")
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[2])
    request.raw_input_contents.append(b"\x03\x00\x00\x00abc\x09\x00\x00\x00x")
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input TEXT: BYTES element 1 says 9 bytes but only 1 remain" in info.value.details()
    request = pb.ModelInferRequest(model_name="demo-strlen")  # typed contents work too
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[2]).contents.bytes_contents.extend([b"ab", b""])
    response = stub.ModelInfer(request, timeout=10)
    assert np.frombuffer(response.raw_output_contents[0], "<i8").tolist() == [2, 0]


# --- BF16 --------------------------------------------------------------------------------------------------


def test_bf16_end_to_end_over_both_doors(mesh, report, http_client):
    repo = mesh[1]
    x = np.array(report["bf16"]["input"], dtype=np.float32)
    reference = mlp_reference(repo, "demo-mlp", "1", x.astype(ml_dtypes.bfloat16).astype(np.float32))
    meta = report["bf16"]["metadata"]
    assert meta["inputs"][0]["datatype"] == "BF16" and meta["outputs"][0]["datatype"] == "BF16"
    assert report["bf16"]["datatype"] == "BF16"
    h = triton_http.InferInput("INPUT0", [2, 64], "BF16")
    h.set_data_from_numpy(x.astype(ml_dtypes.bfloat16), binary_data=True)
    out = triton_http.InferRequestedOutput("OUTPUT0", binary_data=True)
    over_http = http_client.infer("mlp-bf16", [h], outputs=[out]).as_numpy("OUTPUT0").astype(np.float32)
    over_grpc = np.array(report["bf16"]["output"], dtype=np.float32)
    for y in (over_grpc, over_http):
        assert y.shape == (2, 16)
        np.testing.assert_allclose(y, reference, rtol=0.05, atol=0.05)  # BF16 keeps ~3 digits
    assert np.array_equal(over_grpc, over_http)


# --- decoupled streaming and parameters ----------------------------------------------------------------


def test_a_decoupled_model_streams_n_answers_then_an_empty_final_one(report):
    answers = report["stream"]
    assert [a["final"] for a in answers] == [False] * 5 + [True]
    assert [a["index"] for a in answers[:5]] == [[i] for i in range(5)]
    assert [a["text"] for a in answers[:5]] == [[f"chunk {i}"] for i in range(5)]
    assert answers[5]["outputs"] == [] and {a["id"] for a in answers} == {"s1"}


def test_answers_of_requests_on_one_stream_keep_their_ids_and_order(report):
    by_id: dict[str, list[int]] = {}
    for answer in report["same_ids"]:
        assert "error" not in answer and answer["final"] is None  # the client did not ask for finals
        by_id.setdefault(answer["id"], []).append(answer["index"][0])
    assert sorted(by_id["a"]) == [0, 0, 1, 1, 2] and by_id["b"] == [0, 1, 2, 3]


def test_request_parameters_reach_the_backend(report):
    """demo-stream reads delay_ms itself: a value it cannot take comes back with its own message."""
    (answer,) = report["bad_parameter"]
    assert "request parameter delay_ms must be an integer in 0..10000, got 'soon'" in answer["error"]


def test_a_decoupled_model_over_a_unary_call_is_refused_with_what_to_do(report, mesh):
    refused = report["unary_decoupled"]
    assert refused["status"] == "StatusCode.INVALID_ARGUMENT"
    assert "decoupled" in refused["message"] and "ModelStreamInfer" in refused["message"]
    status, doc = _post(
        mesh[0].router.endpoints["rest"],
        "/v2/models/demo-stream/infer",
        {"inputs": [{"name": "N", "datatype": "INT32", "shape": [1], "data": [2]}]},
    )
    assert status == 400 and "decoupled" in doc["error"]
    assert report["config_stream"]["model_transaction_policy"] == {"decoupled": True}


def test_reserved_parameter_names_are_refused(report):
    refused = report["reserved_parameter"]
    assert (
        refused["status"] == "StatusCode.INVALID_ARGUMENT"
        and "'mcp.' are the mesh's own" in refused["message"]
    )


# --- sequences -------------------------------------------------------------------------------------------


def test_a_sequence_whose_worker_restarted_gets_an_error_in_band_never_a_silent_reroute(
    tmp_path, etcd_endpoint
):
    repo = make_demo_repository(tmp_path / "models")
    with small_mesh(tmp_path, etcd_endpoint, repo, "demo-mlp", ["1"]) as m:
        url = m.router.endpoints["grpc"]
        assert _script(url, "seq", "42", "--start")["status"] == "OK"
        assert _script(url, "seq", "42")["status"] == "OK"  # the sequence runs on
        assert _script(url, "seq", "43", "--start")["status"] == "OK"
        rest = m.router.endpoints["rest"]
        assert _post(rest, "/v2/models/demo-mlp/infer", _rest_seq(44, start=True))[0] == 200
        m.worker.kill()  # kill -9, then the same worker id comes back (a new incarnation, its state gone)
        again = WorkerProcess(
            tmp_path, etcd_endpoint, repo, prefix=m.worker.prefix, worker_id=m.worker.worker_id
        )
        try:
            again.start()
            stub = pb_grpc.GRPCInferenceServiceStub(m.router.channel())
            x = pb.ModelInferRequest(model_name="demo-mlp")
            x.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 64])
            x.raw_input_contents.append(np.ones((1, 64), "<f4").tobytes())

            def reloaded() -> bool:
                try:
                    stub.ModelInfer(x, timeout=5)  # not a sequence: goes wherever it can
                    return True
                except grpc.RpcError:
                    return False

            wait_for(reloaded, timeout_s=60, what="demo-mlp served by the restarted worker")
            lost = _script(url, "seq", "42")
            assert lost["status"] == "StatusCode.ABORTED"
            assert "sequence 42 of model demo-mlp ran on worker" in lost["message"]
            assert "start it again" in lost["message"]
            again_lost = _script(url, "seq", "42")  # and stays lost: never adopted by another worker
            assert again_lost["status"] == "StatusCode.ABORTED"
            # on a stream the same fault is an answer on the stream (in band)
            in_band = _script(url, "seq", "43", "--stream")
            assert in_band["status"] == "ERROR" and "sequence 43 of model demo-mlp" in in_band["message"]
            status, doc = _post(rest, "/v2/models/demo-mlp/infer", _rest_seq(44))  # and through REST: 409
            assert status == 409 and "sequence 44 of model demo-mlp ran on worker" in doc["error"]
            placed_afresh = _script(url, "seq", "42", "--start", "--end")  # a new start
            assert placed_afresh["status"] == "OK"
        finally:
            again.stop()  # small_mesh stops the worker it started, not this one


@contextmanager
def _second_worker(m, tmp, etcd_endpoint, repo, model: str) -> Iterator[WorkerProcess]:  # type: ignore[no-untyped-def]
    """A second worker on ``m``'s prefix, and ``model`` asked for on both workers (stopped after)."""
    second = WorkerProcess(
        tmp, etcd_endpoint, repo, prefix=m.worker.prefix, worker_id=f"w2-{uuid.uuid4().hex[:6]}"
    )
    second.start()
    try:
        spec = model_pb2.ModelSpec(model=model, versions=["1"], replicas=2)
        control_pb2_grpc.ModelControlStub(m.scheduler.channel()).LoadModel(
            control_pb2.LoadModelRequest(spec=spec), timeout=60
        )
        yield second
    finally:
        second.stop()


def _rest_seq(sequence: int, *, start: bool = False) -> dict:
    return {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}],
        "parameters": {"sequence_id": sequence, "sequence_start": start},
    }


def test_a_sequence_stays_on_its_worker_when_the_ring_changes(tmp_path, etcd_endpoint):
    """Sequences begun on one worker stay there after a second one joins the ring (their hash may now
    lead elsewhere), while requests outside sequences spread over both."""
    repo = make_demo_repository(tmp_path / "models")
    with small_mesh(tmp_path, etcd_endpoint, repo, "demo-mlp", ["1"]) as m:
        stub = pb_grpc.GRPCInferenceServiceStub(m.router.channel())

        def send(sequence: int | None = None, step: int = 0) -> None:
            r = pb.ModelInferRequest(model_name="demo-mlp")
            r.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 64])
            r.raw_input_contents.append(np.ones((1, 64), "<f4").tobytes())
            if sequence is not None:
                r.parameters["sequence_id"].int64_param = sequence
                r.parameters["sequence_start"].bool_param = step == 0
                r.parameters["sequence_end"].bool_param = step == 2
            stub.ModelInfer(r, timeout=10)

        sequences = range(1000, 1020)
        for sequence in sequences:
            send(sequence, 0)
        with _second_worker(m, tmp_path, etcd_endpoint, repo, "demo-mlp") as second:

            def both_routed() -> bool:  # requests outside sequences spread over the ring
                send()
                return served(second) is not None

            wait_for(both_routed, timeout_s=60, what="demo-mlp routed to the second worker")
            before = (served(m.worker), served(second))
            for step in (1, 2):
                for sequence in sequences:
                    send(sequence, step)
            after = (served(m.worker), served(second))
            assert [a - b for a, b in zip(after, before, strict=True)] == [40, 0]


def served(worker: WorkerProcess) -> float | None:
    """Requests the worker answered for demo-mlp over ZeroMQ (None: it serves no demo-mlp yet)."""
    total = None
    for line in worker.metrics_text().splitlines():
        if (
            line.startswith("mcp_requests_total{")
            and 'model="demo-mlp"' in line
            and 'api_version="zmq"' in line
        ):
            total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
    return total


def _executions(worker: WorkerProcess, model: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in worker.metrics_text().splitlines()
        if line.startswith("mcp_worker_executions_total{") and f'model="{model}"' in line
    )


def test_a_stream_whose_worker_dies_part_way_ends_with_an_error_and_is_never_run_again(
    tmp_path, etcd_endpoint
):
    """demo-stream is idempotent, but once one of its answers went out a resend would repeat them: the
    client gets the answers that came, then the error, on the stream, and no other worker runs it."""
    repo = make_demo_repository(tmp_path / "models")
    with (
        small_mesh(tmp_path, etcd_endpoint, repo, "demo-stream", ["1"]) as m,
        _second_worker(m, tmp_path, etcd_endpoint, repo, "demo-stream") as second,
    ):

        def running_there() -> bool:
            return any(
                line.startswith('mcp_model_state{model="demo-stream"') and 'state="RUNNING"' in line
                and line.endswith(" 1.0")
                for line in second.metrics_text().splitlines()
            )  # fmt: skip

        wait_for(running_there, timeout_s=30, what="demo-stream running on the second worker")
        stub = pb_grpc.GRPCInferenceServiceStub(m.router.channel())
        request = pb.ModelInferRequest(model_name="demo-stream", id="long")
        request.inputs.add(name="N", datatype="INT32", shape=[1])
        request.raw_input_contents.append(np.array([100], "<i4").tobytes())
        request.parameters["delay_ms"].int64_param = 50  # 5 s of answers
        responses = stub.ModelStreamInfer(iter([request]), timeout=60)
        first = next(responses)
        assert not first.error_message and first.infer_response.id == "long"
        running = [w for w in (m.worker, second) if _executions(w, "demo-stream") > 0]
        assert len(running) == 1
        idle = second if running[0] is m.worker else m.worker
        running[0].kill()
        rest = list(responses)
        assert rest and rest[-1].error_message and "may have started" in rest[-1].error_message
        assert all(not r.error_message for r in rest[:-1]) and len(rest) < 100
        assert _executions(idle, "demo-stream") == 0  # never sent again


def test_tritonclients_shared_memory_utilities_carry_bytes_both_ways(mesh, http_client):
    """Triton's own shm utilities (tritonclient.utils.shared_memory), as its examples use them: BYTES
    in, INT64 and BYTES out, all in the client's region; nothing but JSON crosses HTTP."""
    import tritonclient.utils.shared_memory as triton_shm  # noqa: PLC0415  (needs its native library)
    from tritonclient.utils import serialize_byte_tensor  # noqa: PLC0415

    text = TEXT[:3]
    serialized = serialize_byte_tensor(text)  # BYTES go into a region serialized, as Triton's examples do
    need_in = len(serialized.item())
    key = f"/mcp-types-{uuid.uuid4().hex[:8]}"
    region = triton_shm.create_shared_memory_region("types", key, need_in + 8 * 3 + 256)
    try:
        triton_shm.set_shared_memory_region(region, [serialized])
        http_client.register_system_shared_memory("types", key, need_in + 8 * 3 + 256)
        x = triton_http.InferInput("TEXT", [3], "BYTES")
        x.set_shared_memory("types", need_in)
        length = triton_http.InferRequestedOutput("LENGTH", binary_data=True)
        length.set_shared_memory("types", 24, offset=need_in)
        echo = triton_http.InferRequestedOutput("ECHO", binary_data=True)
        echo.set_shared_memory("types", 256, offset=need_in + 24)
        result = http_client.infer("demo-strlen", [x], outputs=[length, echo])
        assert "data" not in result.get_output("LENGTH")  # its data is in the region, not in the reply
        got = triton_shm.get_contents_as_numpy(region, np.int64, [3], offset=need_in)
        assert got.tolist() == [len(t) for t in text]
        back = triton_shm.get_contents_as_numpy(region, np.object_, [3], offset=need_in + 24)
        assert [bytes(v) for v in back] == text.tolist()
    finally:
        http_client.unregister_system_shared_memory("types")
        triton_shm.destroy_shared_memory_region(region)
