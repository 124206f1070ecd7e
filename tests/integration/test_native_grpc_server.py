"""mcp_native.grpc_server: the router's grpc++ front door answers like grpc.aio, call by call.

Each test runs the real server (``GrpcService`` with ``NativeServer``, as the router makes it) on a free
port and calls it with grpc's own clients: replies, statuses, metadata both ways, deadlines and
cancellation reaching the handler, the call limit, size limits, streams both ways with back-pressure,
replies sent from Python's memory (and let go of), TLS with the caller's certificate name, and a
graceful stop that lets a call in flight finish. The router's own tests (KServe, REST, security,
tracing) run through this server too: it is the router's default.
"""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import struct
from pathlib import Path

import grpc
import grpc.aio
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from harness import RouterProcess, small_mesh, wait_for

from mcp_native.grpc_server import MAX_WRITES_QUEUED, STOP_MARGIN_S, NativeServer
from mcpapi.kserve import grpc_service_pb2 as kserve_pb
from mcpapi.kserve import grpc_service_pb2_grpc as kserve_grpc
from mcpcore.serving import GrpcService, Parts
from mcpcore.tls import TLSConfig, peer_names

ROOT = Path(__file__).resolve().parents[2]
SERVICE = "t.Native"


class Behaviour:
    """The test service: bytes in, bytes out (no codecs), with probes into what the handler saw."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.seen_metadata: tuple = ()
        self.seen_remaining: float | None = None
        self.seen_names: set[str] = set()
        self.big = bytearray(b"\x07" * (1 << 20))

    async def echo(self, request: bytes, context) -> bytes:
        self.seen_metadata = context.invocation_metadata()
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
        "Big": grpc.unary_unary_rpc_method_handler(b.big_reply),
        "Who": grpc.unary_unary_rpc_method_handler(b.who),
        "Count": grpc.unary_stream_rpc_method_handler(b.count),
        "Total": grpc.stream_unary_rpc_method_handler(b.total),
        "Chat": grpc.stream_stream_rpc_method_handler(b.chat),
    }


async def serve(
    b: Behaviour, *, tls: TLSConfig | None = None, max_calls: int | None = None, max_receive: int = 1 << 20
) -> tuple[GrpcService, int]:
    service = GrpcService(
        [SERVICE],
        server_factory=NativeServer,
        maximum_concurrent_rpcs=max_calls,
        tls=tls,
        options=[("grpc.max_receive_message_length", max_receive), ("grpc.max_send_message_length", 8 << 20)],
    )
    assert isinstance(service.server, NativeServer)
    service.server.add_registered_method_handlers(SERVICE, handlers(b))
    port = await service.start("127.0.0.1", 0)
    await service.set_serving()
    return service, port


def method(channel: grpc.aio.Channel, name: str, kind: str = "unary_unary"):
    return getattr(channel, kind)(f"/{SERVICE}/{name}")


async def test_unary_reply_metadata_both_ways_and_the_deadline_the_handler_sees():
    b = Behaviour()
    service, port = await serve(b)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = method(ch, "Echo")(b"hi", metadata=(("x-key", "v1"), ("x-blob-bin", b"\x01\x02")), timeout=30)
        assert await call == b"echo:hi"
        trailers = dict(await call.trailing_metadata())
        assert trailers["x-trailer"] == "t1" and trailers["x-bin"] == b"\x00\xff"
        assert await call.code() == grpc.StatusCode.OK
    seen = dict(b.seen_metadata)
    assert seen["x-key"] == "v1" and seen["x-blob-bin"] == b"\x01\x02"
    assert b.seen_remaining is not None and 25 < b.seen_remaining <= 30
    await service.stop(0.1)


async def test_statuses_aborts_errors_and_unknown_methods():
    b = Behaviour()
    service, port = await serve(b)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        for request, code, details in [
            (b"set", grpc.StatusCode.NOT_FOUND, "no such thing"),
            (b"abort", grpc.StatusCode.FAILED_PRECONDITION, "aborted on purpose"),
            (b"raise", grpc.StatusCode.UNKNOWN, "Unexpected RuntimeError: the handler broke"),
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
async def test_a_call_that_ends_early_cancels_its_handler(how):
    b = Behaviour()
    service, port = await serve(b)
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
        assert service.server.stats()["active"] <= 1  # the cancelled call ends; nothing else is open
        assert await method(ch, "Echo")(b"x", timeout=10) == b"echo:x"
    await service.stop(0.1)


async def test_calls_over_the_limit_are_refused_and_the_others_finish():
    b = Behaviour()
    service, port = await serve(b, max_calls=2)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        first = method(ch, "Wait")(b"", timeout=30)
        await asyncio.wait_for(b.entered.wait(), 10)
        b.entered.clear()
        second = method(ch, "Wait")(b"", timeout=30)
        await asyncio.wait_for(b.entered.wait(), 10)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await method(ch, "Echo")(b"third", timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert service.server.stats()["refused"] == 1
        b.release.set()
        assert [await first, await second] == [b"released", b"released"]
        assert await method(ch, "Echo")(b"now", timeout=10) == b"echo:now"
    await service.stop(0.1)


async def test_a_request_over_the_size_limit_is_refused_before_the_handler():
    b = Behaviour()
    service, port = await serve(b, max_receive=64 << 10)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await method(ch, "Echo")(b"x" * (65 << 10), timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert b.seen_metadata == ()  # the handler never ran
        assert await method(ch, "Echo")(b"small", timeout=10) == b"echo:small"
    await service.stop(0.1)


async def test_streams_both_ways_in_order_with_back_pressure():
    b = Behaviour()
    service, port = await serve(b)
    n = MAX_WRITES_QUEUED * 40  # many more than the writes the server lets queue
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


async def test_health_watch_follows_serving_then_not_serving():
    b = Behaviour()
    service, port = await serve(b)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        watch = health_pb2_grpc.HealthStub(ch).Watch(
            health_pb2.HealthCheckRequest(service=SERVICE), timeout=30
        )
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        await service.set_not_serving()
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()
    await service.stop(0.1)


async def test_a_large_reply_is_sent_from_python_memory_and_let_go_of():
    b = Behaviour()
    service, port = await serve(b)
    async with grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", 8 << 20)]
    ) as ch:
        for _ in range(3):
            reply = await method(ch, "Big")(b"", timeout=30)
            assert reply == b"head:" + bytes(b.big) + b":tail"

    # the server held a buffer export of b.big while grpc sent it; once let go, the bytearray resizes
    def resizes() -> bool:
        try:
            b.big.append(0)
        except BufferError:
            return False
        return True

    await _until(resizes, "the server to let go of the reply buffer")
    assert len(b.big) == (1 << 20) + 1
    await service.stop(0.1)


def _certs(tmp_path: Path) -> Path:
    spec = importlib.util.spec_from_file_location("make_certs", ROOT / "tools" / "make_certs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_certs(tmp_path / "certs", workers=[])


async def test_mutual_tls_gives_the_handler_the_callers_certificate_name(tmp_path):
    certs = _certs(tmp_path)
    server_tls = TLSConfig(
        str(certs / "ca.pem"), str(certs / "mcp-router.pem"), str(certs / "mcp-router.key")
    )
    b = Behaviour()
    service, port = await serve(b, tls=server_tls)
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


async def test_a_graceful_stop_lets_the_call_in_flight_finish_and_refuses_new_ones():
    b = Behaviour()
    service, port = await serve(b)
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


async def test_a_stop_past_its_grace_cancels_the_handlers_and_returns():
    b = Behaviour()
    service, port = await serve(b)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        in_flight = method(ch, "Wait")(b"", timeout=30)
        await asyncio.wait_for(b.entered.wait(), 10)
        await asyncio.wait_for(service.stop(0.2), 15)
        assert b.cancelled.is_set()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await in_flight
        assert info.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)


def test_a_port_in_use_is_a_clear_error():
    async def main() -> None:
        b = Behaviour()
        service, port = await serve(b)
        other = GrpcService([SERVICE], server_factory=NativeServer)
        with pytest.raises(OSError, match="Failed to bind"):
            await other.start("127.0.0.1", port)
        await service.stop(0.1)

    asyncio.run(main())


def test_numpy_outputs_as_parts_arrive_whole():
    """What the router's ModelInfer replies with: a header and array views, joined on the wire."""

    async def main() -> None:
        b = Behaviour()
        array = np.arange(1 << 18, dtype=np.float32)

        async def arrays(request: bytes, context) -> Parts:
            return Parts([b"x", memoryview(array).cast("B"), b"y" * 10, memoryview(array[:3]).cast("B")])

        service = GrpcService([SERVICE], server_factory=NativeServer)
        service.server.add_registered_method_handlers(
            SERVICE, {"Arrays": grpc.unary_unary_rpc_method_handler(arrays)}
        )
        port = await service.start("127.0.0.1", 0)
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", 8 << 20)]
        ) as ch:
            got = await ch.unary_unary(f"/{SERVICE}/Arrays")(b"", timeout=10)
        assert got == b"x" + array.tobytes() + b"y" * 10 + array[:3].tobytes()
        await service.stop(0.1)
        del b

    asyncio.run(main())


async def test_a_method_registered_only_as_a_generic_handler_reads_its_one_request():
    """grpc.aio servers also take generic handlers; the transport learns of unary methods only by name,
    so such a method's request is read as a stream's first message."""
    b = Behaviour()
    service = GrpcService([SERVICE], server_factory=NativeServer)
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


# --- hostile callers and broken handlers: each call still ends, and the server goes on --------------


def _h2_frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _h2_call(path: bytes, stream: int, headers: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    """One gRPC call in raw HTTP/2 (HPACK literals without indexing), request sent whole."""
    fields = ((b":method", b"POST"), (b":scheme", b"http"), (b":path", path), (b":authority", b"x"),
              (b"content-type", b"application/grpc"), (b"te", b"trailers"), *headers)  # fmt: skip
    block = b"".join(b"\x00" + bytes([len(k)]) + k + bytes([len(v)]) + v for k, v in fields)
    message = b"\x00" + struct.pack(">I", 2) + b"hi"
    return _h2_frame(1, 4, stream, block) + _h2_frame(0, 1, stream, message)


async def _until(condition, what: str, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_bytes_that_are_not_utf_8_in_a_path_or_a_header_end_their_calls_and_no_other():
    b = Behaviour()
    service, port = await serve(b)
    loop = asyncio.get_running_loop()
    sock = await loop.run_in_executor(None, socket.create_connection, ("127.0.0.1", port))
    try:
        hostile = (
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
            + _h2_frame(4, 0, 0, b"")
            + _h2_call(b"/t.Native/\xff\xfe", 1)  # a method that is not UTF-8
            + _h2_call(b"/t.Unknown/Echo", 3, ((b"x-\xffkey", b"v"),))  # a key that is not UTF-8
            + _h2_call(f"/{SERVICE}/Echo".encode(), 5, ((b"x-val", b"\xff\xfe"),))  # a value that is not
        )
        await loop.run_in_executor(None, sock.sendall, hostile)
        # every one of them is answered while the connection stays open (none is left holding a place)
        await _until(
            lambda: service.server.stats()["active"] == 0 and dict(b.seen_metadata).get("x-val") is not None,
            "the three calls to end",
        )
        assert dict(b.seen_metadata)["x-val"] == b"\xff\xfe"  # a value that is not UTF-8 comes as bytes
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            assert await method(ch, "Echo")(b"ok", timeout=10) == b"echo:ok"
    finally:
        sock.close()
    await asyncio.wait_for(service.stop(0.2), 10)


@pytest.mark.parametrize(
    ("trailers", "reply", "code", "details"),
    [
        ((("X-Upper", "v"),), b"r", grpc.StatusCode.INTERNAL, 'Invalid trailing metadata: key "X-Upper"'),
        (
            (("x-k", "caf\u00e9"),),
            b"r",
            grpc.StatusCode.INTERNAL,
            'the value of "x-k" is not printable ASCII',
        ),
        ((("x-k", "a\nb"),), b"r", grpc.StatusCode.INTERNAL, 'the value of "x-k" is not printable ASCII'),
        ((), "a str, not bytes", grpc.StatusCode.INTERNAL, "the answer could not be sent (TypeError"),
        ((["x-list", "fine"],), b"r", grpc.StatusCode.OK, ""),  # grpc.aio takes lists for pairs too
    ],
)
async def test_a_handlers_bad_answer_ends_its_call_internal_and_the_server_goes_on(
    trailers, reply, code, details
):
    async def bad(request: bytes, context):
        context.set_trailing_metadata(trailers)
        return reply

    service = GrpcService([SERVICE], server_factory=NativeServer)
    service.server.add_registered_method_handlers(SERVICE, {"Bad": grpc.unary_unary_rpc_method_handler(bad)})
    port = await service.start("127.0.0.1", 0)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.unary_unary(f"/{SERVICE}/Bad")(b"", timeout=10)
        if code == grpc.StatusCode.OK:
            assert await call == b"r"
            assert dict(await call.trailing_metadata())["x-list"] == "fine"
        else:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            assert info.value.code() == code and details in info.value.details()
        # the call ended on the server too (its end is counted just after the client saw the status)
        await _until(lambda: service.server.stats()["active"] == 0, "the call to end on the server")
    await asyncio.wait_for(service.stop(0.2), 10)


async def test_a_stop_ends_calls_whose_handlers_ignore_their_cancellation():
    released = asyncio.Event()

    async def stubborn(request: bytes, context) -> bytes:
        while not released.is_set():
            try:
                await released.wait()
            except asyncio.CancelledError:
                continue  # ignores it, as a careless handler might
        return b"late"

    service = GrpcService([SERVICE], server_factory=NativeServer)
    service.server.add_registered_method_handlers(
        SERVICE, {"S": grpc.unary_unary_rpc_method_handler(stubborn)}
    )
    port = await service.start("127.0.0.1", 0)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.unary_unary(f"/{SERVICE}/S")(b"", timeout=60)
        await _until(lambda: service.server.stats()["active"] == 1, "the call to start")
        # bounded: without the stop's own bound it would wait for the handler (released only below)
        await asyncio.wait_for(service.stop(0.3), 0.3 + STOP_MARGIN_S + 10)
        with pytest.raises(grpc.aio.AioRpcError):
            await call
    released.set()


async def test_tls_without_a_certificate_is_refused_rather_than_served_in_the_clear(tmp_path):
    certs = _certs(tmp_path)
    service = GrpcService(
        [SERVICE], server_factory=NativeServer, tls=TLSConfig(ca_file=str(certs / "ca.pem"))
    )
    with pytest.raises(ValueError, match="needs cert_file and key_file"):
        await service.start("127.0.0.1", 0)


async def test_a_stream_that_reuses_a_writable_buffer_sends_each_message_as_it_was():
    chunk = bytearray(128 << 10)

    async def chunks(request: bytes, context):
        for letter in b"ABCDEF":
            chunk[:] = bytes([letter]) * len(chunk)
            yield chunk  # the same buffer, rewritten: each write must carry what it held then

    service = GrpcService([SERVICE], server_factory=NativeServer)
    service.server.add_registered_method_handlers(
        SERVICE, {"C": grpc.unary_stream_rpc_method_handler(chunks)}
    )
    port = await service.start("127.0.0.1", 0)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        got = [m[:1] async for m in ch.unary_stream(f"/{SERVICE}/C")(b"", timeout=10)]
    assert got == [b"A", b"B", b"C", b"D", b"E", b"F"]
    await service.stop(0.1)
