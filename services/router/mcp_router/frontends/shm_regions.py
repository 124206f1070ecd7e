"""System shared memory (Triton's extension): regions a client on this host registers, so tensors go in and
out of the router without a copy through gRPC or HTTP.

A client creates a POSIX shared memory object (``shm_open``: a file under ``/dev/shm``), writes its
inputs there, and registers a region of it (name, key, offset, byte size). A request then names, per
input, the region, its byte size and an offset in it; the router reads the tensor from the mapping (a
view, no copy) and sends it to a worker. An output that names a region is written into it, and the reply
carries its shape only.

Invariants:
- A key is a POSIX shared memory name: "/" and then a name without "/" (nothing outside ``/dev/shm`` can
  be named); the region must lie inside the object, and each use inside the region: anything else is
  ``InvalidArgument`` naming the region and the bounds.
- Only a regular file, opened without following a symlink (``O_NOFOLLOW``), and owned by the router's own
  user is mapped: a router running as root would otherwise write outputs into any file under
  ``/dev/shm``. A same-host client creates its objects as the router's user (PERMISSION_DENIED else).
- A name is registered once (``AlreadyExists`` for a second time); unregistering closes the mapping only
  when no request still reads from it (the mapping lives as long as the arrays that view it).
- Per router process: a region registered with one router is unknown to another (as with Triton, each
  server has its own), and every router drops its regions when it stops.
- Known hazard, as with any mmap of memory another process owns: a client that shrinks its object after
  registering it makes the router's next access fault. Register only objects you keep at their size
  until you unregister them.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import re
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mcpcore import dtypes
from mcpcore.errors import AlreadyExists, InvalidArgument, NotFound, PermissionDenied

__all__ = ["Region", "SharedMemory"]

_KEY = re.compile(r"/[^/\x00]{1,250}")
SHM_DIR = Path("/dev/shm")  # noqa: S108  where POSIX shared memory lives (shm_open names), not a temp file


@dataclass(frozen=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int


class SharedMemory:
    """The regions registered with this router, by name."""

    def __init__(self, directory: Path = SHM_DIR) -> None:
        self._dir = directory
        self._regions: dict[str, tuple[Region, mmap.mmap]] = {}
        self._lock = threading.Lock()  # registration is rare; reads happen on the event loop

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:
            raise InvalidArgument("a shared memory region needs a name")
        if not _KEY.fullmatch(key):
            raise InvalidArgument(
                f"shared memory key {key!r} is not a POSIX shared memory name ('/' then a name without '/')"
            )
        if offset < 0 or byte_size <= 0:
            raise InvalidArgument(
                f"region {name}: offset {offset} and byte_size {byte_size} must be >= 0 and > 0"
            )
        with self._lock:
            if name in self._regions:
                raise AlreadyExists(
                    f"shared memory region {name!r} is registered already; unregister it first"
                )
            path = self._dir / key[1:]
            try:  # no symlink out of the directory, and only a regular file (what shm_open makes)
                fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
            except OSError as exc:
                raise InvalidArgument(
                    f"region {name}: cannot open shared memory {key!r}: {exc.strerror}"
                ) from None
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    raise InvalidArgument(f"region {name}: {key!r} is not a shared memory object")
                if info.st_uid != os.geteuid():  # a root router could open anyone's: it maps only its own
                    raise PermissionDenied(
                        f"region {name}: {key!r} belongs to user {info.st_uid}; the router maps only shared "
                        f"memory of its own user ({os.geteuid()}): create the object as that user"
                    )
                size = info.st_size
                if offset + byte_size > size:
                    raise InvalidArgument(
                        f"region {name}: offset {offset} + byte_size {byte_size} is past the end of {key!r} "
                        f"({size} bytes)"
                    )
                mapping = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            self._regions[name] = (Region(name, key, offset, byte_size), mapping)

    def unregister(self, name: str = "") -> None:
        """Forget ``name`` (every region for ""); an unknown name is not an error, as in Triton."""
        with self._lock:
            names = [name] if name else list(self._regions)
            for n in names:
                entry = self._regions.pop(n, None)
                if entry is not None:
                    _close(entry[1])

    def status(self, name: str = "") -> list[Region]:
        with self._lock:
            if name and name not in self._regions:
                raise NotFound(f"shared memory region {name!r} is not registered")
            return [r for n, (r, _) in sorted(self._regions.items()) if not name or n == name]

    def _view(self, name: str, offset: int, byte_size: int, what: str) -> memoryview:
        entry = self._regions.get(name)
        if entry is None:
            raise InvalidArgument(f"{what}: shared memory region {name!r} is not registered")
        region, mapping = entry
        if offset < 0 or byte_size < 0 or offset + byte_size > region.byte_size:
            raise InvalidArgument(
                f"{what}: offset {offset} + byte_size {byte_size} is outside region {name!r} "
                f"({region.byte_size} bytes)"
            )
        start = region.offset + offset
        return memoryview(mapping)[start : start + byte_size]

    def read(
        self, name: str, offset: int, byte_size: int, *, datatype: str, shape: tuple[int, ...], what: str
    ) -> np.ndarray:
        """The tensor in the region: a read-only view of the mapping (BYTES: its elements, copied)."""
        if datatype != dtypes.BYTES:
            need = math.prod(shape) * dtypes.numpy_dtype(datatype).itemsize
            if byte_size != need:
                raise InvalidArgument(
                    f"{what}: shared_memory_byte_size {byte_size} but shape {list(shape)} needs {need}"
                )
        view = self._view(name, offset, byte_size, what)
        array = dtypes.from_bytes(datatype, view, shape, f"{what} (shared memory)")
        array.flags.writeable = False
        return array

    def write(self, name: str, offset: int, byte_size: int, data: bytes | memoryview, *, what: str) -> None:
        """Put an output into the region (it must fit in ``byte_size``)."""
        if len(data) > byte_size:
            raise InvalidArgument(f"{what} is {len(data)} bytes but its region gives it {byte_size}")
        view = self._view(name, offset, len(data), what)
        view[:] = data

    def close(self) -> None:
        self.unregister()


def _close(mapping: mmap.mmap) -> None:
    with contextlib.suppress(BufferError):  # an array still views it: it closes when the last view goes
        mapping.close()
