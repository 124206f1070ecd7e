"""Same-host shared memory for tensors (``mcpcore.transport.shm_lease``) and its place in the wire format
(``wire.encode(place=...)``, ``wire.with_regions``): real memfds and mappings of this process, the
worker's checks with this process standing in as the sender."""

from __future__ import annotations

import fcntl
import gc
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from mcpapi.v2 import tensor_pb2
from mcpcore import wire
from mcpcore.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from mcpcore.transport import shm_lease

pytestmark = pytest.mark.skipif(not shm_lease.AVAILABLE, reason="same-host shared memory is Linux-only")
MiB = 1 << 20
ME = (os.getpid(), os.getuid())


def _header() -> tensor_pb2.TensorHeader:
    return tensor_pb2.TensorHeader(kind=tensor_pb2.KIND_REQUEST, request_id="r", model="m")


def _pool() -> shm_lease.RegionPool:
    return shm_lease.RegionPool(max_region_bytes=64 * MiB)


def _memfd(size: int, seals: int = fcntl.F_SEAL_SHRINK) -> int:
    fd = os.memfd_create("t", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


# -- wire ------------------------------------------------------------------------------------------------


def test_placed_tensors_get_no_frame_and_come_back_in_order():
    a, b, c = (
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.array([b"x", b"yz"], object),
        np.ones(4, np.int64),
    )
    lease = _pool().lease([a, c])
    header = _header()
    frames = wire.encode(header, {"A": a, "B": b, "C": c}, lease.place)
    assert len(frames) == 2  # the header and BYTES' frame: BYTES are never placed
    assert [spec.HasField("shm") for spec in header.tensors] == [True, False, True]
    assert header.tensors[2].shm.offset % shm_lease.ALIGN == 0
    received = wire.parse_header(frames[0])
    mapped = {}

    def view(region: tensor_pb2.SharedRegion, name: str) -> memoryview:
        mapped[name] = region.offset
        return memoryview(lease.region.bytes)[region.offset : region.offset + region.size]

    msg = wire.Message(received, wire.tensors_of(received, wire.with_regions(received, frames[1:], view)))
    assert list(mapped) == ["A", "C"] and not any(s.HasField("shm") for s in received.tensors)
    out = msg.named()
    assert np.array_equal(out["A"], a) and list(out["B"]) == [b"x", b"yz"] and np.array_equal(out["C"], c)


def test_frames_and_regions_must_add_up():
    lease = _pool().lease([np.ones(4, np.float32)])
    header = _header()
    frames = wire.encode(header, {"A": np.ones(4, np.float32)}, lease.place)
    received = wire.parse_header(frames[0])
    with pytest.raises(
        InvalidArgument, match=r"0 tensor frame\(s\) and 1 tensor\(s\) in shared memory, but 1"
    ):
        wire.with_regions(received, [b"extra"], lambda region, name: memoryview(b""))
    received.tensors[0].shm.size = 3
    with pytest.raises(InvalidArgument, match="holds 3 bytes but its byte_size is 16"):
        wire.with_regions(received, [], lambda region, name: memoryview(b""))
    many = _header()
    for i in range(wire.DEFAULT_LIMITS.max_tensors + 1):
        many.tensors.add(name=f"T{i}", dtype=tensor_pb2.TYPE_FP32, shape=[1], byte_size=4).shm.size = 4
    with pytest.raises(ResourceExhausted, match="over the limit"):
        wire.with_regions(many, [], lambda region, name: memoryview(bytes(4)))


def test_coalesced_messages_count_no_frame_for_a_tensor_in_shared_memory():
    pool = _pool()
    messages = []
    for i in range(3):
        lease = pool.lease([np.ones(4, np.float32)])
        header = _header()
        header.request_id = f"r{i}"
        big = lease.place if i != 1 else None  # the middle one sends frames
        messages.append(wire.encode(header, {"A": np.full(4, i, np.float32), "B": np.arange(2)}, big))
    [(count, message)] = wire.coalesce(messages)
    assert count == 3 and len(message) == 1 + 1 + 2 + 1  # frames: B, A and B, B
    envelope = wire.parse_header(message[0])
    parts = wire.uncoalesce(envelope, message[1:])
    assert [len(frames) for _, frames in parts] == [1, 2, 1]
    assert [bytes(frames[-1]) for _, frames in parts] == [np.arange(2).tobytes()] * 3


def test_a_receiver_that_lent_nothing_says_so_instead_of_miscounting():
    lease = _pool().lease([np.ones(4, np.float32)])
    header = _header()
    frames = wire.encode(header, {"A": np.ones(4, np.float32)}, lease.place)
    with pytest.raises(InvalidArgument, match="shared memory, which only the sender's own host"):
        wire.decode(frames)


# -- sender side ------------------------------------------------------------------------------------------


def test_outputs_are_read_only_views_that_keep_their_region_from_reuse():
    pool = _pool()
    x = np.arange(1024, dtype=np.float32)
    lease = pool.lease([x])
    assert lease.region.size >= 2 * x.nbytes and lease.reply_region().offset == lease.out_start
    written = lease.region.bytes[lease.out_start : lease.out_start + x.nbytes].view(np.float32)
    written[:] = x * 2
    region = tensor_pb2.SharedRegion(fd=lease.region.fd, offset=lease.out_start, size=x.nbytes)
    out = np.frombuffer(lease.view(region, "OUT"), np.float32)[10:20]  # a slice of a view still holds it
    assert not out.flags.writeable and np.array_equal(out, x[10:20] * 2)
    del lease, written
    gc.collect()
    assert pool.idle == 0  # lent while `out` lives
    again = pool.lease([x])
    assert pool.created == 2
    del out
    gc.collect()
    assert pool.idle == 1  # the first region is back
    del again
    gc.collect()
    assert pool.idle == 2
    assert pool.lease([x]) is not None and pool.created == 2  # reused, not made


def test_a_reply_naming_bytes_outside_the_lent_region_is_refused():
    lease = _pool().lease([np.ones(16, np.float32)])
    fd = lease.region.fd
    for region in (
        tensor_pb2.SharedRegion(fd=fd, offset=0, size=16),  # the inputs, not the reply region
        tensor_pb2.SharedRegion(fd=fd, offset=lease.out_start, size=lease.region.size),
        tensor_pb2.SharedRegion(fd=fd + 1, offset=lease.out_start, size=4),
    ):
        with pytest.raises(InvalidArgument, match="outside the reply region"):
            lease.view(region, "OUT")


def test_a_spoiled_region_is_closed_not_reused_and_idle_regions_are_bounded():
    pool = shm_lease.RegionPool(max_region_bytes=64 * MiB, max_idle_bytes=3 * MiB)
    lease = pool.lease([np.ones(4, np.float32)])
    fd = lease.region.fd
    lease.spoil()
    del lease
    gc.collect()
    assert pool.idle == 0 and pool.created == 1
    with pytest.raises(OSError):
        os.fstat(fd)  # closed
    leases = [pool.lease([np.ones(4, np.float32)]) for _ in range(3)]  # three 2 MiB regions
    del leases
    gc.collect()
    assert pool.idle == 1  # at most 3 MiB kept idle
    assert pool.lease([np.ones(80 * MiB // 4, np.float32)]) is None  # over the region limit: frames


def test_a_lease_finalized_inside_the_pool_does_not_deadlock_it():
    """A garbage collection can run a lease's finalizer in the middle of ``lease`` (same thread, lock
    held): it only queues the region, which the next lease takes."""
    pool = _pool()
    lease = pool.lease([np.ones(4, np.float32)])
    cycle: list = [lease]
    cycle.append(cycle)  # freed only by the cyclic collector
    del lease, cycle
    with pool._lock:  # as if inside lease(): the old code waited here for ever
        gc.collect()
    assert pool.idle == 1 and pool.lease([np.ones(4, np.float32)]) is not None and pool.created == 1


def test_a_region_cannot_shrink_under_its_reader():
    lease = _pool().lease([np.ones(4, np.float32)])
    with pytest.raises(OSError):
        os.ftruncate(lease.region.fd, 0)


# -- receiver side ----------------------------------------------------------------------------------------


def test_the_peer_comes_only_from_unix_socket_credentials():
    frame = lambda address: SimpleNamespace(get=lambda prop: address)  # noqa: E731
    assert shm_lease.peer_process(frame("localhost:1000:1000:4321")) == (4321, 1000)
    for address in ("127.0.0.1", "localhost:1000:1000:0", "localhost:a:b:c", "", "localhost:1:2"):
        assert shm_lease.peer_process(frame(address)) is None, address
    assert shm_lease.peer_process(object()) is None


def test_the_worker_maps_a_sealed_memfd_of_its_sender_and_checks_every_range():
    regions = shm_lease.PeerRegions(max_region_bytes=4 * MiB)
    fd = _memfd(MiB)
    try:
        os.pwrite(fd, b"hello", 100)
        view = regions.view(ME, tensor_pb2.SharedRegion(fd=fd, offset=100, size=5), "t", writable=False)
        assert bytes(view) == b"hello" and view.readonly
        out = regions.view(ME, tensor_pb2.SharedRegion(fd=fd, offset=0, size=5), "t", writable=True)
        out[:] = b"world"
        assert os.pread(fd, 5, 0) == b"world"  # written into the sender's memory
        with pytest.raises(InvalidArgument, match="outside the 1048576-byte region"):
            regions.view(ME, tensor_pb2.SharedRegion(fd=fd, offset=MiB - 2, size=5), "t", writable=False)
        assert len(regions) == 1  # one mapping, kept
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda tmp: _memfd(MiB, seals=0), "not sealed against shrinking"),
        (lambda tmp: os.open(tmp / "f", os.O_RDWR | os.O_CREAT), "not a memfd"),
        (lambda tmp: os.pipe()[0], "not a memfd"),
        (lambda tmp: socket.socket().detach(), "not a memfd"),  # never even opened
        (lambda tmp: _memfd(MiB, seals=fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_WRITE), "cannot be mapped"),
        (lambda tmp: _memfd(8 * MiB), "this worker maps 1 to 4194304"),
        (lambda tmp: _memfd(0), "this worker maps 1 to"),
    ],
    ids=["unsealed", "regular file", "pipe", "socket", "write-sealed", "too big", "empty"],
)
def test_anything_but_a_sealed_memfd_is_refused_not_started(tmp_path, make, words):
    regions = shm_lease.PeerRegions(max_region_bytes=4 * MiB)
    fd = make(tmp_path)
    try:
        with pytest.raises(FailedPrecondition, match=words) as caught:
            regions.view(ME, tensor_pb2.SharedRegion(fd=fd, offset=0, size=0), "t", writable=False)
        assert caught.value.not_started
    finally:
        os.close(fd)


def test_a_region_of_another_user_a_tcp_peer_and_a_closed_descriptor_are_refused():
    regions = shm_lease.PeerRegions(max_region_bytes=4 * MiB)
    fd = _memfd(MiB)
    region = tensor_pb2.SharedRegion(fd=fd, offset=0, size=4)
    try:
        with pytest.raises(FailedPrecondition, match="belongs to uid"):
            regions.view((os.getpid(), os.getuid() + 1), region, "t", writable=False)
        with pytest.raises(FailedPrecondition, match="local endpoint"):
            regions.view(None, region, "t", writable=False)
    finally:
        os.close(fd)
    with pytest.raises(FailedPrecondition, match="cannot be read"):
        regions.view(ME, region, "t", writable=False)


def test_a_reused_descriptor_number_is_a_new_file_and_old_mappings_go():
    regions = shm_lease.PeerRegions(max_region_bytes=4 * MiB, max_maps=2)
    fd = _memfd(MiB)
    os.pwrite(fd, b"old", 0)
    region = tensor_pb2.SharedRegion(fd=fd, offset=0, size=3)
    assert bytes(regions.view(ME, region, "t", writable=False)) == b"old"
    os.close(fd)
    again = _memfd(MiB)
    assert again == fd  # the lowest free number: the same one
    try:
        os.pwrite(again, b"new", 0)
        assert bytes(regions.view(ME, region, "t", writable=False)) == b"new"
        others = [_memfd(MiB) for _ in range(2)]
        for other in others:
            regions.view(ME, tensor_pb2.SharedRegion(fd=other, offset=0, size=1), "t", writable=False)
        assert len(regions) == 2  # the least recently used went
        for other in others:
            os.close(other)
    finally:
        os.close(again)


def _rss_shmem_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssShmem:"):
            return int(line.split()[1])
    raise AssertionError("no RssShmem in /proc/self/status")


def test_a_sparse_region_costs_the_worker_only_the_pages_it_uses():
    regions = shm_lease.PeerRegions(max_region_bytes=256 * MiB)
    fd = _memfd(200 * MiB)
    try:
        before = _rss_shmem_kib()
        view = regions.view(ME, tensor_pb2.SharedRegion(fd=fd, offset=100 * MiB, size=4), "t", writable=False)
        assert bytes(view) == bytes(4)
        assert _rss_shmem_kib() - before < 8 * 1024  # not 200 MiB of pre-faulted pages
    finally:
        os.close(fd)


def test_mappings_are_bounded_in_bytes_and_those_of_exited_senders_go():
    regions = shm_lease.PeerRegions(max_region_bytes=4 * MiB, max_bytes=2 * MiB)
    fds = [_memfd(MiB) for _ in range(3)]
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        for fd in fds[:2]:
            regions.view(ME, tensor_pb2.SharedRegion(fd=fd, offset=0, size=1), "t", writable=False)
        assert len(regions) == 2
        regions.view(ME, tensor_pb2.SharedRegion(fd=fds[2], offset=0, size=1), "t", writable=False)
        assert len(regions) == 2  # 2 MiB at most: the least recently used went
        theirs = int(child.stdout.readline())
        regions.view((child.pid, os.getuid()), tensor_pb2.SharedRegion(fd=theirs, offset=0, size=1), "t",
                     writable=False)  # fmt: skip
        child.stdin.close()
        child.wait(10)
        regions.view(ME, tensor_pb2.SharedRegion(fd=fds[0], offset=0, size=1), "t", writable=False)
        assert all(pid == os.getpid() for pid, *_ in regions._maps)  # the exited sender's mapping went
    finally:
        child.kill()
        for fd in fds:
            os.close(fd)


_CHILD = """
import fcntl, os, sys
fd = os.memfd_create("child", os.MFD_ALLOW_SEALING)
os.ftruncate(fd, 1 << 16)
fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
print(fd, flush=True)
sys.stdin.read()
"""
