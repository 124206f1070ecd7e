"""The wire format over real ZeroMQ sockets to a server in another process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zmq

from mcpapi.v2 import tensor_pb2
from mcpcore import wire
from mcpcore.errors import InvalidArgument

SERVER = Path(__file__).with_name("zmq_echo_server.py")


@pytest.fixture
def endpoint(tmp_path):
    address = f"ipc://{tmp_path}/tensors.sock"
    proc = subprocess.Popen([sys.executable, str(SERVER), address], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "READY"
        yield address
    finally:
        proc.kill()
        proc.wait(5)


@pytest.fixture
def dealer(endpoint):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(endpoint)
    yield sock
    sock.close(linger=0)
    ctx.term()


def _send(sock: zmq.Socket, request_id: str, **tensors: np.ndarray) -> None:
    header = tensor_pb2.TensorHeader(kind=tensor_pb2.KIND_REQUEST, request_id=request_id, model="m")
    sock.send_multipart(wire.encode(header, tensors), copy=False)


def test_many_in_flight_round_trip_through_another_process(dealer):
    sent = {f"r{i}": np.random.default_rng(i).random((i + 1, 64), dtype=np.float32) for i in range(20)}
    for rid, x in sent.items():
        _send(dealer, rid, INPUT0=x)
    for _ in sent:
        msg = wire.decode(dealer.recv_multipart(copy=False))
        wire.raise_for_status(msg.header)
        np.testing.assert_array_equal(msg.named()["INPUT0"], sent[msg.header.request_id] * 2)


def test_large_tensor_round_trip(dealer):
    x = np.random.default_rng(0).random((1024, 1024), dtype=np.float32)  # 4 MiB
    _send(dealer, "big", X=x)
    np.testing.assert_array_equal(wire.decode(dealer.recv_multipart(copy=False)).tensors[0], x * 2)


def test_server_answers_malformed_frames_with_an_error_and_keeps_serving(dealer):
    header = tensor_pb2.TensorHeader(kind=tensor_pb2.KIND_REQUEST, request_id="bad", model="m")
    frames = wire.encode(header, {"T": np.zeros(4, np.float32)})
    dealer.send_multipart([frames[0], b"\0" * 3])  # 3 bytes where the header says 16
    reply = wire.decode(dealer.recv_multipart()).header
    with pytest.raises(InvalidArgument, match="frame has 3 bytes but its header says 16"):
        wire.raise_for_status(reply)

    dealer.send_multipart([b"not a header at all \xff\xff"])
    with pytest.raises(InvalidArgument, match="not a TensorHeader"):
        wire.raise_for_status(wire.decode(dealer.recv_multipart()).header)

    _send(dealer, "after", T=np.ones(2, np.float32))
    msg = wire.decode(dealer.recv_multipart())
    assert msg.header.request_id == "after" and list(msg.tensors[0]) == [2.0, 2.0]
