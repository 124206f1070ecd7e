"""Event-loop lag: how late the loop runs a timer, observed into ``mcp_event_loop_lag_seconds``.

A task sleeps ``interval_s`` and measures how much later than asked it woke up. Anything that holds the
loop (a blocking call, a long callback, too much work per iteration) shows up as lag, in every service
that runs one, so "no blocking calls on any event loop" is a measured figure, not a promise.

Invariants: the monitor costs one timer per interval; it never raises into the loop (a failing
``observe`` is logged once and the monitor goes on).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

__all__ = ["LoopLagMonitor"]

log = logging.getLogger(__name__)


class LoopLagMonitor:
    def __init__(self, observe: Callable[[float], None], *, interval_s: float = 0.025) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self._observe = observe
        self._interval = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="loop-lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        warned = False
        while True:
            asked = loop.time() + self._interval
            await asyncio.sleep(self._interval)
            try:
                self._observe(max(0.0, loop.time() - asked))
            except Exception:
                if not warned:
                    log.exception("loop lag: observe failed; the monitor goes on")
                    warned = True
