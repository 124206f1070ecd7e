"""Hostile callers and broken handlers, on both transports (the ``transport`` fixture): each bad call
still ends, answered as grpc.aio answers it, and the server goes on serving. Where grpc.aio itself
fails a case, the test is ``native_only`` and says why.
"""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest
from grpc_conformance import (
    SERVICE,
    Behaviour,
    answers_again,
    h2_call,
    make_certs,
    method,
    native_only,
    send_raw,
    serve,
    serve_one,
)

from mcp_native.grpc_server import STOP_MARGIN_S
from mcpcore.serving import GrpcService
from mcpcore.tls import TLSConfig


async def test_metadata_that_is_not_utf_8_reaches_the_handler_as_latin_1_and_ends_no_other_call(transport):
    b = Behaviour()
    service, port = await serve(b, transport)
    ended = await send_raw(
        port,
        {1, 3},
        h2_call(b"/t.Unknown/Echo", 1, ((b"x-\xffkey", b"v"),)),  # a key that is not UTF-8
        h2_call(f"/{SERVICE}/Echo".encode(), 3, ((b"x-val", b"\xff\xfe"),)),  # a value that is not
    )
    assert ended >= {1, 3}  # both answered
    assert dict(b.seen_metadata)["x-val"] == "\xff\xfe"  # as grpc.aio decodes it: Latin-1
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        assert await method(ch, "Echo")(b"ok", timeout=10) == b"echo:ok"
    await asyncio.wait_for(service.stop(0.2), 10)


async def _echo_again(port: int, timeout_s: float = 10.0) -> bytes:
    """Echo on a new connection, asked again while it ends CANCELLED or UNAVAILABLE: what a call that the
    ended server accepted while its listener closed may get, as any call in flight then."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            try:
                return await method(ch, "Echo")(b"ok", timeout=2, wait_for_ready=True)
            except grpc.aio.AioRpcError as err:
                retry = (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
                if err.code() not in retry or asyncio.get_running_loop().time() > deadline:
                    raise
        await asyncio.sleep(0.02)  # poll interval


async def test_a_path_that_is_not_utf_8_ends_its_call_and_the_server_goes_on(transport):
    """grpc.aio (1.85) ends its whole server on such a path; ``AioServer`` serves again on the same port
    at once, though a call is still running on the server that ended (which finishes it), and again
    after the next one."""
    b = Behaviour()
    service, port = await serve(b, transport)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as held:
        running = asyncio.ensure_future(method(held, "Wait")(b"", timeout=30))
        await asyncio.wait_for(b.entered.wait(), 10)
        for i in range(2):
            assert await send_raw(port, {1}, h2_call(b"/t.Native/\xff\xfe", 1)) == {1}
            assert await _echo_again(port) == b"echo:ok"
            if i == 0:  # within RETIRE_GRACE_S (10 s) of the first: the ended server finishes it
                b.release.set()
                assert await running == b"released"
    await asyncio.wait_for(service.stop(0.2), 10)


INVALID = (grpc.StatusCode.INTERNAL, "Invalid metadata")  # grpc.aio's words; the native server says why too
TYPE_ERROR = "Unexpected <class 'TypeError'>"
BAD_ANSWERS = [
    ((("X-Upper", "v"),), b"r", *INVALID),
    ((("x-k", "caf\u00e9"),), b"r", *INVALID),
    ((("x-k", "a\nb"),), b"r", *INVALID),
    ((["x-list", "fine"],), b"r", grpc.StatusCode.UNKNOWN, f"{TYPE_ERROR}: Invalid trailing metadata type"),
    ((), 42, grpc.StatusCode.UNKNOWN, TYPE_ERROR),  # a reply that is not bytes-like
    ((("x-k", "fine"),), "a str", grpc.StatusCode.OK, ""),  # sent as UTF-8
]


@pytest.mark.parametrize(("trailers", "reply", "code", "details"), BAD_ANSWERS)
async def test_a_handlers_bad_answer_ends_its_call_internal_and_the_server_goes_on(
    transport, trailers, reply, code, details
):
    async def bad(request: bytes, context):
        context.set_trailing_metadata(trailers)
        return reply

    async def echo(request: bytes, context) -> bytes:
        return b"echo:" + request

    service = GrpcService([SERVICE], server_factory=transport, maximum_concurrent_rpcs=1)
    service.server.add_registered_method_handlers(
        SERVICE,
        {"Bad": grpc.unary_unary_rpc_method_handler(bad), "Echo": grpc.unary_unary_rpc_method_handler(echo)},
    )
    port = await service.start("127.0.0.1", 0)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.unary_unary(f"/{SERVICE}/Bad")(b"", timeout=10)
        if code == grpc.StatusCode.OK:
            assert await call == reply.encode()
            assert dict(await call.trailing_metadata())["x-k"] == "fine"
        else:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            assert info.value.code() == code and info.value.details().startswith(details)
        await answers_again(ch)  # the call ended on the server too
    await asyncio.wait_for(service.stop(0.2), 10)


async def test_a_stop_ends_calls_whose_handlers_ignore_their_cancellation(transport):
    released, entered = asyncio.Event(), asyncio.Event()

    async def stubborn(request: bytes, context) -> bytes:
        entered.set()
        while not released.is_set():
            try:
                await released.wait()
            except asyncio.CancelledError:
                continue  # ignores it, as a careless handler might
        return b"late"

    service, port = await serve_one(transport, "S", grpc.unary_unary_rpc_method_handler(stubborn))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.unary_unary(f"/{SERVICE}/S")(b"", timeout=60)
        await asyncio.wait_for(entered.wait(), 10)
        # bounded: without the stop's own bound it would wait for the handler (released only below)
        await asyncio.wait_for(service.stop(0.3), 0.3 + STOP_MARGIN_S + 10)
        with pytest.raises(grpc.aio.AioRpcError):
            await call
    released.set()


async def test_tls_without_a_certificate_is_refused_rather_than_served_in_the_clear(transport, tmp_path):
    certs = make_certs(tmp_path)
    service = GrpcService([SERVICE], server_factory=transport, tls=TLSConfig(ca_file=str(certs / "ca.pem")))
    with pytest.raises(ValueError, match="needs cert_file and key_file"):
        await service.start("127.0.0.1", 0)


@native_only("grpc.aio takes only bytes as a reply without a serializer; the native server takes any buffer")
async def test_a_stream_that_reuses_a_writable_buffer_sends_each_message_as_it_was(transport):
    chunk = bytearray(128 << 10)

    async def chunks(request: bytes, context):
        for letter in b"ABCDEF":
            chunk[:] = bytes([letter]) * len(chunk)
            yield chunk  # the same buffer, rewritten: each write must carry what it held then

    service, port = await serve_one(transport, "C", grpc.unary_stream_rpc_method_handler(chunks))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        got = [m[:1] async for m in ch.unary_stream(f"/{SERVICE}/C")(b"", timeout=10)]
    assert got == [b"A", b"B", b"C", b"D", b"E", b"F"]
    await service.stop(0.1)
