"""Large tensor frames are received straight into native pool blocks, sized by the header and checked."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import zmq
import zmq.asyncio

from mcp_worker.buffers import BatchBuffers
from mcp_worker.zmq_server import TensorServer
from mcpapi.v2 import tensor_pb2
from mcpcore import wire
from mcpcore.errors import InvalidArgument

pytestmark = pytest.mark.usefixtures("built_library")
MiB = 1 << 20


async def echo(msg: wire.Message, partial) -> tuple[str, dict[str, np.ndarray]]:
    return "1", {name: arr.copy() for name, arr in msg.named().items()}


@pytest.fixture
async def server(tmp_path):
    buffers = BatchBuffers(blocks_per_class=2)
    srv = TensorServer(f"ipc://{tmp_path}/t.sock", echo, buffers=buffers)
    await srv.start()
    ctx = zmq.asyncio.Context()
    client = ctx.socket(zmq.DEALER)
    client.connect(srv.endpoint)
    yield srv, buffers, client
    client.close(linger=0)
    ctx.term()
    await srv.stop()
    buffers.close()


async def _ask(client, frames) -> wire.Message:  # type: ignore[no-untyped-def]
    await client.send_multipart(frames, copy=False)
    async with asyncio.timeout(10):
        return wire.decode(await client.recv_multipart())


async def test_a_large_tensor_arrives_in_a_pool_block_and_round_trips(server):
    _, buffers, client = server
    x = np.random.default_rng(0).random((1024, 1024), dtype=np.float32)  # 4 MiB
    header = tensor_pb2.TensorHeader(kind=tensor_pb2.KIND_REQUEST, request_id="big", model="m")
    reply = await _ask(client, wire.encode(header, {"X": x, "small": np.arange(4, dtype=np.int64)}))
    wire.raise_for_status(reply.header)
    np.testing.assert_array_equal(reply.named()["X"], x)
    np.testing.assert_array_equal(reply.named()["small"], np.arange(4))
    assert buffers.pool_hits == 1  # only the large frame came from the pool


@pytest.mark.parametrize("actual", [3 * MiB, 4 * MiB + 1024])
async def test_a_frame_that_contradicts_its_header_is_refused_and_its_block_returned(server, actual):
    _, buffers, client = server
    header = tensor_pb2.TensorHeader(kind=tensor_pb2.KIND_REQUEST, request_id="liar", model="m")
    frames = wire.encode(header, {"X": np.zeros(MiB, np.float32)})  # the header says 4 MiB
    reply = await _ask(client, [frames[0], b"\0" * actual])
    assert reply.header.request_id == "liar"
    with pytest.raises(InvalidArgument, match="frame has"):
        wire.raise_for_status(reply.header)
    for _ in range(3):  # every block went back: the 8 MiB class (2 blocks) serves again and again
        ok = await _ask(client, wire.encode(header, {"X": np.ones(MiB, np.float32)}))
        wire.raise_for_status(ok.header)
    assert buffers.fallbacks == 0
