"""The reconciler's work queue: which models to reconcile next (pure; the reconciler drains it).

Invariants:
- A model is queued at most once (adding a queued model again changes nothing): a burst of changes to one
  model costs one reconcile of it, however many events it took.
- Models come out in the order they were first queued (FIFO), ``take(n)`` at most ``n`` at a time.
- ``add_after(model, at)`` queues it once ``due(now)`` is called at or after ``at`` (the retry of a failed
  action, rate-limited by its backoff); every time asked for is kept (a later retry is not lost to an
  earlier one), and a model queued meanwhile keeps its place (it is taken once, not twice).
- ``add_first`` puts models at the front (the ones waiting for room, when room frees).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

__all__ = ["WorkQueue"]


class WorkQueue:
    def __init__(self) -> None:
        self._queued: dict[str, None] = {}  # insertion-ordered set
        self._heap: list[tuple[float, str]] = []  # (at, model)

    def __len__(self) -> int:
        return len(self._queued)

    def __contains__(self, model: object) -> bool:
        return model in self._queued

    def add(self, model: str) -> None:
        self._queued.setdefault(model, None)

    def add_all(self, models: Iterable[str]) -> None:
        for model in models:
            self._queued.setdefault(model, None)

    def add_first(self, models: Iterable[str]) -> None:
        ahead = dict.fromkeys(models)
        if ahead:
            self._queued = {**ahead, **{m: None for m in self._queued if m not in ahead}}

    def add_after(self, model: str, at: float) -> None:
        heapq.heappush(self._heap, (at, model))

    def due(self, now: float) -> int:
        """Queue every model whose time has come; returns how many times came."""
        moved = 0
        while self._heap and self._heap[0][0] <= now:
            _at, model = heapq.heappop(self._heap)
            self._queued.setdefault(model, None)
            moved += 1
        return moved

    def next_due(self) -> float | None:
        """When the earliest pending model is due (None: none pending)."""
        return self._heap[0][0] if self._heap else None

    def take(self, n: int) -> list[str]:
        out: list[str] = []
        for model in self._queued:
            if len(out) == n:
                break
            out.append(model)
        for model in out:
            del self._queued[model]
        return out

    def clear(self) -> None:
        self._queued.clear()
        self._heap.clear()
