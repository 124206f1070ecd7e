"""Each MCPError reaches a real gRPC client as its status, through a grpc.aio server whose handlers were
registered through ``GuardedServer`` (as every service's are, by ``GrpcService.add``), and comes back
through the client table (``grpc_status.from_rpc_error``) as the same class."""

from __future__ import annotations

import asyncio
import logging
import threading

import grpc
import grpc.aio
import pytest

from mcpcore import errors
from mcpcore.transport import grpc_status
from mcpcore.transport.guarded import GuardedServer

SERVICE = "mcptest.Errors"
ALL_ERRORS = sorted(errors.CODE_TO_ERROR.values(), key=lambda c: c.__name__)


def _raise_named(request: bytes) -> bytes:
    name = request.decode()
    if name == "ok":
        return b"fine"
    if name == "boom":
        raise RuntimeError("secret internal detail")
    if name == "NotStartedUnavailable":
        raise errors.not_started(errors.Unavailable("not started: send it elsewhere"))
    if name == "OutOfRange":  # a code with no class of its own (a worker's, passed on by the scheduler)
        raise errors.error_for_code(errors.Code.OUT_OF_RANGE, "past the end")
    raise getattr(errors, name)(f"{name} happened: do X")


def _aio_handlers() -> dict[str, grpc.RpcMethodHandler]:
    async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await asyncio.sleep(0)
        return _raise_named(request)

    async def stream(request: bytes, context: grpc.aio.ServicerContext):
        yield b"first"
        _raise_named(request)
        yield b"never"

    async def aborts(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await context.abort(grpc.StatusCode.OUT_OF_RANGE, "handler aborted itself")

    def sync_unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return _raise_named(request)

    return {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "SyncUnary": grpc.unary_unary_rpc_method_handler(sync_unary),
        "Stream": grpc.unary_stream_rpc_method_handler(stream),
        "Aborts": grpc.unary_unary_rpc_method_handler(aborts),
    }


@pytest.fixture(scope="module")
def server_address():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server()
        GuardedServer(server).add_registered_method_handlers(SERVICE, _aio_handlers())
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


@pytest.mark.parametrize("method", ["Unary", "SyncUnary"])
@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_each_error_maps_to_its_status(channel, cls, method):
    with pytest.raises(grpc.RpcError) as info:
        _call(channel, method, cls.__name__)
    assert info.value.code() == grpc_status.to_grpc(cls.code)
    assert info.value.details() == f"{cls.__name__} happened: do X"
    back = grpc_status.from_rpc_error(info.value)
    assert type(back) is cls
    assert back.message == f"{cls.__name__} happened: do X"


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_each_error_maps_on_a_stream(channel, cls):
    call = channel.unary_stream(f"/{SERVICE}/Stream")(cls.__name__.encode(), timeout=5)
    with pytest.raises(grpc.RpcError) as info:
        assert list(call) == [b"first"]
    assert info.value.code() == grpc_status.to_grpc(cls.code)


def test_unexpected_error_is_internal_and_hides_details(channel, caplog):
    with caplog.at_level(logging.ERROR, logger="mcpcore.errors"), pytest.raises(grpc.RpcError) as info:
        _call(channel, "Unary", "boom")
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert "secret" not in info.value.details()
    assert info.value.details() == errors.GENERIC_INTERNAL


def test_a_code_with_no_class_keeps_its_status(channel):
    with pytest.raises(grpc.RpcError) as info:
        _call(channel, "Unary", "OutOfRange")
    assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert info.value.details() == "past the end"
    assert grpc_status.from_rpc_error(info.value).code is errors.Code.OUT_OF_RANGE


def test_success_passes_through(channel):
    assert _call(channel, "Unary", "ok") == b"fine"


def test_handler_abort_is_kept(channel):
    with pytest.raises(grpc.RpcError) as info:
        _call(channel, "Aborts", "x")
    assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert info.value.details() == "handler aborted itself"


def test_a_not_started_error_says_so_in_trailing_metadata(channel):
    with pytest.raises(grpc.RpcError) as info:
        _call(channel, "Unary", "NotStartedUnavailable")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert grpc_status.NOT_STARTED_METADATA in tuple(info.value.trailing_metadata())
    assert grpc_status.from_rpc_error(info.value).not_started
    with pytest.raises(grpc.RpcError) as info:
        _call(channel, "Unary", "Unavailable")
    assert grpc_status.NOT_STARTED_METADATA not in tuple(info.value.trailing_metadata())
    assert not grpc_status.from_rpc_error(info.value).not_started


def test_methods_registered_only_as_generic_handlers_are_not_served():
    """The generated code registers each service twice; GuardedServer serves what it gets by name."""

    async def main() -> grpc.StatusCode:
        server = grpc.aio.server()
        generic = grpc.method_handlers_generic_handler(SERVICE, _aio_handlers())
        GuardedServer(server).add_generic_rpc_handlers((generic,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await ch.unary_unary(f"/{SERVICE}/Unary")(b"ok", timeout=5)
                return info.value.code()
        finally:
            await server.stop(None)

    assert asyncio.run(main()) == grpc.StatusCode.UNIMPLEMENTED
