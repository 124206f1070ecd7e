"""Weighted sharing of one worker's compute between the models it serves (DESIGN §6, §11 item 2).

``calculate_weights`` is the article's rule: a model's base weight is its priority over the sum of
priorities, and under load a latency-sensitive model's weight shrinks as ``bw * (1 - load_factor *
sensitivity)`` with ``load_factor = min(1, system_load / 0.8)`` (80% load is the article's knee). As written
in the article it has two defects, fixed here:

- It divides by zero when every model is fully latency-sensitive (sensitivity 1) at load >= 0.8: every
  adjusted weight is 0. That case reduces every model by the same factor, so the shares it tends to are the
  base weights; we return those. Priorities that sum to zero (the default priority is 0) divided by zero
  too: priorities <= 0 count as ``PRIORITY_FLOOR`` (less than any positive priority), so an all-zero set
  gets equal shares; priorities above ``PRIORITY_CAP`` count as the cap.
- A weight can reach zero (sensitivity 1 at high load, or a tiny priority next to a huge one), and a
  model with a zero share is never served. Every weight is mixed with the equal share:
  ``w = (1 - min_share) * w + min_share / n``, so each model keeps at least ``min_share`` of an equal share
  (5% by default), the order between models is kept and the weights still sum to 1.

Invariants: for any input (NaN or negative load, sensitivities outside 0..1, any priorities) the result
has one finite weight > 0 per model and sums to 1; ``[]`` gives ``[]``. Nothing here does I/O.

``StrideScheduler`` turns weights into picks: stride scheduling (Waldspurger 1995), so that a model that
stays ready is picked in proportion to its weight, and one that comes back after being idle restarts at
the current minimum pass instead of cashing in the credit it "saved" while idle.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "CRITICAL_LOAD",
    "MIN_SHARE",
    "PRIORITY_CAP",
    "PRIORITY_FLOOR",
    "ModelShare",
    "StrideScheduler",
    "calculate_weights",
]

#: The load at which latency-sensitive models are reduced the most (the article's 80%).
CRITICAL_LOAD = 0.8
#: Each model's weight is at least this fraction of an equal share (1/n).
MIN_SHARE = 0.05
#: What a priority <= 0 counts as: below every positive (integer) priority, but never zero.
PRIORITY_FLOOR = 0.5
#: Priorities above this count as this, so that no sum of them overflows.
PRIORITY_CAP = 1e12


@dataclass(frozen=True)
class ModelShare:
    """What a model's share depends on: ``ModelConfig.priority`` and ``qos.latency_sensitivity``."""

    priority: int
    latency_sensitivity: float


def _clamp(x: float, lo: float, hi: float, nan: float) -> float:
    return nan if math.isnan(x) else min(hi, max(lo, x))


def _priority(p: float) -> float:
    try:
        x = float(p)
    except OverflowError:  # an int beyond float range
        x = math.inf if p > 0 else -math.inf
    if math.isnan(x) or x <= PRIORITY_FLOOR:
        return PRIORITY_FLOOR
    return min(x, PRIORITY_CAP)


def calculate_weights(
    models: Sequence[ModelShare], system_load: float, *, min_share: float = MIN_SHARE
) -> list[float]:
    """Each model's share of the worker (same order as ``models``): all > 0, summing to 1.

    ``system_load`` is 0..1 (NaN counts as 0, values outside are clamped); ``min_share`` (0..1) is the
    floor as a fraction of an equal share.
    """
    n = len(models)
    if n == 0:
        return []
    load_factor = min(1.0, _clamp(system_load, 0.0, 1.0, 0.0) / CRITICAL_LOAD)
    priorities = [_priority(m.priority) for m in models]
    total_priority = sum(priorities)
    base = [p / total_priority for p in priorities]
    adjusted = [
        bw * (1.0 - load_factor * _clamp(m.latency_sensitivity, 0.0, 1.0, 0.0))
        for bw, m in zip(base, models, strict=True)
    ]
    total = sum(adjusted)
    shares = [a / total for a in adjusted] if total > 0 else base  # all reduced alike: the base shares
    floor = _clamp(min_share, 0.0, 1.0, MIN_SHARE)
    mixed = [(1.0 - floor) * s + floor / n for s in shares]
    total = sum(mixed)
    return [w / total for w in mixed]


class StrideScheduler:
    """Picks one of several ready models, each in proportion to its weight over many picks.

    Each model has a *pass*; a pick takes the ready model with the smallest pass (ties: the order of
    ``ready``) and advances it by its stride ``1 / weight``. A model that was not ready at the previous pick
    (new, or idle since) restarts at ``max(its pass, the last picked pass)``: it gets its turn soon, but no
    burst for the time it was away. Not thread-safe; one dispatcher owns it.
    """

    #: Weights at or below this (or missing) count as this: the model still gets a (rare) turn.
    MIN_WEIGHT = 1e-6
    _REBASE_AT = 1e9  # keep passes small so float resolution never merges them

    def __init__(self) -> None:
        self._pass: dict[str, float] = {}
        self._last_ready: frozenset[str] = frozenset()
        self._vtime = 0.0  # the pass of the last pick: the minimum among the models ready then

    def pick(self, ready: Sequence[str], weights: Mapping[str, float]) -> str:
        """The model to serve next among ``ready`` (not empty)."""
        if not ready:
            raise ValueError("pick needs at least one ready model")
        for name in ready:
            if name not in self._last_ready:
                self._pass[name] = max(self._pass.get(name, self._vtime), self._vtime)
        self._last_ready = frozenset(ready)
        chosen = min(ready, key=self._pass.__getitem__)  # min() keeps the first of equal passes
        self._vtime = self._pass[chosen]
        weight = weights.get(chosen, 0.0)
        if not weight > self.MIN_WEIGHT:  # also catches NaN
            weight = self.MIN_WEIGHT
        self._pass[chosen] += 1.0 / weight
        if self._vtime > self._REBASE_AT:
            self._rebase()
        return chosen

    def forget(self, name: str) -> None:
        """Drop a model that is gone for good (unloaded)."""
        self._pass.pop(name, None)
        self._last_ready = self._last_ready - {name}

    def _rebase(self) -> None:
        shift = self._vtime
        self._pass = {name: max(0.0, p - shift) for name, p in self._pass.items()}
        self._vtime = 0.0
