"""Large tensor frames reach the request path as views of libzmq's own buffers (no copy), checked against
their header: a frame that contradicts it is refused, and the server goes on."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import zmq
import zmq.asyncio

from mcp_worker.tensor_server.server import TensorServer
from mcpapi.v2 import tensor_pb2
from mcpcore import wire
from mcpcore.errors import InvalidArgument

MiB = 1 << 20


@pytest.fixture
async def server(tmp_path):
    seen: list[np.ndarray] = []

    def echo(msg: wire.Message, partial, done):  # type: ignore[no-untyped-def]
        named = msg.named()
        seen.extend(named.values())
        done(("1", {name: arr.copy() for name, arr in named.items()}))
        return lambda: None

    srv = TensorServer(f"ipc://{tmp_path}/t.sock", echo)
    await srv.start()
    ctx = zmq.asyncio.Context()
    client = ctx.socket(zmq.DEALER)
    client.connect(srv.endpoint)
    yield seen, client
    client.close(linger=0)
    ctx.term()
    await srv.stop()


async def _ask(client, frames) -> wire.Message:  # type: ignore[no-untyped-def]
    await client.send_multipart(frames, copy=False)
    async with asyncio.timeout(10):
        return wire.decode(await client.recv_multipart())


async def test_a_large_tensor_arrives_as_a_view_of_the_received_frame_and_round_trips(server):
    seen, client = server
    x = np.random.default_rng(0).random((1024, 1024), dtype=np.float32)  # 4 MiB
    header = tensor_pb2.TensorHeader(kind=tensor_pb2.KIND_REQUEST, request_id="big", model="m")
    reply = await _ask(client, wire.encode(header, {"X": x, "small": np.arange(4, dtype=np.int64)}))
    wire.raise_for_status(reply.header)
    np.testing.assert_array_equal(reply.named()["X"], x)
    np.testing.assert_array_equal(reply.named()["small"], np.arange(4))
    owner = seen[0]
    while isinstance(owner, np.ndarray):  # the starter's array is a view ... of a view ... of the frame
        assert not owner.flags.owndata
        owner = owner.base
    assert isinstance(owner, memoryview) and isinstance(owner.obj, zmq.Frame)


@pytest.mark.parametrize("actual", [3 * MiB, 4 * MiB + 1024])
async def test_a_frame_that_contradicts_its_header_is_refused_and_the_server_goes_on(server, actual):
    _, client = server
    header = tensor_pb2.TensorHeader(kind=tensor_pb2.KIND_REQUEST, request_id="liar", model="m")
    frames = wire.encode(header, {"X": np.zeros(MiB, np.float32)})  # the header says 4 MiB
    reply = await _ask(client, [frames[0], b"\0" * actual])
    assert reply.header.request_id == "liar"
    with pytest.raises(InvalidArgument, match="frame has"):
        wire.raise_for_status(reply.header)
    for _ in range(3):
        ok = await _ask(client, wire.encode(header, {"X": np.ones(MiB, np.float32)}))
        wire.raise_for_status(ok.header)
