"""Batch-assembly buffers from the native pool (``mcp_native``), by power-of-two size class.

Why: a fresh 64 MiB ``np.empty`` costs page faults on every batch (DESIGN.md section 9); a pool block is
faulted in once at start-up and reused. Below ``min_bytes`` numpy is faster (its allocator reuses mapped
chunks, and a ctypes call costs a few microseconds), so small batches keep using numpy.

Invariants: a taken buffer is released exactly once (the ``Lease`` is a context manager); when the native
library is not built, a size class is exhausted, or a batch is larger than ``max_bytes``, ``take`` falls
back to ``np.empty`` — correctness never depends on the pool, only speed does.
"""

from __future__ import annotations

import logging
import threading

import numpy as np

__all__ = ["BatchBuffers", "Lease"]

log = logging.getLogger(__name__)
MiB = 1 << 20


class Lease:
    """A byte buffer on loan; ``release()`` (or leaving the ``with``) gives a pool block back."""

    def __init__(self, buffer: np.ndarray, release: object = None) -> None:
        self.buffer = buffer
        self._release = release

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()  # type: ignore[operator]

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class BatchBuffers:
    def __init__(self, *, blocks_per_class: int = 4, min_bytes: int = MiB, max_bytes: int = 64 * MiB) -> None:
        self._blocks = blocks_per_class
        self._min, self._max = min_bytes, max_bytes
        self._pools: dict[int, object] = {}
        self._lock = threading.Lock()
        self._native = None
        self.pool_hits = self.fallbacks = 0
        try:
            from mcp_native import pool  # noqa: PLC0415  (optional: the worker runs without it)

            ok, why = pool.available()
        except ImportError as exc:
            ok, why = False, str(exc)
        if ok:
            self._native = pool
        else:
            log.info("native pool not available (%s): batch buffers come from numpy", why)

    def _pool(self, size_class: int) -> object:
        with self._lock:
            found = self._pools.get(size_class)
            if found is None:
                found = self._pools[size_class] = self._native.Pool(size_class, self._blocks)  # type: ignore[union-attr]
            return found

    def wants(self, nbytes: int) -> bool:
        """Whether a buffer of ``nbytes`` would come from the pool (large enough, not too large)."""
        return self._native is not None and self._min <= nbytes <= self._max

    def take(self, nbytes: int) -> Lease:
        """A uint8 buffer of at least ``nbytes`` bytes (exactly ``nbytes`` long)."""
        if self.wants(nbytes):
            size_class = 1 << (nbytes - 1).bit_length()
            pool = self._pool(size_class)
            block = pool.alloc()  # type: ignore[attr-defined]
            if block is not None:
                self.pool_hits += 1
                return Lease(block.array(np.uint8)[:nbytes], lambda: pool.free(block))  # type: ignore[attr-defined]
        self.fallbacks += 1
        return Lease(np.empty(nbytes, np.uint8))

    def concatenate(self, parts: list[np.ndarray]) -> tuple[np.ndarray, Lease]:
        """``np.concatenate(parts)`` into a taken buffer; release the lease once the result is used."""
        first = parts[0]
        shape = (sum(p.shape[0] for p in parts), *first.shape[1:])
        nbytes = first.dtype.itemsize * int(np.prod(shape))
        lease = self.take(nbytes)
        out = lease.buffer.view(first.dtype).reshape(shape)
        np.concatenate(parts, out=out)
        return out, lease

    def close(self) -> None:
        with self._lock:
            for pool in self._pools.values():
                pool.close()  # type: ignore[attr-defined]
            self._pools.clear()
