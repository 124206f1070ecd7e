"""Fuzzing the router's KServe gRPC front door (``inference.GRPCInferenceService``) on a real mesh.

Contract: a hostile ``ModelInferRequest`` (names, versions, shapes, datatypes, contents against raw
entries, parameters of every type, sizes), or bytes that are no request at all, is answered with a
status a client can act on (INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE, RESOURCE_EXHAUSTED; never UNKNOWN
or INTERNAL) and a clear message, or with a correct answer; the router serves a valid request after
each; and none of it counts as the real model's server-side error (``mcp_request_errors_total`` of the
classes the breaker reads), nor as an error of the router's own loops.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from fuzzing import HOSTILE_NAMES, assert_clear, fuzz_settings, hostile_text, model_health
from harness import mlp_reference
from hypothesis import given
from hypothesis import strategies as st

from mcpapi.kserve import grpc_service_pb2 as pb
from mcpapi.kserve import grpc_service_pb2_grpc as pb_grpc

MODEL = "demo-mlp"
X = np.random.default_rng(7).random((2, 64), dtype=np.float32)
ALLOWED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


@pytest.fixture(scope="module")
def channel(mesh) -> Any:  # type: ignore[no-untyped-def]
    ch = mesh.router.channel()
    yield ch
    ch.close()


@pytest.fixture(scope="module")
def expected(repo: Path) -> np.ndarray:
    return mlp_reference(repo, MODEL, "1", X)


def valid_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=MODEL, model_version="1", id="probe")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=list(X.shape))
    request.raw_input_contents.append(X.tobytes())
    return request


def probe(channel: grpc.Channel, expected: np.ndarray) -> None:
    """The router still serves: a valid request gets the demo MLP's answer."""
    response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(valid_request(), timeout=15)
    out = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(len(X), 16)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def check_refusal(err: grpc.RpcError, what: str) -> None:
    assert err.code() in ALLOWED, f"{what}: {err.code()} {err.details()}"
    assert_clear(err.details() or "", what)


# --- strategies ------------------------------------------------------------------------------------------

_INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
_UINT64 = st.integers(0, (1 << 64) - 1)
_DATATYPES = ("FP32", "FP16", "BF16", "FP64", "INT8", "INT64", "UINT64", "BOOL", "BYTES")
_datatypes = st.one_of(
    st.sampled_from(_DATATYPES), st.sampled_from(["fp32", "", "FLOAT", "TYPE_FP32"]), hostile_text(12)
)
_shapes = st.one_of(
    st.tuples(st.integers(0, 4), st.sampled_from([64, 63, 65, 0])).map(list),
    st.lists(st.one_of(st.integers(-2, 70), _INT64), max_size=4),
    st.lists(st.integers(0, 2), min_size=60, max_size=100),  # past numpy's 64 dimensions
    st.tuples(st.just(0), st.integers(1 << 20, 1 << 62), st.integers(1 << 20, 1 << 62)).map(list),
)
_params = st.one_of(
    st.builds(pb.InferParameter, bool_param=st.booleans()),
    st.builds(pb.InferParameter, int64_param=_INT64),
    st.builds(pb.InferParameter, uint64_param=_UINT64),
    st.builds(pb.InferParameter, double_param=st.floats(allow_nan=True, allow_infinity=True)),
    st.builds(pb.InferParameter, string_param=hostile_text(40)),
    st.just(pb.InferParameter()),  # no value at all
)
#: Triton's parameter names, and others; "timeout" only where it cannot expire (the breaker counts
#: timeouts: a client's own 1 µs deadline is not garbage but a choice).
_param_names = st.one_of(
    st.sampled_from(["priority", "routing_key", "sequence_id", "sequence_start", "sequence_end"]),
    st.sampled_from(["binary_data_output", "shared_memory_region", "classification", "mcp.features_off"]),
    hostile_text(20),
)
_contents_fields = (
    "bool_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents", "fp32_contents",
    "fp64_contents", "bytes_contents",
)  # fmt: skip


@st.composite
def contents(draw: st.DrawFn) -> pb.InferTensorContents:
    field = draw(st.sampled_from(_contents_fields))
    values: st.SearchStrategy[Any] = {
        "bool_contents": st.booleans(),
        "int_contents": st.integers(-(1 << 31), (1 << 31) - 1),
        "int64_contents": _INT64,
        "uint_contents": st.integers(0, (1 << 32) - 1),
        "uint64_contents": _UINT64,
        "fp32_contents": st.floats(width=32, allow_nan=True),
        "fp64_contents": st.floats(allow_nan=True),
        "bytes_contents": st.binary(max_size=16),
    }[field]
    out = pb.InferTensorContents()
    getattr(out, field).extend(draw(st.lists(values, max_size=200)))
    return out


@st.composite
def infer_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    names = st.one_of(st.just(MODEL), st.just(MODEL), st.sampled_from(HOSTILE_NAMES), hostile_text(40))
    versions = st.one_of(st.just(""), st.just("1"), st.sampled_from(["2", "0", "-1", "01"]), hostile_text(12))
    request = pb.ModelInferRequest(
        model_name=draw(names),
        model_version=draw(versions),
        id=draw(st.one_of(st.just(""), hostile_text(40))),
    )
    raws = []
    for _ in range(draw(st.integers(0, 3))):
        shape = draw(_shapes)
        tensor = request.inputs.add(
            name=draw(st.one_of(st.just("INPUT0"), hostile_text(30))), datatype=draw(_datatypes), shape=shape
        )
        for key in draw(st.lists(_param_names, max_size=2)):
            tensor.parameters[key].CopyFrom(draw(_params))
        how = draw(st.sampled_from(["raw-right", "raw-any", "contents", "both", "none"]))
        rows = shape[0] if shape and 0 <= shape[0] <= 4 else 1
        if how in ("raw-right", "both"):
            raws.append(np.ones((rows, 64), np.float32).tobytes())
        elif how == "raw-any":
            raws.append(draw(st.binary(max_size=1100)))
        if how in ("contents", "both"):
            tensor.contents.CopyFrom(draw(contents()))
    if draw(st.booleans()):  # raw entries as they came, or one too many / too few
        request.raw_input_contents.extend(raws)
    else:
        request.raw_input_contents.extend(raws[1:] + [b"\0" * 4] * draw(st.integers(0, 2)))
    for key in draw(st.lists(_param_names, max_size=4)):
        request.parameters[key].CopyFrom(draw(_params))
    if draw(st.booleans()):
        request.parameters["timeout"].CopyFrom(draw(st.sampled_from(_NO_EXPIRY)))
    for name in draw(st.lists(st.one_of(st.just("OUTPUT0"), st.just("RANK0"), hostile_text(20)), max_size=2)):
        out = request.outputs.add(name=name)
        for key in draw(st.lists(_param_names, max_size=2)):
            out.parameters[key].CopyFrom(draw(_params))
    return request


_NO_EXPIRY = (
    pb.InferParameter(int64_param=0),
    pb.InferParameter(int64_param=-1),
    pb.InferParameter(int64_param=60_000_000),
    pb.InferParameter(int64_param=(1 << 63) - 1),
    pb.InferParameter(uint64_param=(1 << 64) - 1),
    pb.InferParameter(string_param="1000"),
    pb.InferParameter(double_param=float("nan")),
    pb.InferParameter(bool_param=True),
)


# --- the tests ---------------------------------------------------------------------------------------------


@fuzz_settings(50)
@given(request=infer_requests())
def test_hostile_infer_requests(mesh, channel, expected, request: pb.ModelInferRequest) -> None:  # type: ignore[no-untyped-def]
    before = model_health(mesh.router, MODEL)
    try:
        response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=15)
    except grpc.RpcError as err:
        check_refusal(err, "ModelInfer")
    else:  # garbage that happened to be a valid request: then the answer is the model's
        assert response.model_name == MODEL
        assert response.id == request.id
    probe(channel, expected)
    assert model_health(mesh.router, MODEL) == before, (
        "client garbage counted as the model's (or the router's) error"
    )


def _mutated(data: bytes, cuts: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for at, value in cuts:
        if out:
            out[at % len(out)] = value
    return bytes(out)


_big = valid_request()
_big.inputs[0].shape[:] = [300, 64]
_big.raw_input_contents[0] = np.ones((300, 64), np.float32).tobytes()  # 76 KiB: the zero-copy split path
_VALID_BYTES = (valid_request().SerializeToString(), _big.SerializeToString())


@fuzz_settings(40)
@given(
    data=st.one_of(
        st.binary(max_size=300),
        st.tuples(
            st.sampled_from(_VALID_BYTES), st.lists(st.tuples(_INT64, st.integers(0, 255)), max_size=4)
        ).map(lambda t: _mutated(*t)),
        st.tuples(st.sampled_from(_VALID_BYTES), st.integers(1, 200)).map(lambda t: t[0][: -t[1]]),
        st.tuples(st.sampled_from(_VALID_BYTES), st.binary(min_size=1, max_size=12)).map(
            lambda t: t[0] + t[1]
        ),
    ),
    stream=st.booleans(),
)
def test_bytes_that_are_no_request(mesh, channel, expected, data: bytes, stream: bool) -> None:  # type: ignore[no-untyped-def]
    """Raw bytes on ModelInfer and ModelStreamInfer: protobuf's parse (or the router's own zero-copy
    walk of a large request) refuses what does not parse, INVALID_ARGUMENT, never UNKNOWN."""
    before = model_health(mesh.router, MODEL)
    try:
        if stream:
            call = channel.stream_stream(STREAM)
            for answer in call(iter([data]), timeout=15):
                reply = pb.ModelStreamInferResponse.FromString(answer)
                if reply.error_message:
                    assert_clear(reply.error_message, "a stream's error answer")
        else:
            pb.ModelInferResponse.FromString(channel.unary_unary(INFER)(data, timeout=15))
    except grpc.RpcError as err:
        check_refusal(err, "raw bytes")
    probe(channel, expected)
    assert model_health(mesh.router, MODEL) == before


@pytest.mark.parametrize(
    "shape",
    [
        pytest.param([70_000, 64], id="over-16MiB-frame"),
        pytest.param([1 << 31, 64], id="dim-past-int32"),
        pytest.param([1 << 40, 1 << 40], id="product-overflows"),
        pytest.param([-1, 64], id="negative"),
        pytest.param([0, (1 << 31) - 1, (1 << 31) - 1], id="empty-but-vast"),
        pytest.param([1] * 100, id="100-dimensions"),
    ],
)
def test_sizes(mesh, channel, expected, shape: list[int]) -> None:  # type: ignore[no-untyped-def]
    """Shapes too large for the mesh: refused as the client's, not counted against the model."""
    before = model_health(mesh.router, MODEL)
    request = pb.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=shape)
    rows = shape[0] if 0 < shape[0] <= 70_000 and shape[1] == 64 else 1
    request.raw_input_contents.append(np.zeros((rows, 64), np.float32).tobytes())
    with pytest.raises(grpc.RpcError) as caught:
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    check_refusal(caught.value, f"shape {shape}")
    probe(channel, expected)
    assert model_health(mesh.router, MODEL) == before
