"""The KServe V2 servicer called directly over a fake DataPlane: conversion, validation, forwarding."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from mcp_router.dataplane import (
    Batching,
    BatchSizeStats,
    DataPlane,
    Duration,
    InferResult,
    ModelConfigInfo,
    ModelIndexEntry,
    ModelMetadata,
    ModelStats,
    SequenceFlags,
    TensorMeta,
)
from mcp_router.frontends import kserve_grpc_wire
from mcp_router.frontends.kserve_codec import EXTENSIONS
from mcp_router.frontends.kserve_grpc import KServeServicer
from mcpapi.kserve import grpc_service_pb2 as pb
from mcpapi.kserve import model_config_pb2 as mc
from mcpcore import dtypes
from mcpcore.errors import Internal, InvalidArgument, NotFound

NUMERIC = sorted(n for n in dtypes.NAMES if n != "BYTES")
TYPED_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


class FakeDataPlane(DataPlane):
    """Records every call; ``infer`` returns its inputs as outputs (renamed IN* -> OUT*) unless told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []
        self.outputs: dict[str, np.ndarray] | None = None
        self.entries = [
            ModelIndexEntry("demo-mlp", "1", "READY"),
            ModelIndexEntry("demo-onnx", "2", "UNAVAILABLE", "no worker has room"),
        ]
        self.config: ModelConfigInfo | None = None
        self.stats: list[ModelStats] = []

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return False

    def model_ready(self, model: str, version: str = "") -> bool:
        self.calls.append(("model_ready", (model, version), {}))
        return model == "demo-mlp"

    def model_metadata(self, model: str, version: str = "") -> ModelMetadata:
        self.calls.append(("model_metadata", (model, version), {}))
        if model != "demo-mlp":
            raise NotFound(f"model {model} has no serving version")
        return ModelMetadata(
            "demo-mlp",
            ("1", "2"),
            "numpy",
            (TensorMeta("INPUT0", "FP32", (-1, 64)),),
            (TensorMeta("OUTPUT0", "FP32", (-1, 16)),),
        )

    def model_config(self, model: str, version: str = "") -> ModelConfigInfo:
        self.calls.append(("model_config", (model, version), {}))
        if self.config is None:
            raise NotFound(f"model {model} has no serving version")
        return self.config

    async def model_statistics(self, model: str = "", version: str = "") -> list[ModelStats]:
        self.calls.append(("model_statistics", (model, version), {}))
        return self.stats

    def route(self, model, version="", routing_key="", candidates=1):  # type: ignore[no-untyped-def]
        raise AssertionError("the KServe adapter never routes by itself")

    async def infer(self, model, version, request_id, inputs, **kwargs):  # type: ignore[no-untyped-def]
        self.calls.append(("infer", (model, version, request_id, dict(inputs)), kwargs))
        outputs = self.outputs
        if outputs is None:
            outputs = {name.replace("IN", "OUT", 1): arr for name, arr in inputs.items()}
        return InferResult(model, version or "1", "w1", outputs)

    def index(self) -> list[ModelIndexEntry]:
        return self.entries

    async def load(self, model: str, version: str = "") -> None:
        self.calls.append(("load", (model, version), {}))

    async def unload(self, model: str) -> None:
        self.calls.append(("unload", (model,), {}))


class FakeContext:
    def __init__(self, remaining: float | None) -> None:
        self.remaining = remaining

    def time_remaining(self) -> float | None:
        return self.remaining


ZEROS = ("INPUT0", np.zeros(2, np.float32))


@pytest.fixture
def dp() -> FakeDataPlane:
    return FakeDataPlane()


@pytest.fixture
def svc(dp: FakeDataPlane) -> KServeServicer:
    return KServeServicer(dp, version="0.1.0")


async def model_infer(
    svc: KServeServicer, request: pb.ModelInferRequest, context: Any
) -> pb.ModelInferResponse:
    """ModelInfer as grpc runs it: the request through its deserializer, the reply's parts joined as a
    grpc.aio server joins them (its serializer), then parsed back."""
    received = kserve_grpc_wire.parse_request(request.SerializeToString())
    serialize = svc.grpc_codecs["ModelInfer"][1]
    return pb.ModelInferResponse.FromString(serialize(await svc.ModelInfer(received, context)))


def raw_request(*arrays: tuple[str, np.ndarray], **kwargs) -> pb.ModelInferRequest:  # type: ignore[no-untyped-def]
    req = pb.ModelInferRequest(model_name="demo-mlp", **kwargs)
    for name, arr in arrays:
        req.inputs.add(name=name, datatype=dtypes.from_numpy(arr.dtype), shape=arr.shape)
        req.raw_input_contents.append(bytes(dtypes.to_bytes(arr)))
    return req


def decode(resp: pb.ModelInferResponse) -> dict[str, np.ndarray]:
    return {
        out.name: dtypes.from_bytes(out.datatype, raw, tuple(out.shape), out.name)
        for out, raw in zip(resp.outputs, resp.raw_output_contents, strict=True)
    }


def sample(name: str, shape: tuple[int, ...] = (2, 3)) -> np.ndarray:
    rng = np.random.default_rng(len(name))
    dtype = dtypes.numpy_dtype(name)
    if dtype.kind == "b":
        return rng.random(shape) > 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


# --- health and metadata -------------------------------------------------------------------------------


async def test_health_and_server_metadata(svc, dp):
    assert (await svc.ServerLive(pb.ServerLiveRequest(), None)).live is True
    assert (await svc.ServerReady(pb.ServerReadyRequest(), None)).ready is False
    assert (await svc.ModelReady(pb.ModelReadyRequest(name="demo-mlp", version="2"), None)).ready
    assert not (await svc.ModelReady(pb.ModelReadyRequest(name="nope"), None)).ready
    assert dp.calls[:2] == [("model_ready", ("demo-mlp", "2"), {}), ("model_ready", ("nope", ""), {})]
    meta = await svc.ServerMetadata(pb.ServerMetadataRequest(), None)
    assert (meta.name, meta.version, list(meta.extensions)) == ("mcpmesh", "0.1.0", list(EXTENSIONS))


async def test_model_metadata_converts_every_field(svc, dp):
    meta = await svc.ModelMetadata(pb.ModelMetadataRequest(name="demo-mlp", version="1"), None)
    assert (meta.name, list(meta.versions), meta.platform) == ("demo-mlp", ["1", "2"], "numpy")
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("INPUT0", "FP32", [-1, 64])]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [("OUTPUT0", "FP32", [-1, 16])]
    assert dp.calls == [("model_metadata", ("demo-mlp", "1"), {})]


async def test_model_metadata_not_found_propagates(svc):
    with pytest.raises(NotFound, match="model ghost has no serving version"):
        await svc.ModelMetadata(pb.ModelMetadataRequest(name="ghost"), None)


async def test_model_config_converts_every_field(svc, dp):
    dp.config = ModelConfigInfo(
        "demo-onnx", "2", "onnx", 32,
        (TensorMeta("INPUT0", "FP32", (-1, 64)), TensorMeta("TEXT", "BYTES", (-1,))),
        (TensorMeta("OUTPUT0", "BF16", (-1, 16)),),
        Batching(2000, (8, 16), 3, 2, 500_000, 128), 2, "gpu", ("1", "2", "10"),
    )  # fmt: skip
    config = (await svc.ModelConfig(pb.ModelConfigRequest(name="demo-onnx", version="2"), None)).config
    assert dp.calls == [("model_config", ("demo-onnx", "2"), {})]
    assert (config.name, config.backend, config.platform) == ("demo-onnx", "onnxruntime", "onnxruntime_onnx")
    assert config.max_batch_size == 32 and list(config.version_policy.specific.versions) == [1, 2, 10]
    assert [(i.name, mc.DataType.Name(i.data_type), list(i.dims)) for i in config.input] == [
        ("INPUT0", "TYPE_FP32", [64]),  # no batch dimension: the model batches
        ("TEXT", "TYPE_STRING", []),
    ]
    assert [(o.name, mc.DataType.Name(o.data_type), list(o.dims)) for o in config.output] == [
        ("OUTPUT0", "TYPE_BF16", [16])
    ]
    b = config.dynamic_batching
    assert (list(b.preferred_batch_size), b.max_queue_delay_microseconds) == ([8, 16], 2000)
    assert (b.priority_levels, b.default_priority_level) == (3, 2)
    q = b.default_queue_policy
    assert (q.default_timeout_microseconds, q.max_queue_size, q.allow_timeout_override) == (
        500_000,
        128,
        True,
    )
    [group] = config.instance_group
    assert (group.count, mc.ModelInstanceGroup.Kind.Name(group.kind)) == (2, "KIND_GPU")
    assert config.model_transaction_policy.decoupled is False


async def test_model_config_of_a_model_that_does_not_batch_keeps_every_dim(svc, dp):
    dp.config = ModelConfigInfo(
        "m", "1", "numpy", 0, (TensorMeta("X", "INT64", (3, 4)),), (), None, 1, "cpu", ("1",)
    )
    config = (await svc.ModelConfig(pb.ModelConfigRequest(name="m"), None)).config
    assert list(config.input[0].dims) == [3, 4] and not config.HasField("dynamic_batching")
    assert (config.backend, config.platform) == ("numpy", "")


async def test_model_config_needs_a_name_and_not_found_propagates(svc, dp):
    with pytest.raises(InvalidArgument, match="model_name is empty"):
        await svc.ModelConfig(pb.ModelConfigRequest(), None)
    with pytest.raises(NotFound, match="no serving version"):
        await svc.ModelConfig(pb.ModelConfigRequest(name="ghost"), None)


async def test_model_statistics_converts_every_field(svc, dp):
    d = Duration
    dp.stats = [
        ModelStats(
            "m", "1", 1234, 10, 3, d(4, 400), d(1, 10), d(4, 40), d(4, 4), d(4, 80), d(4, 8),
            (BatchSizeStats(2, d(1, 1), d(1, 20), d(1, 2)), BatchSizeStats(8, d(2, 3), d(2, 60), d(2, 6))),
        )
    ]  # fmt: skip
    reply = await svc.ModelStatistics(pb.ModelStatisticsRequest(name="m"), None)
    assert dp.calls == [("model_statistics", ("m", ""), {})]
    [s] = reply.model_stats
    assert (s.name, s.version, s.last_inference, s.inference_count, s.execution_count) == (
        "m",
        "1",
        1234,
        10,
        3,
    )
    i = s.inference_stats
    assert [(x.count, x.ns) for x in (i.success, i.fail, i.queue)] == [(4, 400), (1, 10), (4, 40)]
    assert [(x.count, x.ns) for x in (i.compute_input, i.compute_infer, i.compute_output)] == [
        (4, 4), (4, 80), (4, 8)
    ]  # fmt: skip
    assert [(b.batch_size, b.compute_infer.count, b.compute_infer.ns) for b in s.batch_stats] == [
        (2, 1, 20), (8, 2, 60)
    ]  # fmt: skip


async def test_model_statistics_of_a_version_needs_the_model(svc, dp):
    with pytest.raises(InvalidArgument, match="a version needs a model name"):
        await svc.ModelStatistics(pb.ModelStatisticsRequest(version="1"), None)
    assert dp.calls == []


# --- inputs ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", NUMERIC)
async def test_raw_round_trip_every_dtype(svc, dp, datatype):
    x = sample(datatype)
    resp = await model_infer(svc, raw_request(("INPUT0", x)), None)
    got = dp.calls[0][1][3]["INPUT0"]
    assert got.dtype == x.dtype and got.shape == x.shape and not got.flags.writeable  # a view, no copy
    np.testing.assert_array_equal(got, x)
    assert [(o.name, o.datatype, list(o.shape)) for o in resp.outputs] == [("OUTPUT0", datatype, [2, 3])]
    np.testing.assert_array_equal(decode(resp)["OUTPUT0"], x)


async def test_bytes_travel_length_prefixed_raw_or_as_bytes_contents(svc, dp):
    text = np.array([[b"hello", b""], [b"\xff\x00", "caf\u00e9".encode()]], dtype=object)
    resp = await model_infer(svc, raw_request(("INPUT0", text)), None)
    got = dp.calls[0][1][3]["INPUT0"]
    assert got.dtype == object and got.tolist() == text.tolist()
    assert resp.outputs[0].datatype == "BYTES" and decode(resp)["OUTPUT0"].tolist() == text.tolist()
    assert resp.raw_output_contents[0] == b"\x05\0\0\0hello\0\0\0\0\x02\0\0\0\xff\x00\x05\0\0\0caf\xc3\xa9"
    req = pb.ModelInferRequest(model_name="demo-mlp")
    req.inputs.add(name="INPUT0", datatype="BYTES", shape=[2]).contents.bytes_contents.extend([b"a", b"bc"])
    await model_infer(svc, req, None)
    assert dp.calls[1][1][3]["INPUT0"].tolist() == [b"a", b"bc"]


@pytest.mark.parametrize("datatype", sorted(TYPED_FIELD))
async def test_typed_contents_every_dtype(svc, dp, datatype):
    x = sample(datatype)
    req = pb.ModelInferRequest(model_name="demo-mlp")
    tensor = req.inputs.add(name="INPUT0", datatype=datatype, shape=x.shape)
    getattr(tensor.contents, TYPED_FIELD[datatype]).extend(x.ravel().tolist())
    resp = await model_infer(svc, req, None)
    got = dp.calls[0][1][3]["INPUT0"]
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, x)
    np.testing.assert_array_equal(decode(resp)["OUTPUT0"], x)


async def test_several_inputs_keep_their_order_and_names(svc, dp):
    a, b = sample("FP32", (4, 64)), sample("INT64", (4,))
    await model_infer(svc, raw_request(("INPUT0", a), ("INPUT1", b)), None)
    inputs = dp.calls[0][1][3]
    assert list(inputs) == ["INPUT0", "INPUT1"]
    np.testing.assert_array_equal(inputs["INPUT1"], b)


async def test_empty_tensor_without_data_is_allowed(svc, dp):
    req = pb.ModelInferRequest(model_name="demo-mlp")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[0, 64])
    await model_infer(svc, req, None)
    assert dp.calls[0][1][3]["INPUT0"].shape == (0, 64)


def with_raw(datatype: str, shape: list[int], raw: bytes) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="demo-mlp")
    req.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    req.raw_input_contents.append(raw)
    return req


def with_contents(datatype: str, shape: list[int], **contents) -> pb.ModelInferRequest:  # type: ignore[no-untyped-def]
    req = pb.ModelInferRequest(model_name="demo-mlp")
    req.inputs.add(name="INPUT0", datatype=datatype, shape=shape, contents=pb.InferTensorContents(**contents))
    return req


def two_inputs_one_raw() -> pb.ModelInferRequest:
    req = raw_request(ZEROS)
    req.inputs.add(name="INPUT1", datatype="FP32", shape=[2])
    return req


def both_raw_and_contents() -> pb.ModelInferRequest:
    req = with_raw("FP32", [2], b"\0" * 8)
    req.inputs[0].contents.fp32_contents.extend([1.0, 2.0])
    return req


def duplicate_inputs() -> pb.ModelInferRequest:
    x = np.zeros(2, np.float32)
    return raw_request(("INPUT0", x), ("INPUT0", x))


def shared_memory_input() -> pb.ModelInferRequest:
    req = with_raw("FP32", [2], b"\0" * 8)
    req.inputs[0].parameters["shared_memory_region"].string_param = "r0"
    return req


@pytest.mark.parametrize(
    ("request_factory", "message"),
    [
        (
            lambda: with_raw("FP32", [2, 64], b"\0" * 100),
            "input INPUT0: raw content is 100 bytes but shape [2, 64] of FP32 needs 512",
        ),
        (two_inputs_one_raw, "raw_input_contents has 1 entries but the request has 2 inputs"),
        (both_raw_and_contents, "input INPUT0: has both contents and a raw_input_contents entry"),
        (lambda: with_contents("FP32", [2, 2]), "input INPUT0: no data"),
        (
            lambda: with_contents("FP32", [2, 2], fp32_contents=[1, 2, 3]),
            "input INPUT0: contents has 3 elements but shape [2, 2] needs 4",
        ),
        (
            lambda: with_contents("FP32", [2], int64_contents=[1, 2]),
            "input INPUT0: FP32 elements go in contents.fp32_contents, not ['int64_contents']",
        ),
        (
            lambda: with_contents("FP16", [1], fp32_contents=[1.0]),
            "input INPUT0: FP16 has no typed contents field",
        ),
        (
            lambda: with_contents("INT8", [2], int_contents=[1, 300]),
            "input INPUT0: a value in contents.int_contents is out of range for INT8",
        ),
        (
            lambda: with_raw("BYTES", [1], b"\5\0\0\0x"),
            "input INPUT0: BYTES element 0 says 5 bytes but only 1",
        ),
        (
            lambda: with_raw("BYTES", [2], b"\1\0\0\0xyzw"),
            "input INPUT0: BYTES data ends after 1 of 2 elements",
        ),
        (lambda: with_raw("BYTES", [1 << 30], b""), "shape [1073741824] of BYTES spans 4294967296 bytes"),
        (
            lambda: with_raw("BF16", [2], b"\0\0"),
            "input INPUT0: raw content is 2 bytes but shape [2] of BF16",
        ),
        (lambda: with_raw("FP8", [1], b"\0"), "input INPUT0: unknown data type 'FP8'"),
        (lambda: with_raw("FP32", [-1, 2], b""), "input INPUT0: shape [-1, 2] has a negative dimension"),
        (duplicate_inputs, "input INPUT0 appears twice"),
        (shared_memory_input, "raw_input_contents has 1 entries but the request has 0 inputs not in shared"),
        (pb.ModelInferRequest, "model_name is empty"),
    ],
    ids=lambda v: v.split(":")[-1].strip().split(" ")[0] if isinstance(v, str) else "",
)
async def test_bad_inputs_are_invalid_argument_naming_the_tensor(svc, dp, request_factory, message):
    with pytest.raises(InvalidArgument) as info:
        await model_infer(svc, request_factory(), None)
    assert message in info.value.message
    assert dp.calls == []


# --- outputs ---------------------------------------------------------------------------------------------


async def test_requested_outputs_subset_in_requested_order(svc, dp):
    dp.outputs = {name: np.full((2,), i, np.int32) for i, name in enumerate(("A", "B", "C"))}
    req = raw_request(ZEROS, outputs=[{"name": "C"}, {"name": "A"}])
    resp = await model_infer(svc, req, None)
    assert [o.name for o in resp.outputs] == ["C", "A"]
    assert decode(resp)["C"].tolist() == [2, 2] and decode(resp)["A"].tolist() == [0, 0]
    assert dp.calls[0][2]["outputs"] == ("C", "A")


async def test_no_requested_outputs_returns_all(svc, dp):
    dp.outputs = {"A": np.zeros(1, np.float32), "B": np.ones((1, 2), np.float64)}
    resp = await model_infer(svc, raw_request(ZEROS), None)
    assert [(o.name, o.datatype, list(o.shape)) for o in resp.outputs] == [
        ("A", "FP32", [1]),
        ("B", "FP64", [1, 2]),
    ]
    assert dp.calls[0][2]["outputs"] == ()


async def test_a_requested_output_the_dataplane_left_out_is_left_out(svc, dp):
    """The DataPlane decides (an unknown name is its INVALID_ARGUMENT; a secondary output off at breaker
    level 2 it leaves out): the adapter encodes what it got, in the order asked."""
    dp.outputs = {"OUTPUT0": np.zeros(1, np.float32)}
    req = raw_request(ZEROS, outputs=[{"name": "RANK0"}, {"name": "OUTPUT0"}])
    resp = await model_infer(svc, req, None)
    assert [o.name for o in resp.outputs] == ["OUTPUT0"]


async def test_classification_output_is_refused(svc):
    req = raw_request(ZEROS, outputs=[{"name": "OUTPUT0"}])
    req.outputs[0].parameters["classification"].int64_param = 3
    with pytest.raises(InvalidArgument, match="output OUTPUT0: parameter 'classification' is not supported"):
        await model_infer(svc, req, None)


async def test_non_contiguous_output_is_sent_row_major(svc, dp):
    y = np.arange(12, dtype=np.float32).reshape(3, 4).T  # Fortran-ordered view
    dp.outputs = {"OUTPUT0": y}
    resp = await model_infer(svc, raw_request(ZEROS), None)
    np.testing.assert_array_equal(decode(resp)["OUTPUT0"], y)


async def test_output_with_no_tensor_type_is_internal(svc, dp):
    dp.outputs = {"OUTPUT0": np.zeros(2, np.complex64)}
    with pytest.raises(Internal, match="output OUTPUT0 of model demo-mlp"):
        await model_infer(svc, raw_request(ZEROS), None)


# --- parameters ------------------------------------------------------------------------------------------


async def test_parameters_map_to_dataplane_arguments(svc, dp):
    req = raw_request(ZEROS, id="req-7", model_version="2")
    req.parameters["routing_key"].string_param = "user-42"
    req.parameters["priority"].uint64_param = 3  # tritonclient's choice
    req.parameters["timeout"].int64_param = 2_500_000  # microseconds
    req.parameters["tenant"].string_param = "blue"
    req.parameters["verbose"].bool_param = True
    req.parameters["ratio"].double_param = 0.5
    resp = await model_infer(svc, req, None)
    _, (model, version, request_id, _), kwargs = dp.calls[0]
    assert (model, version, request_id) == ("demo-mlp", "2", "req-7")
    assert kwargs["routing_key"] == "user-42" and kwargs["priority"] == 3
    assert kwargs["timeout_s"] == pytest.approx(2.5)
    assert kwargs["parameters"] == {"tenant": "blue", "verbose": "true", "ratio": "0.5"}
    assert kwargs["sequence"] is None
    assert (resp.model_name, resp.model_version, resp.id) == ("demo-mlp", "2", "req-7")


async def test_defaults_and_the_clients_id_only_echoed(svc, dp):
    resp = await model_infer(svc, raw_request(ZEROS), None)
    _, (_, version, request_id, _), kwargs = dp.calls[0]
    assert version == "" and request_id == "" and resp.id == ""  # no id given: none made up (as Triton)
    req = raw_request(ZEROS)
    req.id = "0"  # many clients count from 0: the id is echoed, never used to match replies
    assert (await model_infer(svc, req, None)).id == "0"
    assert kwargs == {
        "routing_key": "", "priority": 0, "timeout_s": None, "outputs": (), "parameters": {},
        "sequence": None, "on_partial": None, "trace": None,
    }  # fmt: skip


@pytest.mark.parametrize(("kind", "value"), [("int64_param", 17), ("string_param", "session-9")])
async def test_sequence_id_keys_the_route(svc, dp, kind, value):
    req = raw_request(ZEROS)
    setattr(req.parameters["sequence_id"], kind, value)
    req.parameters["priority"].int64_param = 1
    req.parameters["sequence_start"].bool_param = True
    await model_infer(svc, req, None)
    assert dp.calls[0][2]["routing_key"] == str(value) and dp.calls[0][2]["priority"] == 1
    assert dp.calls[0][2]["sequence"] == SequenceFlags(str(value), start=True, end=False)
    assert dp.calls[0][2]["parameters"] == {}  # the router's to act on, not the model's (nor the batch key)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"sequence_start": ("bool_param", True)}, "sequence_start and sequence_end need a sequence_id"),
        ({"sequence_id": ("int64_param", 0), "sequence_end": ("bool_param", True)}, "need a sequence_id"),
        ({"sequence_id": ("double_param", 1.5)}, "sequence_id must be an integer or a string"),
        ({"sequence_id": ("int64_param", 3), "sequence_end": ("int64_param", 1)}, "must be a bool"),
        ({"sequence_id": ("string_param", "x" * 257)}, "longer than 256 characters"),
        ({f"p{i}": ("string_param", "x") for i in range(65)}, "65 request parameters; at most 64"),
        ({"big": ("string_param", "x" * (16 << 10))}, "request parameters are 16387 bytes; at most 16384"),
    ],
    ids=["start-without-id", "end-with-id-0", "float-id", "int-end", "long-id", "too-many", "too-big"],
)  # fmt: skip
async def test_bad_request_parameters_are_refused(svc, dp, params, message):
    req = raw_request(ZEROS)
    for key, (kind, value) in params.items():
        setattr(req.parameters[key], kind, value)
    with pytest.raises(InvalidArgument, match=message):
        await model_infer(svc, req, None)
    assert dp.calls == []


@pytest.mark.parametrize(
    ("timeout_us", "remaining", "expected"),
    [(0, None, None), (0, 1.5, 1.5), (3_000_000, 1.5, 1.5), (500_000, 1.5, 0.5), (0, math.inf, None)],
)
async def test_timeout_is_the_shorter_of_parameter_and_deadline(svc, dp, timeout_us, remaining, expected):
    req = raw_request(ZEROS)
    if timeout_us:
        req.parameters["timeout"].int64_param = timeout_us
    await model_infer(svc, req, FakeContext(remaining))
    assert dp.calls[0][2]["timeout_s"] == (pytest.approx(expected) if expected else None)


@pytest.mark.parametrize(
    ("key", "kind", "value", "message"),
    [
        ("priority", "string_param", "high", "parameter priority must be an integer"),
        ("priority", "bool_param", True, "parameter priority must be an integer"),
        ("timeout", "double_param", 1.5, "parameter timeout must be an integer"),
        ("timeout", "int64_param", -1, "parameter timeout is -1"),
        ("routing_key", "int64_param", 5, "parameter routing_key must be a string"),
    ],
)
async def test_bad_parameters_are_invalid_argument(svc, dp, key, kind, value, message):
    req = raw_request(ZEROS)
    setattr(req.parameters[key], kind, value)
    with pytest.raises(InvalidArgument, match=message):
        await model_infer(svc, req, None)
    assert dp.calls == []


# --- repository ------------------------------------------------------------------------------------------


async def test_index_and_ready_filter(svc):
    every = await svc.RepositoryIndex(pb.RepositoryIndexRequest(), None)
    assert [(m.name, m.version, m.state, m.reason) for m in every.models] == [
        ("demo-mlp", "1", "READY", ""),
        ("demo-onnx", "2", "UNAVAILABLE", "no worker has room"),
    ]
    ready = await svc.RepositoryIndex(pb.RepositoryIndexRequest(ready=True), None)
    assert [m.name for m in ready.models] == ["demo-mlp"]


async def test_load_and_unload_forward(svc, dp):
    await svc.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="demo-onnx"), None)
    req = pb.RepositoryModelLoadRequest(model_name="demo-onnx")
    req.parameters["version"].string_param = "2"
    await svc.RepositoryModelLoad(req, None)
    unload = pb.RepositoryModelUnloadRequest(model_name="demo-onnx")
    unload.parameters["unload_dependents"].bool_param = False  # always sent by tritonclient
    await svc.RepositoryModelUnload(unload, None)
    assert dp.calls == [
        ("load", ("demo-onnx", ""), {}),
        ("load", ("demo-onnx", "2"), {}),
        ("unload", ("demo-onnx",), {}),
    ]


@pytest.mark.parametrize(
    ("key", "message"),
    [("config", "load parameter 'config' is not supported"), ("file:1/model.onnx", "is not supported")],
)
async def test_load_with_config_or_files_is_refused(svc, dp, key, message):
    req = pb.RepositoryModelLoadRequest(model_name="demo-onnx")
    req.parameters[key].string_param = "{}"
    with pytest.raises(InvalidArgument, match=message):
        await svc.RepositoryModelLoad(req, None)
    assert dp.calls == []


async def test_load_version_must_be_a_string(svc, dp):
    req = pb.RepositoryModelLoadRequest(model_name="demo-onnx")
    req.parameters["version"].int64_param = 2
    with pytest.raises(InvalidArgument, match="load parameter 'version' must be a string"):
        await svc.RepositoryModelLoad(req, None)


async def test_load_and_unload_need_a_model_name(svc):
    with pytest.raises(InvalidArgument, match="model_name is empty"):
        await svc.RepositoryModelLoad(pb.RepositoryModelLoadRequest(), None)
    with pytest.raises(InvalidArgument, match="model_name is empty"):
        await svc.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(), None)
