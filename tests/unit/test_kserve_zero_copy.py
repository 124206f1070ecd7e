"""kserve_grpc_wire: ModelInfer requests parsed with their raw entries as views, responses written with
their raw entries as read-only views (copied at most once, by a grpc.aio server); whatever protobuf
would refuse is still refused, by protobuf."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from mcp_router.frontends import kserve_grpc_wire
from mcpapi.kserve import grpc_service_pb2 as pb
from mcpcore import dtypes


def request(*sizes: int) -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name="m", model_version="2", id="req-7")
    r.parameters["priority"].int64_param = 3
    r.parameters["note"].string_param = "x" * 300  # a field after a multi-byte length
    for i, size in enumerate(sizes):
        t = r.inputs.add(name=f"IN{i}", datatype="UINT8", shape=[size])
        t.parameters["k"].bool_param = True
        r.raw_input_contents.append(np.random.default_rng(i).bytes(size))
    r.outputs.add(name="OUT")
    return r


def test_a_large_request_keeps_its_raw_entries_as_views_of_the_received_bytes():
    sent = request(kserve_grpc_wire.SPLIT_FROM_BYTES, 5, 0, 1 << 20)
    data = sent.SerializeToString()
    got = kserve_grpc_wire.parse_request(data)
    assert [bytes(r) for r in got.raw] == list(sent.raw_input_contents)
    assert all(isinstance(r, memoryview) and r.obj is data for r in got.raw)  # no copy was made
    assert len(got.message.raw_input_contents) == 0
    expected = pb.ModelInferRequest()
    expected.CopyFrom(sent)
    del expected.raw_input_contents[:]
    assert got.message == expected


def test_a_large_request_without_raw_entries_is_parsed_by_protobuf_whole():
    sent = pb.ModelInferRequest(model_name="m")
    sent.inputs.add(name="IN", datatype="FP32", shape=[20_000]).contents.fp32_contents.extend(range(20_000))
    data = sent.SerializeToString()
    assert len(data) >= kserve_grpc_wire.SPLIT_FROM_BYTES
    got = kserve_grpc_wire.parse_request(data)
    assert got.message == sent and len(got.raw) == 0


def test_a_small_request_is_parsed_by_protobuf_whole():
    sent = request(16, 3)
    got = kserve_grpc_wire.parse_request(sent.SerializeToString())
    assert got.message == sent and list(got.raw) == list(sent.raw_input_contents)


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d[: len(d) - 1000],  # a raw entry cut short
        lambda d: d + b"\x3a\xff\xff\xff\xff\x0f",  # a raw entry longer than the message
        lambda d: d + b"\x80" * 11,  # a varint that never ends
        lambda d: d + b"\x0b",  # a group (field 1, start group)
        lambda d: d + b"\x3f",  # wire type 7 does not exist
        lambda d: d + b"\xba\x80\x80\x80\x80\x00\x01x",  # a raw entry's tag padded to 6 bytes
        lambda d: d + b"\x3a\x81\x80\x80\x80\x80\x00x",  # a raw entry's length padded to 6 bytes
    ],
)
def test_bytes_that_do_not_walk_meet_protobufs_own_checks(damage):
    data = damage(request(kserve_grpc_wire.SPLIT_FROM_BYTES).SerializeToString())
    with pytest.raises(DecodeError):
        pb.ModelInferRequest.FromString(data)
    with pytest.raises(DecodeError):
        kserve_grpc_wire.parse_request(data)


def test_a_large_request_of_many_small_fields_is_left_to_protobuf():
    sent = request(kserve_grpc_wire.SPLIT_FROM_BYTES)
    for i in range(kserve_grpc_wire.MAX_FIELDS):
        sent.parameters[f"p{i}"].int64_param = i
    data = sent.SerializeToString()
    got = kserve_grpc_wire.parse_request(data)
    assert got.message == sent and list(got.raw) == list(sent.raw_input_contents)
    assert not any(isinstance(r, memoryview) for r in got.raw)  # protobuf's own copies: the walk gave up


def test_a_response_serializes_with_its_raw_entries_in_order():
    response = pb.ModelInferResponse(model_name="m", model_version="1", id="abc")
    response.outputs.add(name="A", datatype="FP32", shape=[2, 3])
    response.outputs.add(name="B", datatype="BYTES", shape=[1])
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    big = np.random.default_rng(0).bytes(300_000)
    data = b"".join(kserve_grpc_wire.serialize_response(response, [a, b"", memoryview(big)]))
    back = pb.ModelInferResponse.FromString(data)
    assert list(back.raw_output_contents) == [a.tobytes(), b"", big]
    assert back.id == "abc" and [o.name for o in back.outputs] == ["A", "B"]


def test_a_responses_outputs_are_read_only_views_of_their_own_memory():
    """The native server sends read-only parts from their own memory and copies writable ones: the
    outputs must come out read-only (a worker's reply frames are writable buffers) and uncopied."""
    response = pb.ModelInferResponse(model_name="m")
    out = np.ones(1 << 18, dtype=np.float32)  # writable, as the arrays decoded from a worker's reply
    parts = kserve_grpc_wire.serialize_response(response, [dtypes.to_bytes(out)])
    views = [p for p in parts if isinstance(p, memoryview) and p.nbytes == out.nbytes]
    assert len(views) == 1 and views[0].readonly
    assert np.shares_memory(np.frombuffer(views[0], dtype=np.float32), out)
