"""Same-host shared memory for tensors (``SharedRegion`` in protos/mcpapi/v2/tensor.proto).

A sender on a worker's local endpoint (the SDK's direct path) may put its tensors in memory the worker
maps, and lend a reply region the worker writes its outputs into: one copy each way in place of four
kernel copies through a socket. Linux only, like the local endpoint.

Sender side (``RegionPool``): each region is a memfd of the sending process, sealed so it can never
shrink (a worker reading a shrunk file would die of SIGBUS) nor grow. A request leases one (``Lease``):
its inputs are copied in, the rest is the reply region, and the outputs the worker wrote there are handed
to the caller as read-only views. The region goes back to the pool only when no output array needs it any
more and the worker has answered; a request abandoned before its answer spoils its region (the worker may
still write into it), which is then closed, never reused.

Receiver side (``PeerRegions``): a worker trusts no field of the header. It maps a region only for a
sender on a Unix socket, whose pid and uid the kernel gives (ZeroMQ's ``Peer-Address`` property reads
``localhost:<uid>:<gid>:<pid>`` for one; over TCP it is an IP address). It opens ``/proc/<pid>/fd/<fd>``
(the kernel allows that only to the sender's own user or root), and takes the file only if it is a
regular file owned by that uid, a memfd sealed against shrinking, and no bigger than ``max_region_bytes``;
every range must lie inside it. The descriptor's /proc link must name a memfd before anything else is
asked of it (no file system that could block is touched). Mappings are lazy (a sparse region costs only
the pages used) and cached by the file's identity (checked on every use, so a reused descriptor number is
a new file); those of exited processes go, and the least recently used past ``max_maps`` or ``max_bytes``.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import mmap
import os
import queue
import stat
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from mcpapi.v2 import tensor_pb2
from mcpcore.errors import FailedPrecondition, InvalidArgument, not_started

__all__ = [
    "ALIGN",
    "AVAILABLE",
    "MIN_BYTES",
    "Lease",
    "PeerRegions",
    "RegionPool",
    "ReplyArea",
    "peer_process",
]

#: Linux: memfds, seals and /proc/<pid>/fd (the local endpoint is Linux-only as well).
AVAILABLE = sys.platform.startswith("linux") and hasattr(os, "memfd_create")
#: Each tensor starts at a multiple of this (a cache line; what any dtype's alignment needs).
ALIGN = 64
#: A request with fewer bytes of tensors goes as frames: below this the socket's copies cost less than a
#: region's bookkeeping.
MIN_BYTES = 256 << 10
_MiB = 1 << 20
_NUMERIC = frozenset("biufc")  # numpy kinds whose bytes are the tensor's (wire.encode places only these)


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class _Slots:
    """Bytes ``[start, end)`` of a mapping, filled from the front with tensors, each at an aligned offset."""

    __slots__ = ("bytes", "end", "used")

    def __init__(self, mapped: np.ndarray, start: int, end: int) -> None:
        self.bytes, self.used, self.end = mapped, start, end

    def put(self, arr: np.ndarray) -> int | None:
        """Copy ``arr`` in; its offset, or None when it does not fit."""
        at, n = self.used, arr.nbytes
        if at + n > self.end:
            return None
        np.copyto(self.bytes[at : at + n].view(arr.dtype).reshape(arr.shape), arr, casting="no")
        self.used = _aligned(at + n)
        return at


def peer_process(frame: Any) -> tuple[int, int] | None:
    """``(pid, uid)`` of the process that sent a received ZeroMQ frame over a Unix socket, or None: a
    TCP peer, or a pid the kernel could not give (the sender is in another pid namespace)."""
    try:
        address = frame.get("Peer-Address")
    except Exception:  # no such property (not received from a socket)
        return None
    parts = str(address).split(":")
    if len(parts) != 4 or parts[0] != "localhost" or not all(p.isdigit() for p in parts[1:]):
        return None
    uid, pid = int(parts[1]), int(parts[3])
    return (pid, uid) if pid > 0 else None


# -- receiver side -------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Mapped:
    map: mmap.mmap
    size: int


class PeerRegions:
    """A worker's mappings of its same-host senders' regions (the module's docstring)."""

    def __init__(self, *, max_region_bytes: int, max_maps: int = 64, max_bytes: int = 1 << 30) -> None:
        self.max_region_bytes = max_region_bytes
        self.max_maps = max_maps
        self.max_bytes = max_bytes
        self._maps: collections.OrderedDict[tuple[int, int, int, int], _Mapped] = collections.OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._maps)

    def view(
        self, peer: tuple[int, int] | None, region: tensor_pb2.SharedRegion, what: str, *, writable: bool
    ) -> memoryview:
        """The bytes ``region`` names in the memory of ``peer`` (from ``peer_process``). Raises
        ``FailedPrecondition`` (marked not started) for a region that cannot be used, saying why."""
        if peer is None:
            raise _refused(
                f"{what} is in a sender's shared memory, which is taken only from a sender on this worker's "
                "local endpoint (same host, same pid namespace); send its bytes as a frame"
            )
        pid, uid = peer
        path = f"/proc/{pid}/fd/{region.fd}"
        try:
            # the link's text comes from /proc alone: no file system behind the descriptor is asked
            # anything (one that never answers, FUSE, would block) unless it is a memfd
            if not os.readlink(path).startswith("/memfd:"):
                raise _refused(f"{what}: the sender's descriptor is not a memfd")
            st = os.stat(path)  # the file the descriptor names now (a reused number is another file)
        except OSError as exc:
            raise _refused(
                f"{what}: descriptor {region.fd} of process {pid} cannot be read ({exc.strerror})"
            ) from None
        key = (pid, region.fd, st.st_dev, st.st_ino)
        mapped = self._maps.get(key)
        if mapped is None:
            mapped = self._open(path, uid, st, what)
            self._keep(key, mapped)
        else:
            self._maps.move_to_end(key)
        end = region.offset + region.size
        if end > mapped.size:
            raise InvalidArgument(
                f"{what}: bytes {region.offset}..{end} lie outside the {mapped.size}-byte region "
                f"(descriptor {region.fd} of process {pid})"
            )
        view = memoryview(mapped.map)[region.offset : end]
        return view if writable else view.toreadonly()

    def _keep(self, key: tuple[int, int, int, int], mapped: _Mapped) -> None:
        """Cache a new mapping; those of processes gone, then the least recently used past ``max_maps`` or
        ``max_bytes``, go (each unmapped once no request's view holds it)."""
        for old in [k for k in self._maps if not os.path.exists(f"/proc/{k[0]}")]:
            del self._maps[old]
        self._maps[key] = mapped
        self._bytes = sum(m.size for m in self._maps.values())
        while len(self._maps) > 1 and (len(self._maps) > self.max_maps or self._bytes > self.max_bytes):
            _, gone = self._maps.popitem(last=False)
            self._bytes -= gone.size

    def _open(self, path: str, uid: int, seen: os.stat_result, what: str) -> _Mapped:
        if not stat.S_ISREG(seen.st_mode):  # never opened: a device or a FIFO could act on an open
            raise _refused(f"{what}: the sender's descriptor is not a memfd")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError as exc:
            raise _refused(f"{what}: the sender's shared memory cannot be opened ({exc.strerror})") from None
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (seen.st_dev, seen.st_ino):
                raise _refused(f"{what}: the sender's descriptor changed while it was opened")
            if not stat.S_ISREG(st.st_mode):
                raise _refused(f"{what}: the sender's descriptor is not a memfd")
            if st.st_uid != uid:
                raise _refused(
                    f"{what}: the region's file belongs to uid {st.st_uid}, not to the sender ({uid})"
                )
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            except OSError:
                raise _refused(f"{what}: the sender's descriptor is not a memfd") from None
            if not seals & fcntl.F_SEAL_SHRINK:
                raise _refused(f"{what}: the sender's memfd is not sealed against shrinking (F_SEAL_SHRINK)")
            if not 0 < st.st_size <= self.max_region_bytes:
                raise _refused(
                    f"{what}: the sender's region is {st.st_size} bytes; this worker maps 1 to "
                    f"{self.max_region_bytes}"
                )
            try:  # pages come as they are touched: a sparse region costs only what is read or written
                return _Mapped(mmap.mmap(fd, st.st_size, flags=mmap.MAP_SHARED), st.st_size)
            except OSError as exc:  # sealed against writes, say
                raise _refused(f"{what}: the sender's memfd cannot be mapped ({exc.strerror})") from None
        finally:
            os.close(fd)


class ReplyArea:
    """A sender's reply region as a worker writes a reply's outputs into it (``place``, for
    ``wire.encode``)."""

    def __init__(self, view: memoryview, region: tensor_pb2.SharedRegion) -> None:
        self._slots = _Slots(np.frombuffer(view, np.uint8), 0, view.nbytes)
        self._fd, self._offset = region.fd, region.offset

    @property
    def used(self) -> int:
        return self._slots.used

    def place(self, arr: np.ndarray) -> tensor_pb2.SharedRegion | None:
        at = self._slots.put(arr)
        if at is None:
            return None  # it goes as a frame
        return tensor_pb2.SharedRegion(fd=self._fd, offset=self._offset + at, size=arr.nbytes)


def _refused(message: str) -> FailedPrecondition:
    return not_started(FailedPrecondition(message))


# -- sender side ---------------------------------------------------------------------------------------


class _Region:
    """One sealed memfd of this process, mapped."""

    def __init__(self, size: int) -> None:
        fd = os.memfd_create("mcpmesh-tensors", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self.map = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self.fd, self.size = fd, size
        self.bytes = np.frombuffer(self.map, np.uint8)
        self.address: int = self.bytes.ctypes.data

    def close(self) -> None:
        """Free it: the descriptor now, the mapping once nothing holds it (a lease being finalized may
        still hold a view for a moment)."""
        os.close(self.fd)
        del self.bytes
        with contextlib.suppress(BufferError):
            self.map.close()


class _Held:
    """Read-only bytes of a leased region; whatever is made of them keeps the lease (so the region)."""

    def __init__(self, lease: Lease, address: int, size: int) -> None:
        self.lease = lease
        self.__array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (address, True), "version": 3}


class Lease:
    """One request's region: ``place`` copies inputs in, ``reply_region`` lends the rest, ``view`` gives
    the outputs written there."""

    __slots__ = ("__weakref__", "_inputs", "out_start", "region", "spoiled")

    def __init__(self, region: _Region, out_start: int) -> None:
        self.region, self.out_start = region, out_start
        self._inputs = _Slots(region.bytes, 0, out_start)
        #: Spoiled: the worker may still write into it (the request was abandoned); never reused.
        self.spoiled = [False]

    def place(self, arr: np.ndarray) -> tensor_pb2.SharedRegion | None:
        """Copy ``arr`` into the region and say where; None when it does not fit (it goes as a frame)."""
        at = self._inputs.put(arr)
        if at is None:
            return None
        return tensor_pb2.SharedRegion(fd=self.region.fd, offset=at, size=arr.nbytes)

    def reply_region(self) -> tensor_pb2.SharedRegion:
        return tensor_pb2.SharedRegion(
            fd=self.region.fd, offset=self.out_start, size=self.region.size - self.out_start
        )

    def view(self, region: tensor_pb2.SharedRegion, what: str) -> memoryview:
        """The bytes of an output the worker wrote into the reply region (checked to lie inside it)."""
        end = region.offset + region.size
        if region.fd != self.region.fd or region.offset < self.out_start or end > self.region.size:
            raise InvalidArgument(
                f"{what}: the worker's reply names bytes {region.offset}..{end} of descriptor {region.fd}, "
                "outside the reply region this request lent"
            )
        return memoryview(np.asarray(_Held(self, self.region.address + region.offset, region.size)))

    def spoil(self) -> None:
        self.spoiled[0] = True


class RegionPool:
    """A sender's regions: leased per request, back when free (``Lease``), at most ``max_idle_bytes`` of
    them kept idle. Not thread-safe (one event loop's)."""

    def __init__(self, *, max_region_bytes: int, max_idle_bytes: int = 512 * _MiB) -> None:
        self.max_region_bytes = max_region_bytes
        self.max_idle_bytes = max_idle_bytes
        self._idle: list[_Region] = []
        self._closed = False
        self._lock = threading.Lock()
        # A lease's finalizer runs in whichever thread drops it last, and may run inside ``lease`` itself
        # (a garbage collection there): it takes no lock, only hands the region back through this queue.
        self._returned: queue.SimpleQueue[_Region] = queue.SimpleQueue()
        self.created = 0

    def lease(self, inputs: list[np.ndarray]) -> Lease | None:
        """A region for these inputs and about as many bytes of outputs, or None if they are too big."""
        need_in = sum(_aligned(a.nbytes) for a in inputs if a.dtype.kind in _NUMERIC)
        need = need_in + max(need_in, _MiB)
        if need_in > self.max_region_bytes:
            return None
        need = min(need, self.max_region_bytes)
        with self._lock:
            self._take_returned()
            fits = [r for r in self._idle if r.size >= need]
            region = min(fits, key=lambda r: r.size) if fits else None
            if region is not None:
                self._idle.remove(region)
        if region is None:
            region = _Region(min(-(-need // _MiB) * _MiB, self.max_region_bytes))
            self.created += 1
        lease = Lease(region, need_in)
        weakref.finalize(lease, self._give_back, region, lease.spoiled).atexit = False  # outputs may outlive
        return lease

    def _give_back(self, region: _Region, spoiled: list[bool]) -> None:
        if spoiled[0] or self._closed:
            region.close()  # no lock: a descriptor and a mapping of its own
        else:
            self._returned.put(region)

    def _take_returned(self) -> None:
        """Regions whose leases ended go idle; past ``max_idle_bytes`` the oldest close (lock held)."""
        while True:
            try:
                self._idle.append(self._returned.get_nowait())
            except queue.Empty:
                break
        while sum(r.size for r in self._idle) > self.max_idle_bytes:
            self._idle.pop(0).close()

    @property
    def idle(self) -> int:
        """Regions ready for a lease."""
        with self._lock:
            self._take_returned()
            return len(self._idle)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._take_returned()
            closing, self._idle = self._idle, []
        for region in closing:
            region.close()
