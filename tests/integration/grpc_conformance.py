"""The gRPC conformance suite's parts: the transports, a test service, and ways to call a server
(grpc's clients, or raw HTTP/2 for hostile callers). Used by ``test_native_grpc_server.py`` and
``test_native_grpc_hostile.py``; every test there takes the ``transport`` fixture, so it runs on grpc.aio
(the reference) and on the native front door with the same assertions, unless ``native_only`` says why.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from pathlib import Path

import grpc
import grpc.aio
import pytest

from mcp_devcluster import certs as devcluster_certs
from mcp_native.grpc_server import NativeServer
from mcpcore.call_context import RpcServer
from mcpcore.serving import GrpcService, Parts, join_parts
from mcpcore.tls import TLSConfig, peer_names
from mcpcore.transport.aio_server import AioServer

ROOT = Path(__file__).resolve().parents[2]
SERVICE = "t.Native"
TRANSPORTS = {"aio": AioServer, "native": NativeServer}


def native_only(why: str) -> pytest.MarkDecorator:
    """A case that states a behaviour of the native transport alone (``why``: what grpc.aio lacks)."""
    return pytest.mark.parametrize("transport", [NativeServer], ids=[f"native-only: {why}"])


class Behaviour:
    """The test service: bytes in, bytes out (no codecs), with probes into what the handler saw."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.seen_metadata: tuple = ()
        self.seen_remaining: float | None = None
        self.seen_names: set[str] = set()
        self.contexts: list[object] = []
        self.big = bytearray(b"\x07" * (1 << 20))

    async def echo(self, request: bytes, context) -> bytes:
        self.contexts.append(context)
        self.seen_metadata = tuple(context.invocation_metadata())
        self.seen_remaining = context.time_remaining()
        context.set_trailing_metadata((("x-trailer", "t1"), ("x-bin", b"\x00\xff")))
        return b"echo:" + request

    async def status(self, request: bytes, context) -> bytes | None:
        if request == b"abort":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "aborted on purpose")
        if request == b"raise":
            raise RuntimeError("the handler broke")
        context.set_code(grpc.StatusCode.NOT_FOUND)
        context.set_details("no such thing")
        return None

    async def wait(self, request: bytes, context) -> bytes:
        self.entered.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return b"released"

    async def big_reply(self, request: bytes, context) -> Parts:
        return Parts([b"head:", memoryview(self.big), b":tail"])

    async def who(self, request: bytes, context) -> bytes:
        self.seen_names = peer_names(context.auth_context())
        return ",".join(sorted(self.seen_names)).encode()

    async def count(self, request: bytes, context):
        for i in range(int(request)):
            yield str(i).encode()

    async def total(self, requests, context) -> bytes:
        return str(sum([int(r) async for r in requests])).encode()

    async def chat(self, requests, context):
        async for r in requests:
            yield b"re:" + r


def handlers(b: Behaviour) -> dict[str, grpc.RpcMethodHandler]:
    return {
        "Echo": grpc.unary_unary_rpc_method_handler(b.echo),
        "Status": grpc.unary_unary_rpc_method_handler(b.status),
        "Wait": grpc.unary_unary_rpc_method_handler(b.wait),
        # a reply of Parts names join_parts (for grpc.aio); the native server sends the parts as they are
        "Big": grpc.unary_unary_rpc_method_handler(b.big_reply, response_serializer=join_parts),
        "Who": grpc.unary_unary_rpc_method_handler(b.who),
        "Count": grpc.unary_stream_rpc_method_handler(b.count),
        "Total": grpc.stream_unary_rpc_method_handler(b.total),
        "Chat": grpc.stream_stream_rpc_method_handler(b.chat),
    }


async def serve(
    b: Behaviour,
    transport: type[RpcServer],
    *,
    tls: TLSConfig | None = None,
    max_calls: int | None = None,
    max_receive: int = 1 << 20,
) -> tuple[GrpcService, int]:
    service = GrpcService(
        [SERVICE],
        server_factory=transport,
        maximum_concurrent_rpcs=max_calls,
        tls=tls,
        options=[("grpc.max_receive_message_length", max_receive), ("grpc.max_send_message_length", 8 << 20)],
    )
    assert isinstance(service.server, transport)
    service.server.add_registered_method_handlers(SERVICE, handlers(b))
    port = await service.start("127.0.0.1", 0)
    await service.set_serving()
    return service, port


async def serve_one(
    transport: type[RpcServer], name: str, handler: grpc.RpcMethodHandler
) -> tuple[GrpcService, int]:
    service = GrpcService([SERVICE], server_factory=transport)
    service.server.add_registered_method_handlers(SERVICE, {name: handler})
    return service, await service.start("127.0.0.1", 0)


def method(channel: grpc.aio.Channel, name: str, kind: str = "unary_unary"):
    return getattr(channel, kind)(f"/{SERVICE}/{name}")


def make_certs(tmp_path: Path) -> Path:
    return devcluster_certs.make_certs(tmp_path / "certs", workers=[])


def _h2_frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def h2_call(path: bytes, stream: int, headers: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    """One gRPC call in raw HTTP/2 (HPACK literals without indexing), request sent whole."""
    fields = ((b":method", b"POST"), (b":scheme", b"http"), (b":path", path), (b":authority", b"x"),
              (b"content-type", b"application/grpc"), (b"te", b"trailers"), *headers)  # fmt: skip
    block = b"".join(b"\x00" + bytes([len(k)]) + k + bytes([len(v)]) + v for k, v in fields)
    message = b"\x00" + struct.pack(">I", 2) + b"hi"
    return _h2_frame(1, 4, stream, block) + _h2_frame(0, 1, stream, message)


def _h2_ended_streams(sock: socket.socket, streams: set[int], timeout_s: float = 10.0) -> set[int]:
    """Read the server's frames until each of ``streams`` ended (END_STREAM, or RST_STREAM)."""
    sock.settimeout(timeout_s)
    data, ended = b"", set()
    while not streams <= ended:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed with streams {sorted(streams - ended)} open"
        data += chunk
        while len(data) >= 9 and len(data) >= 9 + int.from_bytes(data[:3], "big"):
            size, kind, flags = int.from_bytes(data[:3], "big"), data[3], data[4]
            stream = int.from_bytes(data[5:9], "big") & 0x7FFFFFFF
            if (kind in (0, 1) and flags & 1) or kind == 3:
                ended.add(stream)
            data = data[9 + size :]
    return ended


async def until(condition, what: str, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def answers_again(ch: grpc.aio.Channel, timeout_s: float = 10.0) -> None:
    """An Echo is answered: on a server with room for one call, no earlier call still holds a place.
    (A call's place is let go just after its client saw the status, so a refusal is retried.)"""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            assert await method(ch, "Echo")(b"again", timeout=timeout_s) == b"echo:again"
            return
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
            assert asyncio.get_running_loop().time() < deadline, "an ended call still holds its place"
            await asyncio.sleep(0.02)


async def send_raw(port: int, streams: set[int], *calls: bytes) -> set[int]:
    """Send ``calls`` (raw HTTP/2) on one new connection; the streams of ``streams`` that ended on it."""
    loop = asyncio.get_running_loop()
    sock = await loop.run_in_executor(None, socket.create_connection, ("127.0.0.1", port))
    try:
        preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _h2_frame(4, 0, 0, b"")
        await loop.run_in_executor(None, sock.sendall, preface + b"".join(calls))
        return await loop.run_in_executor(None, _h2_ended_streams, sock, streams)
    finally:
        sock.close()
