"""Extra copies for hot models (pure): add one when routers report bounded-load overflow, drop one after a
quiet period.

Rule: each new overflow report (a router's report with ``overflow > 0`` whose ``at`` differs from the last one
seen from that router: each router's clock is compared only with itself) adds one copy, up to the spec's
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
        self._seen: dict[tuple[str, str], float] = {}  # (model, router) -> its last overflow report
        self._changed: dict[str, float] = {}  # model -> when its extra count last changed

    def update(self, view: ClusterView) -> dict[str, int]:
        for model, spec in view.specs.items():
            room = max(0, spec.max_replicas - spec.replicas)
            extra = min(self._extra.get(model, 0), room)
            reports = view.demand.get(model, ())
            fresh = [d for d in reports if d.overflow > 0 and self._seen.get((model, d.router)) != d.at]
            for d in fresh:
                self._seen[(model, d.router)] = d.at
            if fresh:
                if extra < room:
                    extra += 1
                    self._changed[model] = view.now
            elif extra > 0 and view.now - self._changed.get(model, view.now) >= self._quiet:
                extra -= 1
                self._changed[model] = view.now
            self._extra[model] = extra
        for model in set(self._extra) - set(view.specs):
            del self._extra[model]
        for key in [k for k in self._seen if k[0] not in view.specs]:
            del self._seen[key]
        return {m: n for m, n in self._extra.items() if n}
