"""WorkerClients against real grpc.aio servers: a scripted fake WorkerControl on 127.0.0.1:0 (statuses,
retries, deadlines, the requests sent), and one real worker subprocess for the happy path and a real error.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest
from harness import WorkerProcess, make_demo_repository

from mcp_scheduler.worker_client import WorkerClients
from mcpapi.v2 import model_pb2, worker_pb2, worker_pb2_grpc
from mcpcore import errors
from mcpcore.transport import grpc_status


class FakeWorker(worker_pb2_grpc.WorkerControlServicer):
    """Answers from a script: ``fail[method]`` is a list of statuses to abort with, one per call, before
    answering normally; ``delay_s`` holds every call that long first. ``requests`` keeps what came."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, object]] = []
        self.fail: dict[str, list[grpc.StatusCode]] = {}
        self.delay_s = 0.0

    def calls(self, method: str) -> int:
        return sum(1 for name, _ in self.requests if name == method)

    async def _answer(self, method: str, request, context, response):  # type: ignore[no-untyped-def]
        self.requests.append((method, request))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        script = self.fail.get(method)
        if script:
            code = script.pop(0)
            await context.abort(code, f"scripted {code.name}")
        return response

    def _replica(self, request, state):  # type: ignore[no-untyped-def]
        return model_pb2.ReplicaStatus(model=request.model, version=request.version, state=state)

    async def Load(self, request, context):  # type: ignore[no-untyped-def]
        reply = worker_pb2.LoadResponse(replica=self._replica(request, model_pb2.READY), memory_bytes=42)
        return await self._answer("Load", request, context, reply)

    async def Unload(self, request, context):  # type: ignore[no-untyped-def]
        reply = worker_pb2.UnloadResponse(replica=self._replica(request, model_pb2.IDLE))
        return await self._answer("Unload", request, context, reply)

    async def Pause(self, request, context):  # type: ignore[no-untyped-def]
        reply = worker_pb2.PauseResponse(replica=self._replica(request, model_pb2.PAUSED), queued=3)
        return await self._answer("Pause", request, context, reply)

    async def Resume(self, request, context):  # type: ignore[no-untyped-def]
        reply = worker_pb2.ResumeResponse(replica=self._replica(request, model_pb2.RUNNING))
        return await self._answer("Resume", request, context, reply)

    async def Stats(self, request, context):  # type: ignore[no-untyped-def]
        reply = worker_pb2.StatsResponse(worker_id="fake", memory_capacity_bytes=1 << 30)
        return await self._answer("Stats", request, context, reply)

    async def EmergencyStop(self, request, context):  # type: ignore[no-untyped-def]
        reply = worker_pb2.EmergencyStopResponse(checkpoint_path="/tmp/ckpt.json", in_flight=2)
        return await self._answer("EmergencyStop", request, context, reply)


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeWorker, str]]:
    servicer = FakeWorker()
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerControlServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield servicer, f"127.0.0.1:{port}"
    await server.stop(grace=None)


@pytest.fixture
async def clients() -> AsyncIterator[WorkerClients]:
    c = WorkerClients(timeout_s=5.0, retries=2, backoff_s=0.01)
    yield c
    await c.close()


async def test_every_call_reaches_the_worker_with_its_fields(fake, clients) -> None:
    servicer, addr = fake
    assert (await clients.load(addr, "m", "1")).memory_bytes == 42
    assert (await clients.unload(addr, "m", "1")).replica.state == model_pb2.IDLE
    assert (await clients.pause(addr, "m", "2")).queued == 3
    assert (await clients.resume(addr, "m", "2")).replica.state == model_pb2.RUNNING
    assert (await clients.stats(addr)).worker_id == "fake"
    assert (await clients.emergency_stop(addr, "sick GPU")).in_flight == 2
    sent = {name: request for name, request in servicer.requests}
    assert [name for name, _ in servicer.requests] == [
        "Load", "Unload", "Pause", "Resume", "Stats", "EmergencyStop",
    ]  # fmt: skip
    assert (sent["Pause"].model, sent["Pause"].version) == ("m", "2")
    assert sent["EmergencyStop"].reason == "sick GPU"
    assert len(clients._stubs) == 1  # one cached channel per address


async def test_load_sends_a_spec_only_with_what_was_given(fake, clients) -> None:
    servicer, addr = fake
    await clients.load(addr, "m", "1")
    await clients.load(addr, "m", "1", memory_bytes=1 << 20)
    await clients.load(addr, "m", "1", max_batch_size=8, max_queue_delay_us=500)
    await clients.load(addr, "m", "1", priority=3, latency_sensitivity=0.0)
    plain, memory, batching, qos = (r for _, r in servicer.requests)

    assert not plain.HasField("spec")
    assert memory.spec.placement.memory_bytes == 1 << 20
    assert not memory.spec.HasField("batching") and not memory.spec.HasField("qos")
    assert (memory.spec.model, list(memory.spec.versions)) == ("m", ["1"])
    assert (batching.spec.batching.max_batch_size, batching.spec.batching.max_queue_delay_us) == (8, 500)
    assert not batching.spec.HasField("placement") and batching.spec.priority == 0
    assert qos.spec.priority == 3 and qos.spec.HasField("qos")  # 0.0 is a value: throughput first
    assert qos.spec.qos.latency_sensitivity == 0.0 and not qos.spec.HasField("batching")


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (grpc.StatusCode.NOT_FOUND, errors.NotFound),
        (grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidArgument),
        (grpc.StatusCode.FAILED_PRECONDITION, errors.FailedPrecondition),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, errors.ResourceExhausted),
        (grpc.StatusCode.PERMISSION_DENIED, errors.PermissionDenied),
        (grpc.StatusCode.DATA_LOSS, errors.DataLoss),
        (grpc.StatusCode.ALREADY_EXISTS, errors.AlreadyExists),
        (grpc.StatusCode.INTERNAL, errors.Internal),
    ],
)
async def test_other_statuses_map_to_their_error_and_are_not_retried(fake, clients, code, error) -> None:
    servicer, addr = fake
    servicer.fail["Pause"] = [code]
    with pytest.raises(error) as caught:
        await clients.pause(addr, "m", "1")
    assert grpc_status.to_grpc(caught.value.code) == code
    assert f"worker {addr} Pause" in caught.value.message and f"scripted {code.name}" in caught.value.message
    assert servicer.calls("Pause") == 1


async def test_unknown_status_keeps_its_code(fake, clients) -> None:
    servicer, addr = fake
    servicer.fail["Stats"] = [grpc.StatusCode.UNIMPLEMENTED]
    with pytest.raises(errors.MCPError) as caught:
        await clients.stats(addr)
    assert caught.value.code == errors.Code.UNIMPLEMENTED and addr in caught.value.message
    assert servicer.calls("Stats") == 1


async def test_unavailable_is_retried_then_succeeds(fake, clients) -> None:
    servicer, addr = fake
    servicer.fail["Load"] = [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE]
    response = await clients.load(addr, "m", "1", max_batch_size=4)
    assert response.replica.state == model_pb2.READY
    assert servicer.calls("Load") == 3
    assert all(r.spec.batching.max_batch_size == 4 for _, r in servicer.requests)  # the same request


async def test_retries_are_bounded(fake, clients) -> None:
    servicer, addr = fake
    servicer.fail["Resume"] = [grpc.StatusCode.UNAVAILABLE] * 5
    with pytest.raises(errors.Unavailable) as caught:
        await clients.resume(addr, "m", "1")
    assert servicer.calls("Resume") == 3  # the first try and retries=2
    assert f"worker {addr} Resume (after 3 tries)" in caught.value.message


async def test_deadline_applies_to_every_try(fake) -> None:
    servicer, addr = fake
    servicer.delay_s = 5.0
    clients = WorkerClients(timeout_s=0.2, retries=1, backoff_s=0.01)
    try:
        start = time.monotonic()
        with pytest.raises(errors.DeadlineExceeded) as caught:
            await clients.stats(addr)
        took = time.monotonic() - start
    finally:
        await clients.close()
    assert servicer.calls("Stats") == 2  # DEADLINE_EXCEEDED is retried once
    assert 0.4 <= took < 2.0, took
    assert addr in caught.value.message


async def test_a_call_deadline_overrides_the_default(fake, clients) -> None:
    servicer, addr = fake
    servicer.delay_s = 5.0
    with pytest.raises(errors.DeadlineExceeded):
        await clients.emergency_stop(addr, "why", timeout_s=0.05)


async def test_unreachable_worker_is_unavailable_naming_it(clients) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(errors.Unavailable) as caught:
        await clients.stats(addr)
    assert f"worker {addr} Stats (after 3 tries)" in caught.value.message


async def test_close_and_drop_release_channels_and_calls_reopen_them(fake, clients) -> None:
    _, addr = fake
    await clients.stats(addr)
    await clients.drop(addr)
    assert clients._stubs == {}
    await clients.stats(addr)
    await clients.close()
    assert clients._stubs == {}
    assert (await clients.stats(addr)).worker_id == "fake"


async def test_bad_settings_and_addresses_are_refused(clients) -> None:
    with pytest.raises(errors.InvalidArgument):
        WorkerClients(timeout_s=0)
    with pytest.raises(errors.InvalidArgument):
        await clients.stats("")


# --- a real worker -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_worker(tmp_path_factory, etcd_endpoint):
    repo = make_demo_repository(tmp_path_factory.mktemp("repo") / "models")
    proc = WorkerProcess(
        tmp_path_factory.mktemp("worker"), etcd_endpoint, repo, prefix=f"/t{uuid.uuid4().hex[:8]}/mcp"
    ).start()
    yield proc
    proc.stop()


async def test_against_a_real_worker(real_worker, clients) -> None:
    addr = real_worker.endpoints["grpc"]
    loaded = await clients.load(addr, "demo-mlp", "1", max_batch_size=8)
    assert loaded.replica.state == model_pb2.READY and loaded.replica.worker_id == real_worker.worker_id
    assert [t.name for t in loaded.inputs] == ["INPUT0"]
    again = await clients.load(addr, "demo-mlp", "1")  # idempotent: already loaded
    assert again.replica.state == model_pb2.READY

    with pytest.raises(errors.FailedPrecondition) as caught:  # READY -> PAUSED is not legal
        await clients.pause(addr, "demo-mlp", "1")
    assert f"worker {addr} Pause" in caught.value.message

    assert (await clients.resume(addr, "demo-mlp", "1")).replica.state == model_pb2.RUNNING
    assert (await clients.pause(addr, "demo-mlp", "1")).replica.state == model_pb2.PAUSED
    stats = await clients.stats(addr)
    assert [(m.model, m.version, m.max_batch_size) for m in stats.models] == [("demo-mlp", "1", 8)]
    await clients.unload(addr, "demo-mlp", "1")
    assert list((await clients.stats(addr)).models) == []
    with pytest.raises(errors.NotFound):  # what a retried Unload whose first try got through sees
        await clients.unload(addr, "demo-mlp", "1")

    with pytest.raises(errors.NotFound) as missing:
        await clients.load(addr, "no-such-model", "1")
    assert f"worker {addr} Load" in missing.value.message
