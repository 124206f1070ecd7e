"""Same-host shared memory on the SDK's direct path (``mcpcore.transport.shm_lease``), against a real worker,
scheduler and router on a real etcd.

Both sides of the boundary: the SDK lends its memfd regions and reads the outputs the worker wrote there
(``stats.shared``); the worker maps them, counts the bytes (``mcp_worker_shared_memory_bytes_total``) and
refuses, not started, every region that is not the sender's own sealed memfd, or that arrives over TCP,
so the SDK sends frames instead; and it answers a hostile header with a clear error, then serves on.
"""

from __future__ import annotations

import asyncio
import fcntl
import gc
import os
import signal
import socket
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import zmq
from harness import etcd_get, metric, small_mesh, wait_for

from mcpapi.kserve import grpc_service_pb2 as kserve_pb
from mcpapi.kserve import grpc_service_pb2_grpc as kserve_grpc
from mcpapi.v2 import tensor_pb2
from mcpclient import AsyncMeshClient, DeadlineExceeded, MeshClient
from mcpcore import wire
from mcpcore.keys import Keyspace
from mcpcore.transport import shm_lease

pytestmark = pytest.mark.skipif(not shm_lease.AVAILABLE, reason="same-host shared memory is Linux-only")

MODEL = "relu-wide"
WIDE = 128 << 10  # floats per row: 512 KiB, over shm_lease.MIN_BYTES
FAILED_PRECONDITION, INVALID_ARGUMENT = 9, 3


def _x(seed: int, rows: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, WIDE), dtype=np.float32)


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository with one model whose tensors are wide enough for shared memory: ReLU."""
    root = tmp_path_factory.mktemp("wide") / "models"
    (root / MODEL / "1").mkdir(parents=True)
    (root / MODEL / "1" / "model.yaml").write_text(
        f"""backend: numpy
max_batch_size: 4
inputs:
- {{name: INPUT, dtype: FP32, shape: [-1, {WIDE}]}}
outputs:
- {{name: OUTPUT, dtype: FP32, shape: [-1, {WIDE}]}}
memory_bytes: {16 * WIDE * 4}
layers:
- {{op: relu}}
"""
    )
    return root


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory, etcd_endpoint: str, repo: Path) -> Iterator:
    with small_mesh(tmp_path_factory.mktemp("dshm"), etcd_endpoint, repo, MODEL, ["1"]) as m:
        yield m


def _client(mesh, **options: object) -> MeshClient:  # type: ignore[no-untyped-def]
    return MeshClient(mesh.router.endpoints["grpc"], scheduler=mesh.scheduler.endpoints["grpc"], **options)


def _shared_bytes(mesh, direction: str) -> float:  # type: ignore[no-untyped-def]
    return metric(mesh.worker.metrics_text(), "mcp_worker_shared_memory_bytes_total", direction=direction)


def _refused(mesh) -> float:  # type: ignore[no-untyped-def]
    return metric(mesh.worker.metrics_text(), "mcp_worker_shared_memory_refused_total")


def test_large_direct_requests_go_by_shared_memory_and_answer_as_the_router(mesh, etcd_endpoint: str) -> None:
    record = etcd_get(etcd_endpoint, Keyspace(mesh.router.prefix).worker(mesh.worker.worker_id))
    assert wire.FEATURE_SHM in record["zmq_features"]
    x = _x(1)
    before_in, before_out = _shared_bytes(mesh, "in"), _shared_bytes(mesh, "out")
    with _client(mesh) as client:
        direct = client.infer(MODEL, {"INPUT": x}, direct=True)
        routed = client.infer(MODEL, {"INPUT": x})
        assert (client.stats.direct, client.stats.shared, client.stats.fallbacks) == (1, 1, 0)
        assert set(direct) == set(routed)
        for name in routed:
            assert np.array_equal(direct[name], routed[name]), name
            assert not direct[name].flags.writeable  # a view of the region, as frames are read-only views
        assert np.array_equal(direct["OUTPUT"], _relu(x))
        out_bytes = sum(a.nbytes for a in direct.values())
    # the worker read both requests' inputs in place (the router lends its own region, as the SDK does)
    assert _shared_bytes(mesh, "in") - before_in == 2 * x.nbytes
    assert _shared_bytes(mesh, "out") - before_out == 2 * out_bytes  # and wrote every output into them


def test_outputs_stay_valid_while_held_and_a_free_region_is_reused(mesh) -> None:
    x1, x2 = _x(2), _x(3)
    with _client(mesh) as client:
        first = client.infer(MODEL, {"INPUT": x1}, direct=True)["OUTPUT"]
        kept = first.copy()
        second = client.infer(MODEL, {"INPUT": x2}, direct=True)["OUTPUT"]
        pool = client._client._direct.forwarder.lender.regions
        assert pool is not None and pool.created == 2  # the first region was still held by `first`
        assert np.array_equal(first, kept)  # not overwritten by the second request
        assert np.array_equal(second, _relu(x2))
        del first, second
        gc.collect()
        third = client.infer(MODEL, {"INPUT": x1}, direct=True)["OUTPUT"]
        assert np.array_equal(third, kept)
        assert pool.created == 2 and client.stats.shared == 3  # a free region went round again


def test_many_at_once_leave_and_come_back_coalesced(mesh) -> None:
    """Requests sent in one loop turn leave as one coalesced message, and the replies the worker's batches
    make come back coalesced: a tensor in shared memory has no frame either way."""
    xs = [_x(20 + i) for i in range(8)]
    coalesced = metric(mesh.worker.metrics_text(), "mcp_worker_coalesced_requests_total")

    async def run() -> tuple[list[dict[str, np.ndarray]], int]:
        async with AsyncMeshClient(
            mesh.router.endpoints["grpc"], scheduler=mesh.scheduler.endpoints["grpc"]
        ) as client:
            outs = []
            for _ in range(3):  # together, then staggered (single requests, coalesced replies)
                outs += await asyncio.gather(*(client.infer(MODEL, {"INPUT": x}, direct=True) for x in xs))
            for x in xs:
                await asyncio.sleep(0.001)
                outs.append(await client.infer(MODEL, {"INPUT": x}, direct=True))
            return outs, client.stats.shared

    outs, shared = asyncio.run(run())
    assert shared == len(outs) == 32
    for i, out in enumerate(outs):
        assert np.array_equal(out["OUTPUT"], _relu(xs[i % 8]))
    assert metric(mesh.worker.metrics_text(), "mcp_worker_coalesced_requests_total") > coalesced


def test_small_requests_and_a_client_that_turns_it_off_send_frames(mesh, monkeypatch) -> None:
    before = _shared_bytes(mesh, "in")
    x = _x(4)
    with _client(mesh) as client, monkeypatch.context() as patch:
        patch.setattr(shm_lease, "MIN_BYTES", x.nbytes + 1)
        client.infer(MODEL, {"INPUT": x}, direct=True)
        assert (client.stats.direct, client.stats.shared) == (1, 0)
    with _client(mesh, shared_memory=False) as client:
        client.infer(MODEL, {"INPUT": _x(5)}, direct=True)
        assert (client.stats.direct, client.stats.shared) == (1, 0)
    assert _shared_bytes(mesh, "in") == before


def test_no_region_to_be_had_sends_frames(mesh, monkeypatch) -> None:
    """Out of descriptors or memory for a region: the request goes as frames and is answered."""

    def no_memfd(*args: object) -> int:
        raise OSError(24, "Too many open files")

    before = _shared_bytes(mesh, "in")
    x = _x(40)
    with _client(mesh) as client, monkeypatch.context() as patch:
        patch.setattr(os, "memfd_create", no_memfd)
        assert np.array_equal(client.infer(MODEL, {"INPUT": x}, direct=True)["OUTPUT"], _relu(x))
        assert (client.stats.direct, client.stats.shared) == (1, 0)
    assert _shared_bytes(mesh, "in") == before


def test_a_region_the_worker_refuses_is_sent_again_as_frames(mesh, monkeypatch) -> None:
    """A region the worker will not map (here: not sealed against shrinking) is refused not started; the
    SDK sends the request again at once with frames, and that worker gets frames from then on."""
    monkeypatch.setattr(fcntl, "F_SEAL_SHRINK", 0)  # this process's regions only: the worker is another
    refused = _refused(mesh)
    x = _x(6)
    with _client(mesh) as client:
        for _ in range(2):
            out = client.infer(MODEL, {"INPUT": x}, direct=True)
            assert np.array_equal(out["OUTPUT"], _relu(x))
        assert (client.stats.direct, client.stats.shared, client.stats.fallbacks) == (2, 0, 0)
    assert _refused(mesh) - refused == 1  # asked once, then frames


# -- hostile senders: raw DEALERs with hand-made headers -------------------------------------------------


def _local(mesh, etcd_endpoint: str) -> str:  # type: ignore[no-untyped-def]
    doc = etcd_get(etcd_endpoint, Keyspace(mesh.router.prefix).worker(mesh.worker.worker_id))
    return wire.local_endpoint(mesh.worker.worker_id, doc["incarnation"], doc["zmq"], doc["curve_public_key"])


class _Sender:
    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.RCVTIMEO, 15000)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def ask(self, header: tensor_pb2.TensorHeader, frames: list = ()) -> tensor_pb2.TensorHeader:  # type: ignore[assignment]
        header.kind = tensor_pb2.KIND_REQUEST
        header.request_id = uuid.uuid4().hex
        header.model = MODEL
        self.sock.send_multipart([header.SerializeToString(), *frames])
        reply = wire.parse_header(self.sock.recv_multipart()[0])
        assert reply.request_id == header.request_id
        return reply

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


def _memfd(size: int, *, sealed: bool = True, seals: int = 0) -> int:
    fd = os.memfd_create("hostile", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if sealed:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | seals)
    return fd


def _request(fd: int, offset: int = 0, *, size: int | None = None) -> tensor_pb2.TensorHeader:
    nbytes = WIDE * 4
    header = tensor_pb2.TensorHeader(flags=wire.FLAG_SHARED_MEMORY)
    spec = header.tensors.add(name="INPUT", dtype=tensor_pb2.TYPE_FP32, shape=[1, WIDE], byte_size=nbytes)
    spec.shm.CopyFrom(tensor_pb2.SharedRegion(fd=fd, offset=offset, size=nbytes if size is None else size))
    return header


def test_hostile_regions_get_a_clear_error_and_the_worker_serves_on(
    mesh, etcd_endpoint: str, tmp_path
) -> None:
    good, unsealed = _memfd(1 << 20), _memfd(1 << 20, sealed=False)
    frozen = _memfd(1 << 20, seals=fcntl.F_SEAL_WRITE)  # cannot be mapped writable: refused, still answered
    plain = os.open(tmp_path / "file", os.O_RDWR | os.O_CREAT)
    os.ftruncate(plain, 1 << 20)
    with socket.socket() as s:  # a descriptor that is a socket, not a file
        sender = _Sender(_local(mesh, etcd_endpoint))
        try:
            cases = [
                (_request(plain), FAILED_PRECONDITION, "not a memfd"),
                (_request(unsealed), FAILED_PRECONDITION, "not sealed against shrinking"),
                (_request(frozen), FAILED_PRECONDITION, "cannot be mapped"),
                (_request(s.fileno()), FAILED_PRECONDITION, "not a memfd"),
                (_request(10_000), FAILED_PRECONDITION, "cannot be read"),
                (_request(good, offset=(1 << 20) - 64), INVALID_ARGUMENT, "outside the 1048576-byte region"),
                (_request(good, size=12), INVALID_ARGUMENT, f"its byte_size is {WIDE * 4}"),
            ]
            for header, code, words in cases:
                reply = sender.ask(header)
                assert reply.status_code == code and words in reply.status_message, reply
                retryable = reply.flags & wire.FLAG_RETRYABLE and reply.flags & wire.FLAG_SHARED_MEMORY
                assert bool(retryable) == (code == FAILED_PRECONDITION), reply  # refused: frames may follow
            header = _request(good)
            header.reply_region.CopyFrom(tensor_pb2.SharedRegion(fd=good, offset=1 << 30, size=64))
            reply = sender.ask(header)
            assert reply.status_code == INVALID_ARGUMENT and "outside" in reply.status_message
            # a good region: answered, the outputs written into the reply region it lent
            x = _x(7)
            os.pwrite(good, x.tobytes(), 0)
            header = _request(good)
            header.reply_region.CopyFrom(tensor_pb2.SharedRegion(fd=good, offset=x.nbytes, size=x.nbytes))
            reply = sender.ask(header)
            assert reply.status_code == 0, reply.status_message
            [out] = reply.tensors
            assert out.name == "OUTPUT" and out.shm.fd == good and out.shm.offset == x.nbytes
            written = np.frombuffer(os.pread(good, out.shm.size, out.shm.offset), np.float32)
            assert np.array_equal(written, _relu(x).ravel())
        finally:
            sender.close()
            for fd in (good, unsealed, frozen, plain):
                os.close(fd)


def test_shared_memory_over_tcp_is_refused_not_started(mesh) -> None:
    fd = _memfd(1 << 20)
    sender = _Sender(mesh.worker.endpoints["zmq"])  # the published TCP endpoint: no peer credentials
    try:
        reply = sender.ask(_request(fd))
        assert reply.status_code == FAILED_PRECONDITION and "local endpoint" in reply.status_message
        assert reply.flags & wire.FLAG_RETRYABLE and reply.flags & wire.FLAG_SHARED_MEMORY
    finally:
        sender.close()
        os.close(fd)


def test_the_sdk_lends_regions_only_on_the_same_host_endpoint(
    tmp_path, etcd_endpoint: str, repo: Path
) -> None:
    """A worker with ``--no-zmq-local`` offers no "shm" (its senders are on TCP), and the SDK sends frames."""
    assert _x(8).nbytes >= shm_lease.MIN_BYTES
    with small_mesh(tmp_path, etcd_endpoint, repo, MODEL, ["1"], worker_flags={"zmq_local": False}) as m:
        with _client(m) as client:
            assert wire.FEATURE_SHM not in client.route(MODEL).zmq_features
            client.infer(MODEL, {"INPUT": _x(8)}, direct=True)
            assert (client.stats.direct, client.stats.shared) == (1, 0)
        assert _shared_bytes(m, "in") == 0


def _through_router(mesh, x: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    """KServe ModelInfer at the router's gRPC front door (a Triton client's request)."""
    request = kserve_pb.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="INPUT", datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.tobytes())
    reply = kserve_grpc.GRPCInferenceServiceStub(mesh.router.channel()).ModelInfer(request, timeout=30)
    (out,) = reply.outputs
    return np.frombuffer(reply.raw_output_contents[0], np.float32).reshape(tuple(out.shape))


def test_the_router_lends_a_same_host_worker_its_memory_for_large_requests(mesh) -> None:
    """The router's forwarder lends regions as the SDK's does (one implementation: the SDK's tests of
    small requests and of refused regions drive it too): a large KServe request's tensors reach the worker
    in the router's memory, and its outputs come back there."""
    before_in, before_out = _shared_bytes(mesh, "in"), _shared_bytes(mesh, "out")
    x = _x(30)
    assert np.array_equal(_through_router(mesh, x), _relu(x))
    assert _shared_bytes(mesh, "in") - before_in == x.nbytes
    assert _shared_bytes(mesh, "out") - before_out == x.nbytes  # OUTPUT is as wide as INPUT


def test_concurrent_large_requests_through_the_router_each_get_their_own_answer(mesh) -> None:
    """Regions go round while others are lent and while grpc++ still sends replies from them: every
    answer is its own request's, round after round."""
    before = _shared_bytes(mesh, "in")
    xs = [_x(50 + i) for i in range(8)]
    with ThreadPoolExecutor(len(xs)) as pool:
        for _ in range(3):
            outs = list(pool.map(lambda x: _through_router(mesh, x), xs))
            for x, out in zip(xs, outs, strict=True):
                assert np.array_equal(out, _relu(x))
    assert _shared_bytes(mesh, "in") - before == 3 * sum(x.nbytes for x in xs)


def test_a_router_with_shared_memory_off_sends_frames(tmp_path, etcd_endpoint: str, repo: Path) -> None:
    with small_mesh(tmp_path, etcd_endpoint, repo, MODEL, ["1"], router_flags={"shared_memory": False}) as m:
        x = _x(32)
        assert np.array_equal(_through_router(m, x), _relu(x))
        assert _shared_bytes(m, "in") == 0 and _shared_bytes(m, "out") == 0


def test_an_abandoned_request_spoils_its_region(mesh) -> None:
    """A request given up before its answer never gives its region back, even once the late answer came:
    the worker may have written into it after the client stopped waiting."""
    with _client(mesh) as client:
        client.infer(MODEL, {"INPUT": _x(9)}, direct=True)
        pool = client._client._direct.forwarder.lender.regions
        gc.collect()
        assert pool is not None and pool.idle == 1  # its outputs are gone: the region is back
        os.kill(mesh.worker.proc.pid, signal.SIGSTOP)  # frozen: the next request times out, abandoned
        try:
            with pytest.raises(DeadlineExceeded):
                client.infer(MODEL, {"INPUT": _x(10)}, direct=True, timeout=0.3)
        finally:
            os.kill(mesh.worker.proc.pid, signal.SIGCONT)
        wait_for(lambda: client.in_flight == 0, what="the late answer to the abandoned request")
        gc.collect()
        assert pool.idle == 0 and pool.created == 1  # spoiled: closed, not back in the pool
        client.infer(MODEL, {"INPUT": _x(11)}, direct=True)
        assert pool.created == 2  # a fresh region for the next one
