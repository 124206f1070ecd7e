"""The ctypes binding to ``libmcp_mempool.so``: fixed-size blocks from one reusable arena (DESIGN.md 9).

This is the only module that loads the native library. The worker takes batch and receive buffers from a
``Pool`` instead of ``np.empty`` so that a 64 MiB buffer costs no page faults after startup, and so that
CUDA can pin the whole arena once (register ``pool.arena()`` with ``pycuda.driver.register_host_memory``).

Invariants:
- Memory safety does not depend on call order. Every view of a block (``Block.view``,
  ``Block.array``, ``Pool.arena``) holds a reference to the arena's owner, and the arena is freed only
  when the pool is closed *and* the last view is gone; ``close()`` with blocks still borrowed is safe.
- A ``Block`` is freed at most once: freeing it again raises ``ValueError`` even when its address has
  since been handed out to someone else (which the C pool, seeing only addresses, could not tell).
- Thread safety: the C pool takes a mutex around its free list, and ctypes releases the GIL for each call,
  so threads may allocate and free concurrently; a Python lock only guards each ``Block``'s freed flag.
  The C pool's own checks (foreign pointer, double free) back these up for raw addresses.
- Nothing is loaded at import: ``available()`` tells callers whether to fall back to numpy buffers.
"""

from __future__ import annotations

import ctypes
import math
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import DTypeLike

__all__ = ["LIBRARY", "Block", "Pool", "PoolExhausted", "PoolStats", "available"]


def _library_path() -> Path:
    """Next to this module where an install put it (the compose image does), else the checkout's build/."""
    here = Path(__file__).resolve().parent
    packaged = here / "libmcp_mempool.so"
    return packaged if packaged.is_file() else here.parent / "build" / "libmcp_mempool.so"


LIBRARY = _library_path()
ALIGNMENTS = (64, 4096)
_OK, _EFOREIGN, _EDOUBLE = 0, -1, -2

_load_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


class _CStats(ctypes.Structure):
    _fields_ = [
        ("block_size", ctypes.c_size_t),
        ("n_blocks", ctypes.c_size_t),
        ("in_use", ctypes.c_size_t),
        ("high_water", ctypes.c_size_t),
        ("failed_allocs", ctypes.c_uint64),
    ]


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.mcp_pool_create.argtypes = [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t]
    lib.mcp_pool_create.restype = ctypes.c_void_p
    lib.mcp_pool_alloc.argtypes = [ctypes.c_void_p]
    lib.mcp_pool_alloc.restype = ctypes.c_void_p
    lib.mcp_pool_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.mcp_pool_free.restype = ctypes.c_int
    lib.mcp_pool_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(_CStats)]
    lib.mcp_pool_stats.restype = None
    lib.mcp_pool_base.argtypes = [ctypes.c_void_p]
    lib.mcp_pool_base.restype = ctypes.c_void_p
    lib.mcp_pool_arena_bytes.argtypes = [ctypes.c_void_p]
    lib.mcp_pool_arena_bytes.restype = ctypes.c_size_t
    lib.mcp_pool_destroy.argtypes = [ctypes.c_void_p]
    lib.mcp_pool_destroy.restype = None
    return lib


def _load() -> ctypes.CDLL:
    global _lib  # noqa: PLW0603 - one CDLL per process: loading is idempotent and the handle is immutable
    with _load_lock:
        if _lib is None:
            if not LIBRARY.is_file():
                raise RuntimeError("libmcp_mempool.so is not built: run `make native`")
            try:
                _lib = _declare(ctypes.CDLL(str(LIBRARY), use_errno=True))
            except (OSError, AttributeError) as exc:
                raise RuntimeError(f"cannot load {LIBRARY}: {exc}; rebuild it with `make native`") from exc
        return _lib


def available() -> tuple[bool, str]:
    """(True, library path) when the native pool can be used, else (False, why): fall back to numpy."""
    try:
        _load()
    except RuntimeError as exc:
        return False, str(exc)
    return True, str(LIBRARY)


class PoolExhausted(MemoryError):
    """Every block is in use (``Pool.borrow``; ``Pool.alloc`` returns None instead)."""


@dataclass(frozen=True)
class PoolStats:
    block_size: int
    n_blocks: int
    in_use: int
    high_water: int
    failed_allocs: int


class _Arena:
    """Owns the C pool. Views reach it through their buffer; when it is collected the pool is destroyed."""

    __slots__ = ("__weakref__", "handle")

    def __init__(self, lib: ctypes.CDLL, handle: int) -> None:
        self.handle = handle
        finalizer = weakref.finalize(self, lib.mcp_pool_destroy, handle)
        # At interpreter exit a daemon thread may still hold a view: leak the arena to the OS instead.
        finalizer.atexit = False


class Block:
    """One block handed out by a ``Pool``: its address, index and a writable view of its bytes.

    The views stay valid memory as long as they live, but after ``Pool.free`` the block may belong to
    someone else: drop them before freeing.
    """

    __slots__ = ("_freed", "_pool", "_view", "address", "index")

    def __init__(self, pool: Pool, address: int, index: int, view: memoryview) -> None:
        self._pool = pool
        self.address = address
        self.index = index
        self._view: memoryview | None = view
        self._freed = False

    @property
    def nbytes(self) -> int:
        return self._pool.block_size

    @property
    def view(self) -> memoryview:
        """A writable byte view of the whole block (e.g. for ``zmq.Socket.recv_into``)."""
        if self._view is None:
            raise ValueError(f"block #{self.index} was freed: its memory may belong to another caller")
        return self._view

    def array(self, dtype: DTypeLike = np.uint8, shape: int | tuple[int, ...] | None = None) -> np.ndarray:
        """A writable ndarray over the block's first bytes (the whole block when shape is None)."""
        if shape is None:
            return np.frombuffer(self.view, dtype=dtype)
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        count = math.prod(dims)
        itemsize = np.dtype(dtype).itemsize
        if count * itemsize > self._pool.block_size:
            raise ValueError(
                f"shape {dims} of {np.dtype(dtype)} needs {count * itemsize} bytes; "
                f"the block holds {self._pool.block_size}"
            )
        return np.frombuffer(self.view, dtype=dtype, count=count).reshape(dims)

    def __repr__(self) -> str:
        state = "freed" if self._freed else "in use"
        return f"<Block #{self.index} at {self.address:#x}, {self.nbytes} bytes, {state}>"


class _Borrowed:
    """The context manager of ``Pool.borrow`` (a class, not a generator: it is on the batch path)."""

    __slots__ = ("_block", "_pool")

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._block: Block | None = None

    def __enter__(self) -> Block:
        block = self._pool.alloc()
        if block is None:
            pool = self._pool
            raise PoolExhausted(
                f"memory pool exhausted: all {pool.n_blocks} blocks of {pool.block_size} bytes are in use"
            )
        self._block = block
        return block

    def __exit__(self, *exc_info: object) -> None:
        block, self._block = self._block, None
        if block is not None:
            self._pool.free(block)


class Pool:
    """``blocks`` blocks of ``block_bytes`` bytes (rounded up to ``alignment``: 64 or 4096) in one arena."""

    def __init__(self, block_bytes: int, blocks: int, alignment: int = 64) -> None:
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be positive, got {block_bytes}")
        if blocks <= 0:
            raise ValueError(f"blocks must be positive, got {blocks}")
        if alignment not in ALIGNMENTS:
            raise ValueError(f"alignment must be one of {ALIGNMENTS}, got {alignment}")
        lib = _load()
        handle = lib.mcp_pool_create(block_bytes, blocks, alignment)
        if not handle:
            errno = ctypes.get_errno()
            raise MemoryError(f"cannot create a pool of {blocks} x {block_bytes} bytes (errno {errno})")
        self._lib = lib
        self._c_alloc = lib.mcp_pool_alloc
        self._c_free = lib.mcp_pool_free
        self._arena: _Arena | None = _Arena(lib, handle)
        self.alignment = alignment
        self.base_address: int = lib.mcp_pool_base(handle)
        self.arena_bytes: int = lib.mcp_pool_arena_bytes(handle)
        self.block_size = self.arena_bytes // blocks
        self.n_blocks = blocks
        buffer = (ctypes.c_char * self.arena_bytes).from_address(self.base_address)
        buffer._arena = self._arena  # every view of the arena keeps the C pool alive
        self._bytes: memoryview | None = memoryview(buffer).cast("B")
        self._flag_lock = threading.Lock()

    def _handle(self) -> tuple[_Arena, memoryview]:
        arena, view = self._arena, self._bytes
        if arena is None or view is None:
            raise RuntimeError("pool is closed")
        return arena, view

    def alloc(self) -> Block | None:
        """A free block, or None when all are in use (counted in ``stats().failed_allocs``)."""
        arena, view = self._arena, self._bytes  # locals: a concurrent close() cannot free them under us
        if arena is None or view is None:
            raise RuntimeError("pool is closed")
        address = self._c_alloc(arena.handle)
        if not address:
            return None
        offset = address - self.base_address
        return Block(self, address, offset // self.block_size, view[offset : offset + self.block_size])

    def free(self, block: Block) -> None:
        """Return ``block``; ValueError for a block of another pool or one already freed.

        After ``close()`` this only marks the block freed: nobody can allocate it again.
        """
        if not isinstance(block, Block) or block._pool is not self:
            raise ValueError(f"foreign block: {block!r} was not allocated by this pool")
        with self._flag_lock:
            if block._freed:
                raise ValueError(f"double free: block #{block.index} was already freed")
            block._freed = True
            block._view = None
        arena = self._arena
        if arena is not None:
            self._check(self._c_free(arena.handle, block.address), block.address)

    def _free_address(self, address: int) -> None:
        """Free a raw address, checked by the C pool alone (the tests reach its checks through this)."""
        arena, _ = self._handle()
        self._check(self._c_free(arena.handle, address), address)

    @staticmethod
    def _check(rc: int, address: int) -> None:
        if rc == _OK:
            return
        if rc == _EFOREIGN:
            raise ValueError(f"foreign block: {address:#x} is not the start of a block of this pool")
        if rc == _EDOUBLE:
            raise ValueError(f"double free: the block at {address:#x} is already free")
        if rc != _OK:
            raise RuntimeError(f"mcp_pool_free returned unknown code {rc}")

    def borrow(self) -> _Borrowed:
        """``with pool.borrow() as block:``; raises PoolExhausted when every block is in use."""
        return _Borrowed(self)

    def stats(self) -> PoolStats:
        arena, _ = self._handle()
        raw = _CStats()
        self._lib.mcp_pool_stats(arena.handle, ctypes.byref(raw))
        return PoolStats(raw.block_size, raw.n_blocks, raw.in_use, raw.high_water, raw.failed_allocs)

    def arena(self) -> np.ndarray:
        """The whole arena as uint8 (page-aligned with alignment=4096), e.g. to pin it for CUDA. The array
        keeps the arena alive: a registration holding it is always undone before the memory is freed."""
        _, view = self._handle()
        return np.frombuffer(view, dtype=np.uint8)

    @property
    def closed(self) -> bool:
        return self._arena is None

    def close(self) -> None:
        """Stop handing out blocks. The arena is freed once no view of it remains. Idempotent."""
        self._arena = None
        self._bytes = None

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"at {self.base_address:#x}"
        return f"<Pool {self.n_blocks} x {self.block_size} bytes, alignment {self.alignment}, {state}>"
