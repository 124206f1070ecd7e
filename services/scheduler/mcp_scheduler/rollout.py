"""Version rollout (pure): which traffic a model is planned with, which routing it publishes, and the
status that says why a version is not routed yet (DESIGN.md 6 and 7).

Invariants:
- Safe flips: a routing names a version only once it is RUNNING on ``max(1, required)`` replicas; until
  then the routing in force stays (``PublishRouting`` only when the routing changes) and
  ``ModelStatus.pending`` says which versions are short, and by how many copies.
- A wanted canary (``canary_percent > 0``) of a model whose breaker level is above 0 is rolled back:
  ``RollbackCanary`` rewrites the wanted traffic to its stable version alone, and the plan goes on with
  that traffic, so routing follows by the usual safe flip. Written again while the breaker stays above 0,
  it is rolled back again.
- A model with placement errors reports ``RESOURCE_EXHAUSTED``; waits (room being freed, an old record being
  cleared) are pending, not errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mcp_scheduler.actions import ModelStatus, PublishRouting, RollbackCanary
from mcp_scheduler.view import ClusterView, ModelSpecDoc, TrafficDoc

__all__ = ["route", "without_canary"]


def without_canary(
    view: ClusterView, model: str, wanted: TrafficDoc
) -> tuple[TrafficDoc, RollbackCanary | None]:
    """The wanted traffic without its canary while the model's breaker is above 0 (else as is), and the
    rollback to write when it was cut."""
    level = view.breakers.get(model, 0)
    if level <= 0 or wanted.canary is None or wanted.canary_percent <= 0:
        return wanted, None
    stable = TrafficDoc(stable=wanted.stable)
    reason = (
        f"breaker of {model} at level {level}: canary version {wanted.canary} "
        f"({wanted.canary_percent}%) rolled back to stable version {wanted.stable}"
    )
    return stable, RollbackCanary(model, stable, reason)


def route(
    spec: ModelSpecDoc,
    *,
    wanted: TrafficDoc,
    current: TrafficDoc | None,
    running: Mapping[str, int],
    required: Mapping[str, int],
    errors: Sequence[str],
    waiting: Sequence[str],
) -> tuple[PublishRouting | None, ModelStatus]:
    """The routing to publish (None: the one in force stays) and the model's status, given the RUNNING
    copies of each required version."""
    m = spec.model
    short = [v for v in wanted.versions if running.get(v, 0) < max(1, required.get(v, 0))]
    routing = current if short else wanted
    publish = PublishRouting(m, routing) if routing != current else None
    pending = ""
    if short:
        pending = _pending(
            spec, wanted=wanted, current=current, short=short, running=running, required=required
        )
    if waiting:
        pending = "; ".join([*([pending] if pending else []), *waiting])
    status = ModelStatus(
        model=m,
        versions={v: (running[v], required[v]) for v in sorted(required, key=int)},
        pending=pending,
        error="; ".join(errors),
        error_code="RESOURCE_EXHAUSTED" if errors else "",
    )
    return publish, status


def _pending(
    spec: ModelSpecDoc,
    *,
    wanted: TrafficDoc,
    current: TrafficDoc | None,
    short: list[str],
    running: Mapping[str, int],
    required: Mapping[str, int],
) -> str:
    if spec.load_on_demand and all(required.get(v, 0) == 0 for v in short):
        return "not loaded: loads on demand, when a request asks for it"

    def on(v: str) -> str:
        paused = " (paused)" if v in spec.paused_versions else ""
        return f"{running.get(v, 0)}/{max(1, required.get(v, 0))} replicas{paused}"

    if current is None:
        return "loading " + ", ".join(f"version {v} on {on(v)}" for v in short)
    if current == wanted:
        return "degraded: " + ", ".join(f"version {v} RUNNING on {on(v)}" for v in short)
    return "pending: " + ", ".join(f"version {v} loading on {on(v)}" for v in short)
