"""Batch assembly in native pool blocks: same results as numpy, blocks returned, numpy when it must."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from mcp_worker.batching import BatchConfig, Dispatcher, ModelShare
from mcp_worker.batching.buffers import BatchBuffers

MiB = 1 << 20
pytestmark = pytest.mark.usefixtures("built_library")


def test_large_buffers_come_from_the_pool_and_go_back():
    buffers = BatchBuffers(blocks_per_class=1)
    with buffers.take(3 * MiB) as lease:
        assert lease.buffer.nbytes == 3 * MiB and buffers.pool_hits == 1
        lease.buffer[:] = 7
        with buffers.take(3 * MiB) as second:  # the 4 MiB class has one block, on loan: numpy
            assert buffers.fallbacks == 1 and not np.shares_memory(second.buffer, lease.buffer)
    with buffers.take(3 * MiB):  # returned: the pool again
        assert buffers.pool_hits == 2
    with buffers.take(1024):  # small: numpy is faster there
        assert buffers.fallbacks == 2
    buffers.close()


def test_concatenate_equals_numpy():
    buffers = BatchBuffers()
    parts = [np.random.default_rng(i).random((n, 4096), dtype=np.float32) for i, n in enumerate((30, 50, 40))]
    out, lease = buffers.concatenate(parts)
    np.testing.assert_array_equal(out, np.concatenate(parts))
    assert buffers.pool_hits == 1
    lease.release()
    lease.release()  # idempotent
    buffers.close()


async def test_batches_assembled_in_pool_blocks_give_each_caller_its_rows():
    buffers = BatchBuffers()
    config = BatchConfig(
        max_batch_size=64,
        max_queue_delay_s=0.005,
        preferred_batch_sizes=(),
        priority_levels=1,
        default_priority_level=1,
        default_queue_timeout_s=None,
        max_queue_size=0,
    )

    def identity_and_double(inputs):  # one output views its input: it must survive the block's release
        return {"SAME": inputs["X"], "DOUBLE": inputs["X"] * 2}

    dispatcher = Dispatcher(slots=1, buffers=buffers)
    queue = dispatcher.add_model("m/1", config, identity_and_double, ModelShare(1, 0.5))
    rows = [np.full((1, 8192), i, np.float32) for i in range(64)]  # 32 KiB each: batches of > 1 MiB
    answers = [asyncio.get_running_loop().create_future() for _ in rows]
    for i, (x, answer) in enumerate(zip(rows, answers, strict=True)):
        queue.enqueue(f"r{i}", {"X": x}, answer.set_result)
    results = await asyncio.gather(*answers)
    assert queue.stats().mean_batch_size > 1 and buffers.pool_hits >= 1
    for i, out in enumerate(results):
        np.testing.assert_array_equal(out["SAME"], rows[i])
        np.testing.assert_array_equal(out["DOUBLE"], rows[i] * 2)
    await dispatcher.close()
    buffers.close()
