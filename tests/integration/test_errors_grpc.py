"""Each MCPError reaches a real gRPC client as its status, through both the sync and the aio server."""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent import futures

import grpc
import grpc.aio
import pytest

from mcpcore import errors

SERVICE = "mcptest.Errors"
ALL_ERRORS = sorted(errors.CODE_TO_ERROR.values(), key=lambda c: c.__name__)


def _raise_named(request: bytes) -> bytes:
    name = request.decode()
    if name == "ok":
        return b"fine"
    if name == "boom":
        raise RuntimeError("secret internal detail")
    raise getattr(errors, name)(f"{name} happened: do X")


def _sync_handlers() -> grpc.GenericRpcHandler:
    def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
        return _raise_named(request)

    def stream(request: bytes, context: grpc.ServicerContext):
        yield b"first"
        _raise_named(request)
        yield b"never"

    def aborts(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(grpc.StatusCode.OUT_OF_RANGE, "handler aborted itself")

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
            "Aborts": grpc.unary_unary_rpc_method_handler(aborts),
        },
    )


def _aio_handlers() -> grpc.GenericRpcHandler:
    async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await asyncio.sleep(0)
        return _raise_named(request)

    async def stream(request: bytes, context: grpc.aio.ServicerContext):
        yield b"first"
        _raise_named(request)
        yield b"never"

    async def aborts(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await context.abort(grpc.StatusCode.OUT_OF_RANGE, "handler aborted itself")

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
            "Aborts": grpc.unary_unary_rpc_method_handler(aborts),
        },
    )


@pytest.fixture(scope="module", params=["sync", "aio"])
def server_address(request):
    if request.param == "sync":
        server = grpc.server(futures.ThreadPoolExecutor(4), interceptors=[errors.server_interceptor()])
        server.add_generic_rpc_handlers((_sync_handlers(),))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        yield f"127.0.0.1:{port}"
        server.stop(None)
        return
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server(interceptors=[errors.aio_server_interceptor()])
        server.add_generic_rpc_handlers((_aio_handlers(),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = asyncio.run_coroutine_threadsafe(start(), loop).result(5)
    yield f"127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


@pytest.fixture(scope="module")
def channel(server_address):
    with grpc.insecure_channel(server_address) as ch:
        grpc.channel_ready_future(ch).result(timeout=5)
        yield ch


def _call(channel: grpc.Channel, method: str, payload: str):
    return channel.unary_unary(f"/{SERVICE}/{method}")(payload.encode(), timeout=5)


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_each_error_maps_to_its_status(channel, cls):
    with pytest.raises(grpc.RpcError) as info:
        _call(channel, "Unary", cls.__name__)
    assert info.value.code() == cls.code
    assert info.value.details() == f"{cls.__name__} happened: do X"
    back = errors.from_rpc_error(info.value)
    assert type(back) is cls
    assert back.message == f"{cls.__name__} happened: do X"


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_each_error_maps_on_a_stream(channel, cls):
    call = channel.unary_stream(f"/{SERVICE}/Stream")(cls.__name__.encode(), timeout=5)
    with pytest.raises(grpc.RpcError) as info:
        assert list(call) == [b"first"]
    assert info.value.code() == cls.code


def test_unexpected_error_is_internal_and_hides_details(channel, caplog):
    with caplog.at_level(logging.ERROR, logger="mcpcore.errors"), pytest.raises(grpc.RpcError) as info:
        _call(channel, "Unary", "boom")
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert "secret" not in info.value.details()
    assert info.value.details() == errors.GENERIC_INTERNAL


def test_success_passes_through(channel):
    assert _call(channel, "Unary", "ok") == b"fine"


def test_handler_abort_is_kept(channel):
    with pytest.raises(grpc.RpcError) as info:
        _call(channel, "Aborts", "x")
    assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert info.value.details() == "handler aborted itself"
