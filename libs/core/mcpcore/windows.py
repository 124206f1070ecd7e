"""Windowed request counts for the breakers, and the loop that publishes them to etcd.

Both producers of ``/mcp/stats/<source>/<m>`` use these: every router for the requests it forwarded, and
every worker for the requests clients sent it directly (the SDK's direct path, ``FLAG_DIRECT``), so the
health service's breakers see every failure whichever way a request came.

Invariants:
- Recording is O(1) and does no I/O: counts go into per-second buckets per model and error class.
- A window doc is a ``mcpcore.records.StatsDoc``: ``{"requests": n, "timeout": n, "resource": n,
  "backend": n, "unavailable": n, "client": n, "window_s": s, "at": unix seconds, <source field>: id}``
  (what ``mcp_health.levels`` reads); only models with requests in the window are written. ``extra``
  documents come encoded by their own records.
- ``WindowPublisher`` writes every interval under its own lease (gone with the process), and never dies:
  etcd away costs a warning and a counted loop error, and a new lease next time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Mapping

from mcpcore.errors import MCPError
from mcpcore.records import StatsDoc
from mcpcore.records.demand import CLASSES
from mcpcore.store import Store

__all__ = ["CLASSES", "WindowPublisher", "Windows"]

log = logging.getLogger(__name__)


class Windows:
    """Counts per model and second, kept for ``window_s``."""

    def __init__(self, *, window_s: float = 30.0, clock: Callable[[], float] = time.time) -> None:
        self.window_s = window_s
        self._clock = clock
        self._buckets: dict[str, dict[int, list[int]]] = defaultdict(dict)  # model -> second -> counts

    def record(self, model: str, error: str | None) -> None:
        second = int(self._clock())
        bucket = self._buckets[model].get(second)
        if bucket is None:
            bucket = self._buckets[model][second] = [0] * (1 + len(CLASSES))
        bucket[0] += 1
        if error is not None:
            bucket[1 + CLASSES.index(error) if error in CLASSES else 3] += 1

    def window(self, model: str) -> dict[str, int]:
        """Counts over the last window: ``{"requests": n, "timeout": n, ...}``; drops older buckets."""
        oldest = int(self._clock()) - math.ceil(self.window_s)
        buckets = self._buckets.get(model, {})
        for second in [s for s in buckets if s < oldest]:
            del buckets[second]
        totals = [sum(col) for col in zip(*buckets.values(), strict=False)] or [0] * (1 + len(CLASSES))
        return {"requests": totals[0], **{c: totals[1 + i] for i, c in enumerate(CLASSES)}}

    def models(self) -> list[str]:
        return [m for m, b in self._buckets.items() if b]


class WindowPublisher:
    """Every ``interval_s``: each model's window to ``key_of(model)``, plus whatever ``extra(now)`` returns
    (key -> an encoded record stamped ``now``), all under one lease of ``ttl`` seconds."""

    def __init__(
        self,
        store: Store,
        windows: Windows,
        *,
        key_of: Callable[[str], str],
        source: Mapping[str, str],
        extra: Callable[[float], Mapping[str, bytes]] = lambda now: {},
        ttl: int = 10,
        interval_s: float = 1.0,
        name: str = "stats",
        on_error: Callable[[str], None] = lambda loop: None,
    ) -> None:
        self._store, self._windows, self._key_of, self._source = store, windows, key_of, dict(source)
        self._extra, self._ttl, self._interval, self._name, self._on_error = (
            extra, ttl, interval_s, name, on_error,
        )  # fmt: skip
        self._lease_id = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self._name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._lease_id:
            with contextlib.suppress(MCPError):
                await self._store.revoke_lease(self._lease_id)

    async def _run(self) -> None:
        while True:
            try:
                await self.publish_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._on_error(self._name)
                self._lease_id = 0  # maybe expired while etcd was away: take a new one next time
                log.warning("could not publish %s (%s); serving goes on", self._name, exc)
            await asyncio.sleep(self._interval)  # a period, not a synchronisation

    async def publish_once(self) -> None:
        if not self._lease_id:
            self._lease_id = (await self._store.grant_lease(self._ttl)).id
        else:
            await self._store.refresh_lease(self._lease_id)
        now = time.time()
        for model in self._windows.models():
            counts = self._windows.window(model)
            doc = StatsDoc(
                requests=counts.pop("requests"),
                counts=counts,
                window_s=self._windows.window_s,
                at=now,
                source=self._source,
            )
            await self._store.put(self._key_of(model), doc.to_json(), lease=self._lease_id)
        for key, raw in self._extra(now).items():
            await self._store.put(key, raw, lease=self._lease_id)
