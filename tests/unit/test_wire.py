"""The tensor wire format: round trips without copies, and every malformed message is rejected by name."""

from __future__ import annotations

import numpy as np
import pytest

from mcpapi.v2 import tensor_pb2
from mcpcore import dtypes, wire
from mcpcore.errors import InvalidArgument, ResourceExhausted, Unavailable


def _request(**tensors: np.ndarray) -> list:
    header = tensor_pb2.TensorHeader(
        kind=tensor_pb2.KIND_REQUEST, request_id="r1", model="demo-mlp", version="1"
    )
    return wire.encode(header, tensors)


def _as_received(frames: list) -> list[bytes]:
    return [bytes(f) for f in frames]


def test_round_trip_keeps_names_shapes_dtypes_and_values():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    ids = np.array([7, 8, 9], dtype=np.int64)
    msg = wire.decode(_as_received(_request(INPUT0=x, IDS=ids)))
    assert msg.header.request_id == "r1"
    named = msg.named()
    np.testing.assert_array_equal(named["INPUT0"], x)
    np.testing.assert_array_equal(named["IDS"], ids)
    assert named["INPUT0"].dtype == np.float32 and named["IDS"].shape == (3,)


def test_bytes_and_bf16_tensors_travel():
    text = np.array([[b"hello", b""], [b"\xff\x00", "caf\u00e9"]], dtype=object)
    half = np.array([1.5, -2.0], dtype=np.float32).astype(dtypes.numpy_dtype("BF16"))
    frames = _request(TEXT=text, HALF=half)
    spec = tensor_pb2.TensorHeader.FromString(bytes(frames[0])).tensors[0]
    assert spec.dtype == tensor_pb2.TYPE_BYTES and spec.byte_size == 4 * 4 + 5 + 2 + 5
    named = wire.decode(_as_received(frames)).named()
    assert named["TEXT"].shape == (2, 2)
    assert named["TEXT"].tolist() == [[b"hello", b""], [b"\xff\x00", "caf\u00e9".encode()]]
    assert named["HALF"].dtype == half.dtype and named["HALF"].astype(np.float32).tolist() == [1.5, -2.0]


def test_a_bytes_frame_that_is_not_its_shape_is_rejected():
    frames = _as_received(_request(TEXT=np.array([b"ab", b"c"], dtype=object)))
    header = tensor_pb2.TensorHeader.FromString(frames[0])
    header.tensors[0].shape[:] = [3]
    with pytest.raises(InvalidArgument, match="tensor 'TEXT': 3 BYTES elements cannot fit in 11 bytes"):
        wire.decode([header.SerializeToString(), frames[1]])


def test_encode_hands_out_the_arrays_own_memory():
    x = np.ones((4, 64), dtype=np.float32)
    frames = _request(INPUT0=x)
    view = np.frombuffer(frames[1], dtype=np.float32)
    assert np.shares_memory(view, x)


def test_decode_views_the_frames_without_copying():
    payload = bytearray(np.arange(8, dtype=np.float32).tobytes())
    frames = _request(T=np.zeros(8, dtype=np.float32))
    arr = wire.decode([frames[0], payload]).tensors[0]
    payload[0:4] = np.float32(42).tobytes()
    assert arr[0] == 42  # a view of the received buffer, not a copy


def test_scalar_and_empty_tensors():
    msg = wire.decode(_as_received(_request(S=np.float64(3.5), E=np.zeros((0, 4), np.float32))))
    assert msg.named()["S"].shape == () and msg.named()["S"] == 3.5
    assert msg.named()["E"].shape == (0, 4)


def test_non_contiguous_input_is_made_contiguous():
    x = np.arange(16, dtype=np.int32).reshape(4, 4).T
    np.testing.assert_array_equal(wire.decode(_as_received(_request(X=x))).tensors[0], x)


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda f: f.append(b"\0" * 4), "lists 1 tensor"),
        (lambda f: f.pop(), "lists 1 tensor"),
        (lambda f: f.__setitem__(1, f[1][:-1]), "frame has 15 bytes but its header says 16"),
        (lambda f: f.__setitem__(0, b"\xff\xff\xff"), "not a TensorHeader"),
    ],
    ids=["extra-frame", "missing-frame", "short-frame", "garbage-header"],
)
def test_malformed_frames_are_rejected(mutate, match):
    frames = _as_received(_request(T=np.zeros(4, dtype=np.float32)))
    mutate(frames)
    with pytest.raises(InvalidArgument, match=match):
        wire.decode(frames)


def _with_spec(**changes) -> list[bytes]:
    frames = _as_received(_request(T=np.zeros((2, 2), dtype=np.float32)))
    header = tensor_pb2.TensorHeader.FromString(frames[0])
    spec = header.tensors[0]
    for field, value in changes.items():
        if field == "shape":
            del spec.shape[:]
            spec.shape.extend(value)
        else:
            setattr(spec, field, value)
    return [header.SerializeToString(), frames[1]]


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"byte_size": 12}, "byte_size 12 does not match shape"),
        ({"shape": [2, 3]}, "does not match shape \\[2, 3\\]"),
        ({"shape": [-1, 4]}, "negative dimension"),
        ({"dtype": tensor_pb2.TYPE_FP64}, "does not match shape"),
        ({"dtype": 99}, "unknown wire data type 99"),
        ({"name": "bad name"}, "not a valid tensor name: 'bad name'"),
    ],
)
def test_header_that_contradicts_its_frames_is_rejected(changes, match):
    with pytest.raises(InvalidArgument, match=match):
        wire.decode(_with_spec(**changes))


def test_size_limits():
    frames = _as_received(_request(A=np.zeros(1024, np.uint8), B=np.zeros(1024, np.uint8)))
    with pytest.raises(ResourceExhausted, match="frame limit"):
        wire.decode(frames, wire.Limits(max_tensor_bytes=512))
    with pytest.raises(ResourceExhausted, match="in total"):
        wire.decode(frames, wire.Limits(max_message_bytes=1500))
    with pytest.raises(ResourceExhausted, match="over the limit of 1"):
        wire.decode(frames, wire.Limits(max_tensors=1))
    with pytest.raises(ResourceExhausted, match="header frame"):
        wire.decode(frames, wire.Limits(max_header_bytes=8))


def test_error_reply_carries_status_and_maps_back():
    request = tensor_pb2.TensorHeader.FromString(_request(T=np.zeros(1, np.float32))[0])
    frame = wire.error_reply(request, Unavailable("worker draining; retry elsewhere"), retryable=True)
    reply = wire.decode([frame]).header
    assert reply.request_id == "r1" and reply.kind == tensor_pb2.KIND_REPLY
    assert reply.flags & wire.FLAG_RETRYABLE
    with pytest.raises(Unavailable, match="worker draining"):
        wire.raise_for_status(reply)


def test_ok_reply_does_not_raise():
    wire.raise_for_status(tensor_pb2.TensorHeader(kind=tensor_pb2.KIND_REPLY))


@pytest.mark.parametrize("name", ["input:0", "onnx::Gemm_0", "serving_default/x:0", "INPUT0"])
def test_tensor_names_as_frameworks_write_them_travel(name):
    header = tensor_pb2.TensorHeader(kind=tensor_pb2.KIND_REQUEST, request_id="r", model="m")
    msg = wire.decode(wire.encode(header, {name: np.arange(3, dtype=np.float32)}))
    assert list(msg.named()) == [name]


@pytest.mark.parametrize("name", [None, b"x", 3])
def test_a_tensor_name_that_is_not_a_str_is_refused_at_encode(name):
    header = tensor_pb2.TensorHeader(kind=tensor_pb2.KIND_REPLY)
    with pytest.raises(TypeError, match="tensor name must be a str"):
        wire.encode(header, [(name, np.zeros(2, np.float32))])
