"""The gRPC conformance suite: the router's grpc++ front door (``mcp_native.grpc_server``) answers as
grpc.aio does, call by call, so every test here runs on both transports with the same assertions.

Each test runs the real server (``GrpcService`` with the transport's ``RpcServer``, as the services make
it) on a free port and calls it with grpc's own clients: replies, statuses, metadata both ways, deadlines
and cancellation reaching the handler, the call limit, size limits, streams both ways with
back-pressure, large replies (sent from Python's memory on the native side, and let go of), TLS with the
caller's certificate name, graceful and forced stops. Hostile callers and broken handlers:
``test_native_grpc_hostile.py``. The router's own tests (KServe, REST, security, tracing) run through the
native server too: it is the router's default.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import grpc.aio
import numpy as np
import pytest
from grpc_conformance import (
    SERVICE,
    Behaviour,
    answers_again,
    make_certs,
    method,
    serve,
    serve_one,
    until,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc
from harness import RouterProcess, small_mesh, wait_for

from mcp_native.grpc_server import MAX_WRITES_QUEUED, NativeServer
from mcpapi.kserve import grpc_service_pb2 as kserve_pb
from mcpapi.kserve import grpc_service_pb2_grpc as kserve_grpc
from mcpcore.call_context import CallContext, RpcServer
from mcpcore.serving import GrpcService, Parts, join_parts
from mcpcore.tls import TLSConfig
from mcpcore.transport.aio_server import AioServer


def test_both_servers_are_rpc_servers():
    assert issubclass(AioServer, RpcServer) and issubclass(NativeServer, RpcServer)


async def test_unary_reply_metadata_both_ways_and_the_deadline_the_handler_sees(transport):
    b = Behaviour()
    service, port = await serve(b, transport)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = method(ch, "Echo")(b"hi", metadata=(("x-key", "v1"), ("x-blob-bin", b"\x01\x02")), timeout=30)
        assert await call == b"echo:hi"
        trailers = dict(await call.trailing_metadata())
        assert trailers["x-trailer"] == "t1" and trailers["x-bin"] == b"\x00\xff"
        assert await call.code() == grpc.StatusCode.OK
    seen = dict(b.seen_metadata)
    assert seen["x-key"] == "v1" and seen["x-blob-bin"] == b"\x01\x02"
    # The client's 30 s deadline reaches the handler. grpc.aio's time_remaining() sets its core's deadline
    # against the wall clock and was seen reading 30.1 s on a loaded machine: the check is that the deadline
    # arrived (about 30 s, not none and not the default), not how exact the clocks are.
    assert b.seen_remaining is not None and 25 < b.seen_remaining <= 31
    # the handler's context is a CallContext (grpc.aio's as it is): the only surface handlers may use
    assert isinstance(b.contexts[0], CallContext)
    await service.stop(0.1)


async def test_statuses_aborts_errors_and_unknown_methods(transport):
    b = Behaviour()
    service, port = await serve(b, transport)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        for request, code, details in [
            (b"set", grpc.StatusCode.NOT_FOUND, "no such thing"),
            (b"abort", grpc.StatusCode.FAILED_PRECONDITION, "aborted on purpose"),
            (b"raise", grpc.StatusCode.UNKNOWN, "Unexpected <class 'RuntimeError'>: the handler broke"),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await method(ch, "Status")(request, timeout=10)
            assert (info.value.code(), info.value.details()) == (code, details)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await ch.unary_unary(f"/{SERVICE}/Nope")(b"", timeout=10)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert await method(ch, "Echo")(b"after", timeout=10) == b"echo:after"  # still serving
    await service.stop(0.1)


@pytest.mark.parametrize("how", ["deadline", "client cancel"])
async def test_a_call_that_ends_early_cancels_its_handler(transport, how):
    b = Behaviour()
    service, port = await serve(b, transport, max_calls=1)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        if how == "deadline":
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await method(ch, "Wait")(b"", timeout=0.3)
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        else:
            call = method(ch, "Wait")(b"", timeout=30)
            await asyncio.wait_for(b.entered.wait(), 10)
            call.cancel()
        await asyncio.wait_for(b.cancelled.wait(), 10)
        await answers_again(ch)  # the cancelled call let go of the server's one place
    await service.stop(0.1)


async def test_calls_over_the_limit_are_refused_and_the_others_finish(transport):
    b = Behaviour()
    service, port = await serve(b, transport, max_calls=2)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        first = method(ch, "Wait")(b"", timeout=30)
        await asyncio.wait_for(b.entered.wait(), 10)
        b.entered.clear()
        second = method(ch, "Wait")(b"", timeout=30)
        await asyncio.wait_for(b.entered.wait(), 10)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await method(ch, "Echo")(b"third", timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert b.seen_metadata == ()  # refused before its handler
        b.release.set()
        assert [await first, await second] == [b"released", b"released"]
        await answers_again(ch)
    await service.stop(0.1)


async def test_a_request_over_the_size_limit_is_refused_before_the_handler(transport):
    b = Behaviour()
    service, port = await serve(b, transport, max_receive=64 << 10)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await method(ch, "Echo")(b"x" * (65 << 10), timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert b.seen_metadata == ()  # the handler never ran
        assert await method(ch, "Echo")(b"small", timeout=10) == b"echo:small"
    await service.stop(0.1)


async def test_streams_both_ways_in_order_with_back_pressure(transport):
    b = Behaviour()
    service, port = await serve(b, transport)
    n = MAX_WRITES_QUEUED * 40  # many more than the writes the native server lets queue
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        got = [int(m) async for m in method(ch, "Count", "unary_stream")(str(n).encode(), timeout=30)]
        assert got == list(range(n))
        total = method(ch, "Total", "stream_unary")
        assert await total(iter([b"1", b"2", b"39"]), timeout=30) == b"42"
        chat = method(ch, "Chat", "stream_stream")(timeout=30)
        for word in (b"a", b"b", b"c"):
            await chat.write(word)
            assert await chat.read() == b"re:" + word
        await chat.done_writing()
        assert await chat.read() is grpc.aio.EOF
        assert await chat.code() == grpc.StatusCode.OK
    await service.stop(0.1)


async def test_health_watch_follows_serving_then_not_serving(transport):
    b = Behaviour()
    service, port = await serve(b, transport)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        watch = health_pb2_grpc.HealthStub(ch).Watch(
            health_pb2.HealthCheckRequest(service=SERVICE), timeout=30
        )
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        await service.set_not_serving()
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()
    await service.stop(0.1)


async def test_a_large_reply_arrives_whole_and_its_buffer_is_let_go_of(transport):
    """The native server sends it from Python's memory (a buffer export held while grpc sends it)."""
    b = Behaviour()
    service, port = await serve(b, transport)
    async with grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", 8 << 20)]
    ) as ch:
        for _ in range(3):
            reply = await method(ch, "Big")(b"", timeout=30)
            assert reply == b"head:" + bytes(b.big) + b":tail"

    # while a buffer export of b.big is held the bytearray cannot resize; once let go, it can
    def resizes() -> bool:
        try:
            b.big.append(0)
        except BufferError:
            return False
        return True

    await until(resizes, "the server to let go of the reply buffer")
    assert len(b.big) == (1 << 20) + 1
    await service.stop(0.1)


async def test_mutual_tls_gives_the_handler_the_callers_certificate_name(transport, tmp_path):
    certs = make_certs(tmp_path)
    server_tls = TLSConfig(
        str(certs / "ca.pem"), str(certs / "mcp-router.pem"), str(certs / "mcp-router.key")
    )
    b = Behaviour()
    service, port = await serve(b, transport, tls=server_tls)
    client = TLSConfig(str(certs / "ca.pem"), str(certs / "admin.pem"), str(certs / "admin.key"))
    options = [("grpc.ssl_target_name_override", "localhost")]
    async with grpc.aio.secure_channel(f"localhost:{port}", client.channel_credentials(), options) as ch:
        assert await method(ch, "Who")(b"", timeout=10) == b"admin"
    anonymous = TLSConfig(ca_file=str(certs / "ca.pem")).channel_credentials()
    async with grpc.aio.secure_channel(f"localhost:{port}", anonymous, options) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as info:  # no client certificate: no TLS session
            await method(ch, "Who")(b"", timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    async with grpc.aio.insecure_channel(f"localhost:{port}") as ch:
        with pytest.raises(grpc.aio.AioRpcError):
            await method(ch, "Echo")(b"", timeout=5)
    await service.stop(0.1)


async def test_a_graceful_stop_lets_the_call_in_flight_finish_and_refuses_new_ones(transport):
    b = Behaviour()
    service, port = await serve(b, transport)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        in_flight = method(ch, "Wait")(b"", timeout=30)
        await asyncio.wait_for(b.entered.wait(), 10)
        stopping = asyncio.ensure_future(service.stop(10.0))
        await asyncio.sleep(0)
        asyncio.get_running_loop().call_later(0.2, b.release.set)
        assert await in_flight == b"released"
        await asyncio.wait_for(stopping, 15)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await method(ch, "Echo")(b"late", timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_stop_past_its_grace_cancels_the_handlers_and_returns(transport):
    b = Behaviour()
    service, port = await serve(b, transport)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        in_flight = method(ch, "Wait")(b"", timeout=30)
        await asyncio.wait_for(b.entered.wait(), 10)
        await asyncio.wait_for(service.stop(0.2), 15)
        assert b.cancelled.is_set()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await in_flight
        assert info.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)


async def test_a_port_in_use_is_a_clear_error(transport):
    b = Behaviour()
    service, port = await serve(b, transport)
    other = GrpcService([SERVICE], server_factory=transport, options=[("grpc.so_reuseport", 0)])
    with pytest.raises(OSError, match=f"Failed to bind gRPC port 127.0.0.1:{port}"):
        await other.start("127.0.0.1", port)
    await service.stop(0.1)


async def test_numpy_outputs_as_parts_arrive_whole(transport):
    """What the router's ModelInfer replies with: a header and array views, joined on the wire."""
    array = np.arange(1 << 18, dtype=np.float32)

    async def arrays(request: bytes, context) -> Parts:
        return Parts([b"x", memoryview(array).cast("B"), b"y" * 10, memoryview(array[:3]).cast("B")])

    handler = grpc.unary_unary_rpc_method_handler(arrays, response_serializer=join_parts)
    service, port = await serve_one(transport, "Arrays", handler)
    async with grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", 8 << 20)]
    ) as ch:
        got = await ch.unary_unary(f"/{SERVICE}/Arrays")(b"", timeout=10)
    assert got == b"x" + array.tobytes() + b"y" * 10 + array[:3].tobytes()
    await service.stop(0.1)


async def test_a_method_registered_only_as_a_generic_handler_reads_its_one_request(transport):
    """Servers also take generic handlers; the native transport learns of unary methods only by name, so
    such a method's request is read as a stream's first message."""
    b = Behaviour()
    service = GrpcService([SERVICE], server_factory=transport)
    generic = grpc.method_handlers_generic_handler(
        "t.Generic", {"Echo": grpc.unary_unary_rpc_method_handler(b.echo)}
    )
    service.server.add_generic_rpc_handlers((generic,))
    port = await service.start("127.0.0.1", 0)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        assert await ch.unary_unary("/t.Generic/Echo")(b"g", timeout=10) == b"echo:g"
    await service.stop(0.1)


def test_a_router_answers_the_same_on_either_server(tmp_path, etcd_endpoint, repo):
    """One mesh, two routers: grpc_server native (the default) and aio. Same outputs, same refusals."""
    x = np.random.default_rng(5).random((2, 64), dtype=np.float32)
    request = kserve_pb.ModelInferRequest(model_name="demo-mlp", id="same")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=x.shape)
    request.raw_input_contents.append(x.tobytes())
    bad = kserve_pb.ModelInferRequest(model_name="demo-mlp")
    bad.inputs.add(name="NOPE", datatype="FP32", shape=[1, 64])
    bad.raw_input_contents.append(x[:1].tobytes())
    with small_mesh(tmp_path, etcd_endpoint, repo, "demo-mlp", ["1"]) as mesh:
        aio = RouterProcess(
            tmp_path, etcd_endpoint, prefix=mesh.router.prefix, scheduler="", grpc_server="aio"
        )
        aio.start()
        try:
            answers = []
            for router in (mesh.router, aio):
                stub = kserve_grpc.GRPCInferenceServiceStub(router.channel())
                ready = kserve_pb.ModelReadyRequest(name="demo-mlp", version="1")
                wait_for(lambda s=stub, r=ready: s.ModelReady(r, timeout=5).ready, what="demo-mlp routed")
                reply = stub.ModelInfer(request, timeout=30)
                with pytest.raises(grpc.RpcError) as info:
                    stub.ModelInfer(bad, timeout=30)
                answers.append(
                    (
                        reply.id,
                        list(reply.outputs),
                        list(reply.raw_output_contents),
                        info.value.code(),
                        info.value.details(),
                    )
                )
            assert answers[0] == answers[1]
            assert answers[0][3] == grpc.StatusCode.INVALID_ARGUMENT
            # each router runs the server it was asked for: only the native one loaded grpc++
            assert "_frontdoor" in _maps(mesh.router) and "_frontdoor" not in _maps(aio)
        finally:
            aio.stop()


def _maps(router: RouterProcess) -> str:
    assert router.proc is not None
    return Path(f"/proc/{router.proc.pid}/maps").read_text()
