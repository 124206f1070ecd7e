"""Fuzzing the worker's ZeroMQ port: hostile multipart messages on a raw DEALER, against a real worker.

Contract (DESIGN.md section 3, ``mcp_worker.tensor_server``): nothing a peer sends stops the server. A
message is answered with an error reply whose status message is clear (no traceback, names what is
wrong), or, for what has nothing to answer (a cancel, an empty coalesced message), not at all; the
receive loop never fails (``mcp_loop_errors_total`` stays where it was), and a valid request sent after
the garbage, on the same socket and on a fresh one, gets the demo MLP's right answer.

Each example sends its garbage, then a probe (a valid request with a fresh id) on the same socket, and
reads until the probe's reply: every reply read on the way (to this example's garbage, or a late one
to an earlier example's) is checked.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq
from fuzzing import assert_clear, fuzz_settings, hostile_text
from harness import TensorClient, metric, mlp_reference, serving_worker
from hypothesis import given
from hypothesis import strategies as st

from mcpapi.v2 import tensor_pb2
from mcpcore import wire

MODEL = "demo-mlp"
X = np.random.default_rng(11).random((3, 64), dtype=np.float32)
_INT64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
_UINT64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
_UINT32 = st.integers(min_value=0, max_value=(1 << 32) - 1)


@pytest.fixture(scope="module")
def worker(repo: Path, etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with serving_worker(tmp_path_factory.mktemp("zmq"), etcd_endpoint, repo, (MODEL,)) as proc:
        yield proc


@pytest.fixture(scope="module")
def expected(repo: Path) -> np.ndarray:
    return mlp_reference(repo, MODEL, "1", X)


class Peer:
    """A raw DEALER: sends any frames, and reads replies (single or coalesced) until a given id's."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, 15_000)  # a hang fails the test (zmq.Again), never blocks it
        self.sock.connect(endpoint)
        self.replies = 0

    def send(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def probe(self, expected: np.ndarray) -> None:
        """A valid request; every reply before its own is checked; its own must be right."""
        rid = f"probe-{uuid.uuid4().hex}"
        header = tensor_pb2.TensorHeader(kind=tensor_pb2.KIND_REQUEST, request_id=rid, model=MODEL)
        self.sock.send_multipart(wire.encode(header, {"INPUT0": X}), copy=False)
        while True:
            for reply in self._recv():
                if reply.header.request_id == rid:
                    wire.raise_for_status(reply.header)
                    np.testing.assert_allclose(reply.named()["OUTPUT0"], expected, rtol=1e-4, atol=1e-5)
                    return
                check_reply(reply.header)
                self.replies += 1

    def _recv(self) -> list[wire.Message]:
        frames = self.sock.recv_multipart()
        header = wire.parse_header(frames[0])
        if header.kind != wire.KIND_BATCH:
            return [wire.Message(header, wire.tensors_of(header, frames[1:]))]
        return [wire.Message(h, wire.tensors_of(h, f)) for h, f in wire.uncoalesce(header, frames[1:])]

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


def check_reply(header: tensor_pb2.TensorHeader) -> None:
    """A reply to garbage: a reply, and if an error then a clear one with a known gRPC code."""
    assert header.kind == tensor_pb2.KIND_REPLY, header
    if header.status_code != 0:
        assert 0 < header.status_code <= 16, header
        assert header.status_code not in (2, 13), f"UNKNOWN/INTERNAL for garbage: {header.status_message}"
        assert_clear(header.status_message, f"(status {header.status_code})")


@pytest.fixture(scope="module")
def peer(worker) -> Any:  # type: ignore[no-untyped-def]
    p = Peer(worker.endpoints["zmq"])
    yield p
    p.close()


def loop_errors(worker) -> float:  # type: ignore[no-untyped-def]
    return metric(worker.metrics_text(), "mcp_loop_errors_total")


# --- strategies ------------------------------------------------------------------------------------------

_dtypes = st.one_of(
    st.sampled_from(list(tensor_pb2.DataType.values())), st.integers(-(1 << 31), (1 << 31) - 1)
)
_shapes = st.lists(
    st.one_of(st.integers(-3, 70), _INT64, st.sampled_from([1 << 31, 1 << 32, (1 << 62), -(1 << 63)])),
    max_size=5,
)
_tensor_names = st.one_of(st.just("INPUT0"), hostile_text(40))


@st.composite
def tensor_specs(draw: st.DrawFn) -> tuple[tensor_pb2.TensorSpec, bytes]:
    """A tensor's spec and frame: well-formed for the demo MLP, or anything but."""
    if draw(st.booleans()):  # the demo's input, then spoiled in one field at most
        rows = draw(st.integers(0, 4))
        spec = tensor_pb2.TensorSpec(
            name="INPUT0", dtype=tensor_pb2.TYPE_FP32, shape=[rows, 64], byte_size=rows * 256
        )
        frame = np.ones((rows, 64), np.float32).tobytes()
        spoil = draw(st.sampled_from(["none", "name", "dtype", "shape", "byte_size", "frame"]))
        if spoil == "name":
            spec.name = draw(_tensor_names)
        elif spoil == "dtype":
            spec.dtype = draw(_dtypes)
        elif spoil == "shape":
            del spec.shape[:]
            spec.shape.extend(draw(_shapes))
        elif spoil == "byte_size":
            spec.byte_size = draw(_UINT64)
        elif spoil == "frame":
            frame = draw(st.binary(max_size=2048))
        return spec, frame
    spec = tensor_pb2.TensorSpec(
        name=draw(_tensor_names), dtype=draw(_dtypes), shape=draw(_shapes), byte_size=draw(_UINT64)
    )
    return spec, draw(st.binary(max_size=512))


@st.composite
def headers(draw: st.DrawFn) -> list[bytes]:
    """A TensorHeader with hostile fields, and tensor frames that may not match it."""
    header = tensor_pb2.TensorHeader(
        kind=draw(st.sampled_from([0, 1, 1, 1, 2, 3, 4, 7])),
        request_id=draw(st.one_of(st.just(""), hostile_text(40), st.just("r" * 10_000))),
        model=draw(st.one_of(st.just(MODEL), st.just(MODEL), hostile_text(40))),
        version=draw(st.one_of(st.just(""), st.just("1"), st.just("2"), hostile_text(12))),
        timeout_us=draw(st.one_of(st.just(0), _UINT64)),
        priority=draw(st.one_of(st.just(0), _UINT32)),
        flags=draw(st.one_of(st.just(0), _UINT32)),
        status_code=draw(st.one_of(st.just(0), st.integers(-(1 << 31), (1 << 31) - 1))),
    )
    for key, value in draw(st.dictionaries(hostile_text(20), hostile_text(20), max_size=4)).items():
        header.parameters[key] = value
    if draw(st.booleans()):
        header.parameters[draw(st.sampled_from(list(_MESH_PARAMETERS)))] = draw(hostile_text(60))
    tensors = draw(st.lists(tensor_specs(), max_size=3))
    header.tensors.extend(spec for spec, _ in tensors)
    frames = [frame for _, frame in tensors]
    drift = draw(st.sampled_from([0, 0, 0, -1, 1, 2]))  # a frame count that does not match the header
    frames = frames[: len(frames) + drift] if drift < 0 else frames + [b"\0" * 8] * drift
    return [header.SerializeToString(), *frames]


_MESH_PARAMETERS = (wire.PARAM_FEATURES_OFF, wire.PARAM_TRACEPARENT, wire.PARAM_ANSWER, "mcp.unknown")

garbage_frames = st.lists(st.binary(max_size=300), min_size=1, max_size=6)


# --- the tests ---------------------------------------------------------------------------------------------


@fuzz_settings(40)
@given(frames=st.one_of(garbage_frames, headers()))
def test_hostile_messages_are_answered_and_the_worker_serves(worker, peer, expected, frames) -> None:  # type: ignore[no-untyped-def]
    before = loop_errors(worker)
    peer.send(frames)
    peer.probe(expected)
    assert worker.proc.poll() is None
    assert loop_errors(worker) == before, "the receive loop caught an error (see the worker log)"


@fuzz_settings(15)
@given(
    batch=st.lists(headers(), min_size=1, max_size=4),
    extra=st.lists(st.binary(max_size=64), max_size=3),
)
def test_hostile_coalesced_messages(worker, peer, expected, batch, extra) -> None:  # type: ignore[no-untyped-def]
    """A KIND_BATCH envelope of hostile headers, with their frames (and some that belong to none)."""
    envelope = tensor_pb2.TensorHeader(kind=wire.KIND_BATCH)
    frames: list[bytes] = []
    for message in batch:
        envelope.batch.append(tensor_pb2.TensorHeader.FromString(message[0]))
        frames += message[1:]
    before = loop_errors(worker)
    peer.send([envelope.SerializeToString(), *frames, *extra])
    peer.probe(expected)
    assert loop_errors(worker) == before, "the receive loop caught an error (see the worker log)"


@pytest.mark.parametrize(
    "frames",
    [
        pytest.param([b"\xff" * (64 * 1024 + 1)], id="header-over-limit"),
        pytest.param([b""], id="empty-header"),
        pytest.param([b"", b"", b"", b""], id="empty-frames"),
        pytest.param([b"\x08\x01" + b"\x2a\x00" * 100], id="100-empty-tensors"),
        pytest.param([b"\x08\x01\x12\x05ab"], id="truncated-field"),
    ],
)
def test_known_hostile_shapes(worker, peer, expected, frames: list[bytes]) -> None:  # type: ignore[no-untyped-def]
    before = loop_errors(worker)
    replies = peer.replies
    peer.send(frames)
    peer.probe(expected)
    assert peer.replies > replies, "the garbage was not answered"
    assert loop_errors(worker) == before


def test_fresh_socket_after_the_garbage(worker, peer, expected) -> None:  # type: ignore[no-untyped-def]
    """Last in the module: a new peer (as a router that connects now) is served, and so is the old one."""
    peer.probe(expected)
    with TensorClient(worker.endpoints["zmq"]) as client:
        reply = client.infer(MODEL, {"INPUT0": X}, version="1")
    np.testing.assert_allclose(reply.named()["OUTPUT0"], expected, rtol=1e-4, atol=1e-5)
    assert worker.proc.poll() is None
    assert peer.replies > 0  # the fuzzing above did reach the worker's refusals
