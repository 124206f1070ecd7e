"""The ctypes binding to the native memory pool (libs/native): blocks, views, errors, threads, lifetime.

The library is built once per session if it is missing or older than its sources (``build.sh lib`` takes
well under a second), so ``make test`` works from a fresh clone.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pytest

from mcp_native import pool as native_pool
from mcp_native.pool import Block, Pool, PoolExhausted, PoolStats, available

NATIVE = Path(__file__).resolve().parents[2] / "libs" / "native"


pytestmark = pytest.mark.usefixtures("built_library")  # tests/conftest.py builds it when stale


def test_available_when_built() -> None:
    assert available() == (True, str(native_pool.LIBRARY))


def test_missing_library_is_reported_not_crashed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(native_pool, "LIBRARY", tmp_path / "libmcp_mempool.so")
    monkeypatch.setattr(native_pool, "_lib", None)
    ok, why = available()
    assert not ok
    assert why == "libmcp_mempool.so is not built: run `make native`"
    with pytest.raises(RuntimeError, match="make native"):
        Pool(64, 1)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"block_bytes": 0, "blocks": 1}, "block_bytes"),
        ({"block_bytes": 64, "blocks": 0}, "blocks"),
        ({"block_bytes": 64, "blocks": 1, "alignment": 128}, "alignment"),
    ],
)
def test_bad_arguments_name_the_field(kwargs: dict[str, int], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Pool(**kwargs)


def test_exhaustion_returns_none_and_counts() -> None:
    pool = Pool(100, 4)
    blocks = [pool.alloc() for _ in range(4)]
    assert all(isinstance(b, Block) for b in blocks)
    assert len({b.address for b in blocks}) == 4
    assert pool.alloc() is None
    with pytest.raises(PoolExhausted, match="all 4 blocks of 128 bytes are in use"), pool.borrow():
        pass
    assert pool.stats() == PoolStats(block_size=128, n_blocks=4, in_use=4, high_water=4, failed_allocs=2)
    pool.free(blocks[2])
    again = pool.alloc()
    assert again is not None and again.address == blocks[2].address


def test_double_free_rejected() -> None:
    pool = Pool(64, 2)
    block = pool.alloc()
    pool.free(block)
    with pytest.raises(ValueError, match="double free"):
        pool.free(block)
    assert pool.stats().in_use == 0


def test_stale_block_cannot_free_the_new_owner() -> None:
    """The address was handed out again: the C pool alone could not tell the two frees apart."""
    pool = Pool(64, 1)
    old = pool.alloc()
    pool.free(old)
    new = pool.alloc()
    assert new.address == old.address
    with pytest.raises(ValueError, match="double free"):
        pool.free(old)
    assert pool.stats().in_use == 1
    pool.free(new)


def test_foreign_block_rejected() -> None:
    pool, other = Pool(64, 2), Pool(64, 2)
    theirs = other.alloc()
    with pytest.raises(ValueError, match="foreign block"):
        pool.free(theirs)
    with pytest.raises(ValueError, match="foreign block"):
        pool.free("not a block")  # type: ignore[arg-type]
    other.free(theirs)  # still belongs to its own pool


@pytest.mark.parametrize(
    ("offset", "problem"),
    [(1, "foreign block"), (64 + 8, "foreign block"), (2 * 64, "foreign block"), (-64, "foreign block")],
)
def test_c_checks_raw_addresses(offset: int, problem: str) -> None:
    """What the C pool itself rejects: misaligned inside the arena, past its end, before its start."""
    pool = Pool(64, 2)
    block = pool.alloc()
    with pytest.raises(ValueError, match=problem):
        pool._free_address(pool.base_address + offset)
    with pytest.raises(ValueError, match="double free"):
        pool._free_address(pool.base_address + 64)  # block 1 was never handed out
    assert pool.stats().in_use == 1
    pool.free(block)


def test_views_write_and_read_back() -> None:
    pool = Pool(4096, 3)
    block = pool.alloc()
    rows = np.arange(32 * 16, dtype=np.float32).reshape(32, 16)
    np.copyto(block.array(np.float32, (32, 16)), rows)
    assert np.array_equal(block.array(np.float32, (32, 16)), rows)
    assert bytes(block.view[:8]) == rows.tobytes()[:8]
    block.view[0:4] = b"\x00\x00\x80\x3f"  # 1.0f little-endian
    assert block.array(np.float32, 1)[0] == 1.0
    whole = block.array()
    assert whole.dtype == np.uint8 and whole.nbytes == 4096 and whole.flags.writeable
    assert block.array(np.float64).shape == (512,)
    with pytest.raises(ValueError, match="needs 4100 bytes; the block holds 4096"):
        block.array(np.uint8, (4100,))
    pool.free(block)
    with pytest.raises(ValueError, match="was freed"):
        block.array()


def test_blocks_do_not_overlap() -> None:
    pool = Pool(1000, 8)
    blocks = [pool.alloc() for _ in range(8)]
    for i, block in enumerate(blocks):
        block.array()[:] = i
    for i, block in enumerate(blocks):
        assert (block.array() == i).all()
    assert sorted(b.index for b in blocks) == list(range(8))


@pytest.mark.parametrize(("alignment", "requested", "rounded"), [(64, 100, 128), (4096, 5000, 8192)])
def test_every_block_is_aligned(alignment: int, requested: int, rounded: int) -> None:
    pool = Pool(requested, 9, alignment=alignment)
    assert pool.block_size == rounded and pool.arena_bytes == 9 * rounded
    assert pool.base_address % alignment == 0
    assert pool.arena().ctypes.data == pool.base_address
    blocks = [pool.alloc() for _ in range(9)]
    assert all(b.address % alignment == 0 for b in blocks)
    assert all(b.array().ctypes.data == b.address for b in blocks)


def test_stats_track_high_water() -> None:
    pool = Pool(64, 10)
    assert pool.stats() == PoolStats(64, 10, 0, 0, 0)
    held = [pool.alloc() for _ in range(5)]
    for block in held[:3]:
        pool.free(block)
    pool.alloc()
    assert pool.stats() == PoolStats(64, 10, in_use=3, high_water=5, failed_allocs=0)


def test_borrow_frees_on_exit_and_on_error() -> None:
    pool = Pool(64, 1)
    with pool.borrow() as block:
        assert pool.stats().in_use == 1
        block.array()[:] = 7
    assert pool.stats().in_use == 0
    with pytest.raises(KeyError), pool.borrow():
        raise KeyError("boom")
    assert pool.stats().in_use == 0


def test_threads_never_share_a_block() -> None:
    """8 threads on 4 blocks: each stamps its id over its block, yields, and checks nobody wrote over it."""
    pool = Pool(4096, 4)
    threads_n, iterations = 8, 2000
    holders: dict[int, int] = {}
    holders_lock = threading.Lock()
    errors: list[str] = []
    nones = [0] * threads_n
    start = threading.Barrier(threads_n)

    def work(tid: int) -> None:
        start.wait()
        for _ in range(iterations):
            block = pool.alloc()
            if block is None:
                nones[tid] += 1
                continue
            with holders_lock:
                if block.index in holders:
                    errors.append(f"block {block.index} given to {tid} while {holders[block.index]} held it")
                holders[block.index] = tid
            stamp = block.array(np.int32)
            stamp[:] = tid
            time.sleep(0)  # let other threads run while we hold the block
            if not (stamp == tid).all():
                errors.append(f"block {block.index} of thread {tid} was overwritten")
            with holders_lock:
                del holders[block.index]
            del stamp
            pool.free(block)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    assert not any(w.is_alive() for w in workers)
    assert errors == []
    stats = pool.stats()
    assert stats.in_use == 0 and stats.high_water <= 4
    assert stats.failed_allocs == sum(nones)


def test_views_outlive_close_safely() -> None:
    pool = Pool(64, 2)
    block = pool.alloc()
    view = block.array()
    view[:] = 9
    arena = weakref.ref(pool._arena)
    pool.close()
    assert pool.closed
    with pytest.raises(RuntimeError, match="pool is closed"):
        pool.alloc()
    with pytest.raises(RuntimeError, match="pool is closed"):
        pool.stats()
    pool.free(block)  # allowed after close: only marks the block freed
    del pool, block
    gc.collect()
    assert arena() is not None  # the view still holds the arena ...
    assert (view == 9).all()  # ... so reading it is safe
    del view
    gc.collect()
    assert arena() is None  # the last view gone: the C pool was destroyed


def test_close_is_idempotent_and_context_managed() -> None:
    with Pool(64, 1) as pool:
        assert not pool.closed
    assert pool.closed
    pool.close()
    assert "closed" in repr(pool)
