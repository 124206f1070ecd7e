"""The breaker level controller: from the routers' windowed error counts to ``/mcp/breakers/<m>`` levels
(DESIGN.md section 8, policy in ``mcpcore.breaker``).

Pure: no I/O and no clock of its own; every call takes ``now`` (unix seconds). The health service sums the
routers' ``/mcp/stats/<router>/<m>`` windows with ``error_rate``, calls ``BreakerController.decide`` with the
breaker doc in force for the model (the one a ``Decision`` just wrote, once written), and writes each
``Decision.doc``.

Invariants:
- Only server-side error classes (timeout, resource, backend, unavailable) count; client errors (bad input,
  unknown model) never raise a level.
- With fewer than ``policy.min_requests`` requests in the window nothing changes, the step-down timer
  included: too little evidence either way.
- Up: at once, to the highest level whose threshold the rate reaches, several levels in one step if need be.
- Down: one level at a time, only once the rate has stayed below the current level's threshold for
  ``cool_down_s`` continuously. The timer restarts whenever the rate reaches that threshold again, and each
  step down starts a new one, so two steps down are at least ``cool_down_s`` apart.
- An operator's doc (``set_by`` other than ``"health"``, including hand-written docs with no ``set_by``)
  wins: no decision while it is in force. With an ``until`` it holds until then; afterwards evaluation
  starts afresh from the level in force (0: ``BreakerDoc.level_at``). Without an ``until`` it is a permanent
  override: the health service never undoes an operator who set no expiry; the operator hands control back
  by deleting the doc or writing one with an ``until``.
- ``current`` is the truth: when it disagrees with the controller's memory (a restart, another health
  instance, a deleted doc), the controller takes the level in force from it and restarts its timer.
- Decisions are docs with ``set_by="health"``, ``since=now``, ``until=None`` and a level the policy knows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mcpcore.errors import SERVER_SIDE_CLASSES, InvalidArgument
from mcpcore.records.breaker import BreakerDoc, BreakerPolicy, format_duration

__all__ = ["HEALTH", "BreakerController", "Decision", "error_rate"]

#: ``set_by`` of the docs this controller writes; any other value is an operator's.
HEALTH = "health"
_ERROR_CLASSES = tuple(sorted(SERVER_SIDE_CLASSES))  # a fixed order keeps float sums deterministic


def _count(window: Mapping[str, int | float], key: str, index: int) -> float:
    value = window.get(key, 0)
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise InvalidArgument(f"stats[{index}].{key}: must be a count >= 0, got {value!r}")
    return value


def error_rate(counts: Iterable[Mapping[str, int | float]]) -> tuple[float, int]:
    """``(rate, requests)`` over every router's window for one model: server-side errors / requests.

    Client errors are ignored. No requests gives ``(0.0, 0)``; the rate is capped at 1.
    """
    requests = errors = 0.0
    for index, window in enumerate(counts):
        requests += _count(window, "requests", index)
        errors += sum(_count(window, name, index) for name in _ERROR_CLASSES)
    if requests <= 0:
        return 0.0, 0
    return min(1.0, errors / requests), int(requests)


@dataclass(frozen=True)
class Decision:
    """Write ``doc`` to ``/mcp/breakers/<model>``: the level moves from ``previous`` to ``level``."""

    model: str
    level: int
    previous: int
    reason: str
    doc: BreakerDoc


@dataclass
class _ModelState:
    model: str
    level: int  # the level in force, as last seen or decided
    below_since: float | None = None  # since when the rate has been below ``level``'s threshold


def _operator_holds(current: BreakerDoc | None, now: float) -> bool:
    if current is None or current.set_by == HEALTH:
        return False
    return current.until is None or current.until > now


def _format_rate(rate: float, policy: BreakerPolicy) -> str:
    """``rate`` to two decimals, or more where two would put it on the wrong side of a threshold."""
    for digits in range(2, 8):
        text = f"{rate:.{digits}f}"
        if policy.target(float(text)) == policy.target(rate):
            return text
    return repr(rate)


class BreakerController:
    """Per-model breaker levels under one policy; assigning ``policy`` keeps the timers running."""

    def __init__(self, policy: BreakerPolicy) -> None:
        self.policy = policy
        self._states: dict[str, _ModelState] = {}

    def forget(self, model: str) -> None:
        """Drop ``model``'s memory (the model was removed); a later ``decide`` starts afresh."""
        self._states.pop(model, None)

    def decide(
        self, model: str, rate: float, requests: int, now: float, current: BreakerDoc | None
    ) -> Decision | None:
        """The change to write for ``model`` given its error ``rate`` over ``requests`` in the window, or
        ``None`` when the level in force should stay. ``current``: the breaker doc in force, if any."""
        if not 0 <= rate <= 1:
            raise ValueError(f"error rate must be in [0, 1], got {rate!r}")
        if _operator_holds(current, now):
            self._states.pop(model, None)  # evaluation starts afresh when the override ends
            return None
        in_force = 0 if current is None else current.level_at(now)
        state = self._states.get(model)
        if state is None or state.level != in_force:
            state = self._states[model] = _ModelState(model, in_force)
        if requests < self.policy.min_requests:
            return None
        target = self.policy.target(rate)
        if target > state.level:
            return self._step_up(state, target, rate, requests, now)
        return self._step_down(state, rate, now)

    def _step_up(self, state: _ModelState, target: int, rate: float, requests: int, now: float) -> Decision:
        threshold = self.policy.threshold(target)
        reason = (
            f"error rate {_format_rate(rate, self.policy)} >= {threshold:g} "
            f"over {format_duration(self.policy.metrics_window_s)} ({requests} requests)"
        )
        return self._move(state, target, reason, rate, now)

    def _step_down(self, state: _ModelState, rate: float, now: float) -> Decision | None:
        if state.level == 0:
            return None
        threshold = self.policy.threshold(state.level)
        if rate >= threshold:
            state.below_since = None
            return None
        if state.below_since is None:
            state.below_since = now
        if now - state.below_since < self.policy.cool_down_s:
            return None
        reason = (
            f"error rate {_format_rate(rate, self.policy)} < {threshold:g} "
            f"for {format_duration(self.policy.cool_down_s)}: stepping down"
        )
        return self._move(state, state.level - 1, reason, rate, now)

    def _move(self, state: _ModelState, level: int, reason: str, rate: float, now: float) -> Decision:
        previous, state.level = state.level, level
        # After a step the next step down needs a full cool-down of its own, starting now.
        state.below_since = now if level and rate < self.policy.threshold(level) else None
        doc = BreakerDoc(level=level, reason=reason, since=now, set_by=HEALTH, until=None)
        return Decision(model=state.model, level=level, previous=previous, reason=reason, doc=doc)
