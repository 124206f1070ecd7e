"""Copies by demand (pure): add one when routers report bounded-load overflow, drop one after a quiet
period; between the spec's ``min_replicas`` and ``max_replicas`` (0: ``replicas``), starting at ``replicas``.

Rule: each new overflow report (a router's report with ``overflow > 0`` whose ``at`` differs from the last one
seen from that router: each router's clock is compared only with itself) adds one copy, up to the spec's
``max_replicas``; once no overflow has been reported for ``quiet_period_s``, one copy goes, then another
after the next quiet period, down to ``min_replicas``, so a model that cools down shrinks step by step,
never all at once. ``update`` returns each model's copies above (or, below 0, under) ``replicas``;
it looks only at the models it is given (the ones being reconciled), and ``timed`` names the models whose
count time alone may change (a quiet period running out), which the reconciler queues on its tick.
"""

from __future__ import annotations

from collections.abc import Iterable

from mcp_scheduler.view import ClusterView

__all__ = ["HotCopies"]


class HotCopies:
    def __init__(self, quiet_period_s: float) -> None:
        self._quiet = quiet_period_s
        self._extra: dict[str, int] = {}
        self._seen: dict[tuple[str, str], float] = {}  # (model, router) -> its last overflow report
        self._changed: dict[str, float] = {}  # model -> when its extra count last changed
        self._floor: dict[str, int] = {}  # model -> its lowest extra count (min_replicas - replicas)

    def update(self, view: ClusterView, models: Iterable[str] | None = None) -> dict[str, int]:
        """Bring ``models`` (default: every spec) up to date with ``view``; every model's count."""
        for model in view.specs if models is None else models:
            spec = view.specs.get(model)
            if spec is None:
                self._forget(model)
                continue
            room = max(0, spec.max_replicas - spec.replicas)
            floor = spec.min_replicas - spec.replicas if 0 < spec.min_replicas < spec.replicas else 0
            extra = max(floor, min(self._extra.get(model, 0), room))
            reports = view.demand.get(model, ())
            fresh = [d for d in reports if d.overflow > 0 and self._seen.get((model, d.router)) != d.at]
            for d in fresh:
                self._seen[(model, d.router)] = d.at
            if fresh:
                if extra < room:
                    extra += 1
                    self._changed[model] = view.now
            elif extra > floor and view.now - self._changed.setdefault(model, view.now) >= self._quiet:
                extra -= 1
                self._changed[model] = view.now
            if extra or floor:
                self._extra[model], self._floor[model] = extra, floor
            else:  # nothing to remember but its routers' last reports
                self._extra.pop(model, None)
                self._floor.pop(model, None)
                self._changed.pop(model, None)
        if models is None:
            for model in [m for m in self._extra if m not in view.specs]:
                self._forget(model)
        return {m: n for m, n in self._extra.items() if n}

    def timed(self) -> list[str]:
        """Models that a quiet period running out would shrink."""
        return [m for m, n in self._extra.items() if n > self._floor.get(m, 0)]

    def _forget(self, model: str) -> None:
        self._extra.pop(model, None)
        self._floor.pop(model, None)
        self._changed.pop(model, None)
        for key in [k for k in self._seen if k[0] == model]:
            del self._seen[key]
