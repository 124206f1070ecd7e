"""The loop-lag monitor sees a blocked event loop (a real loop, blocked on purpose)."""

from __future__ import annotations

import asyncio
import time

from mcpcore.looplag import LoopLagMonitor


class Seen:
    """Observations, and an event per observation so the test waits for them."""

    def __init__(self, fail: bool = False) -> None:
        self.values: list[float] = []
        self.event = asyncio.Event()
        self.fail = fail

    def __call__(self, lag: float) -> None:
        self.values.append(lag)
        self.event.set()
        if self.fail:
            raise RuntimeError("metrics broke")

    async def next(self) -> None:
        self.event.clear()
        await asyncio.wait_for(self.event.wait(), 5)


def block(seconds: float) -> None:
    time.sleep(seconds)  # the fault: a blocking call on the loop


async def test_a_blocking_call_shows_as_lag() -> None:
    seen = Seen()
    monitor = LoopLagMonitor(seen, interval_s=0.005)
    monitor.start()
    await seen.next()
    block(0.05)
    await seen.next()
    await monitor.stop()
    assert max(seen.values) >= 0.04  # at least the time the loop was held (a lower bound, not a threshold)


async def test_a_failing_observer_does_not_stop_it() -> None:
    seen = Seen(fail=True)
    monitor = LoopLagMonitor(seen, interval_s=0.001)
    monitor.start()
    for _ in range(3):
        await seen.next()
    await monitor.stop()
    assert len(seen.values) >= 3
