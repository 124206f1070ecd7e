"""Extra copies for hot models (pure): add one when routers report bounded-load overflow, drop one after a
quiet period.

Rule: each new overflow report (a newer ``Demand.at`` with ``overflow > 0``) adds one copy, up to the spec's
``max_replicas``; once no overflow has been reported for ``quiet_period_s``, one extra copy goes, then
another after the next quiet period, so a model that cools down shrinks step by step, never all at once.
"""

from __future__ import annotations

from mcp_scheduler.view import ClusterView

__all__ = ["HotCopies"]


class HotCopies:
    def __init__(self, quiet_period_s: float) -> None:
        self._quiet = quiet_period_s
        self._extra: dict[str, int] = {}
        self._seen: dict[str, float] = {}  # model -> newest overflow report acted on
        self._changed: dict[str, float] = {}  # model -> when its extra count last changed

    def update(self, view: ClusterView) -> dict[str, int]:
        for model, spec in view.specs.items():
            room = max(0, spec.max_replicas - spec.replicas)
            extra = min(self._extra.get(model, 0), room)
            newest = max((d.at for d in view.demand.get(model, ()) if d.overflow > 0), default=None)
            if newest is not None and newest > self._seen.get(model, float("-inf")):
                self._seen[model] = newest
                if extra < room:
                    extra += 1
                    self._changed[model] = view.now
            elif extra > 0 and view.now - self._changed.get(model, view.now) >= self._quiet:
                extra -= 1
                self._changed[model] = view.now
            self._extra[model] = extra
        for model in set(self._extra) - set(view.specs):
            del self._extra[model]
        return {m: n for m, n in self._extra.items() if n}
