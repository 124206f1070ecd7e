"""Memory-pool figures for ``make bench`` (DESIGN.md sections 9 and 12): getting a batch buffer and filling
it, from the native pool against a fresh ``np.empty`` each time.

What one iteration does, on either side: take a buffer of the batch's size, then ``np.copyto`` the
prepared batch rows into it (what the batcher does). A fresh 64 MiB ``np.empty`` is a new ``mmap`` from
glibc, so every fill faults its pages in; a pool block was faulted once, at pool creation, and is reused.
A 1 MiB ``np.empty`` comes back from glibc's heap already faulted, so there is nothing to save there and
that figure shows the pool's Python overhead (two ctypes calls, a Block and a view: ~4 us warm, more when
the copies have pushed the interpreter out of cache): 0.6-0.7x on the 2-core dev machine, against 1.5-1.6x
at 64 MiB. Use the pool for the big buffers.

The two sides alternate one iteration at a time for the whole budget, so drift in machine load hits both;
the figures are medians per iteration.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path

import numpy as np

from mcp_native.pool import Pool, available

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"1mib": 1 << 20, "64mib": 64 << 20}
ROW_FLOATS = 64  # demo model rows: FP32 [-1, 64]


def ensure_library() -> None:
    if available()[0]:
        return
    subprocess.run([str(ROOT / "libs" / "native" / "build.sh"), "lib"], check=True, capture_output=True)
    ok, why = available()
    if not ok:
        raise RuntimeError(f"the native pool cannot be loaded after building it: {why}")


def _measure(nbytes: int, seconds: float) -> tuple[float, float]:
    """(median seconds per numpy buffer, median seconds per pool buffer) for one buffer size."""
    rows = np.random.default_rng(0).random((nbytes // (4 * ROW_FLOATS), ROW_FLOATS), dtype=np.float32)
    numpy_times: list[float] = []
    pool_times: list[float] = []
    with Pool(nbytes, 2, alignment=4096) as pool:
        deadline = time.perf_counter() + seconds
        while not numpy_times or time.perf_counter() < deadline:
            t0 = time.perf_counter()
            buffer = np.empty(rows.shape, np.float32)
            np.copyto(buffer, rows)
            t1 = time.perf_counter()
            del buffer  # returned before the pool's turn, as a batch buffer would be
            numpy_times.append(t1 - t0)

            t0 = time.perf_counter()
            with pool.borrow() as block:
                np.copyto(block.array(np.float32, rows.shape), rows)
            pool_times.append(time.perf_counter() - t0)
    return statistics.median(numpy_times), statistics.median(pool_times)


def bench_mempool(repo: Path, seconds: float) -> dict[str, float]:
    """``repo`` is unused (the signature every bench shares); ``seconds`` is split over the sizes."""
    del repo
    ensure_library()
    results: dict[str, float] = {}
    for name, nbytes in SIZES.items():
        numpy_s, pool_s = _measure(nbytes, seconds / len(SIZES))
        speedup = numpy_s / pool_s
        print(
            f"batch buffer {nbytes >> 20} MiB, get + fill: pool block {pool_s * 1e3:.3f} ms, "
            f"fresh np.empty {numpy_s * 1e3:.3f} ms (baseline): {speedup:.2f}x"
        )
        results[f"mempool_speedup_{name}"] = round(speedup, 3)
        results[f"mempool_pool_ms_{name}"] = round(pool_s * 1e3, 4)
        results[f"mempool_numpy_ms_{name}"] = round(numpy_s * 1e3, 4)
    return results


if __name__ == "__main__":
    print(bench_mempool(ROOT, 3.0))
