"""One plan's working copy of the cluster (pure): the replicas as the plan changes them, and the memory
each worker uses and has reserved, so placement sees the plan's own decisions without copying the view.

Invariants:
- The ``ClusterView`` is never mutated: every change lives in these overlays and dies with the plan.
- ``PlanReplicas``: a replica taken away (``pop``: a stale or idle record) is absent; one marked (evicted:
  UNLOADING) reads as marked; one with an unload or forget in flight reads as UNLOADING. Either way it is
  gone for planning: never a copy, never the other copy that makes an eviction safe.
- ``Used``: the view's recorded bytes per worker, less the records this plan took away (an UNLOADING mark
  frees nothing: the memory is held until the unload finishes).
- ``Reserved``: per worker, the bytes of loads in flight that have no record yet, plus what the plan adds
  as it places (or waits for) copies; every worker reads as a number (0 if none).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace

from mcp_scheduler.actions import InFlight, InFlightActions
from mcp_scheduler.placement import replica_bytes
from mcp_scheduler.view import ClusterView, ReplicaInfo, ReplicaKey
from mcpcore.lifecycle import ReplicaState

__all__ = ["HEALTHY", "PlanReplicas", "Reserved", "Used"]

S = ReplicaState
#: Replicas that hold (or are getting) their memory and count as copies.
HEALTHY = frozenset({S.LOADING, S.READY, S.RUNNING, S.PAUSED})


class PlanReplicas(Mapping[ReplicaKey, ReplicaInfo]):
    """The view's replicas as this plan changes them (taken away, or marked UNLOADING), without a copy;
    one with an unload (or forget) in flight reads as UNLOADING."""

    def __init__(
        self, base: Mapping[ReplicaKey, ReplicaInfo], in_flight: Mapping[ReplicaKey, InFlight]
    ) -> None:
        self._base = base
        self._in_flight = in_flight
        self._changed: dict[ReplicaKey, ReplicaInfo] = {}
        self._gone: set[ReplicaKey] = set()

    def __getitem__(self, key: ReplicaKey) -> ReplicaInfo:
        if key in self._gone:
            raise KeyError(key)
        changed = self._changed.get(key)
        if changed is not None:
            return changed
        r = self._base[key]
        if r.state in HEALTHY and self._in_flight.get(key) in ("unload", "forget"):
            r = self._changed[key] = replace(r, state=S.UNLOADING)
        return r

    def __contains__(self, key: object) -> bool:
        return key not in self._gone and (key in self._changed or key in self._base)

    def __iter__(self) -> Iterator[ReplicaKey]:
        return (k for k in self._base if k not in self._gone)

    def __len__(self) -> int:
        return len(self._base) - len(self._gone & self._base.keys())

    def __setitem__(self, key: ReplicaKey, value: ReplicaInfo) -> None:
        self._changed[key] = value

    def pop(self, key: ReplicaKey, default: None = None) -> ReplicaInfo | None:
        value = self.get(key, default)
        self._gone.add(key)
        return value


class Reserved(Mapping[str, int]):
    """Memory held for copies not yet recorded, per worker: loads in flight (their bytes), then what
    this plan places or waits for (added as it goes). Every worker reads as a number (0 if none)."""

    def __init__(
        self, view: ClusterView, in_flight: InFlightActions, need_bytes: Callable[[str, str], int]
    ) -> None:
        self._view = view
        self._in_flight = in_flight
        self._need_bytes = need_bytes
        self._held: dict[str, int] = {}

    def __getitem__(self, worker: str) -> int:
        held = self._held.get(worker)
        if held is None:
            held = 0
            if worker in self._view.workers:
                for (m, v, w), kind in self._in_flight.on(worker).items():
                    if kind == "load" and (m, v, w) not in self._view.replicas:
                        held += self._need_bytes(m, v)
            self._held[worker] = held
        return held

    def __setitem__(self, worker: str, held: int) -> None:
        self._held[worker] = held

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)


class Used(dict[str, int]):
    """Memory held by recorded replicas per worker, as this plan sees them: the view's (cached across
    plans by the state) less the stale records this plan took away (UNLOADING marks change nothing)."""

    def __init__(self, view: ClusterView, gone: Mapping[str, list[ReplicaInfo]]) -> None:
        super().__init__()
        self._view = view
        self._gone = gone

    def __missing__(self, worker: str) -> int:
        used = self._view.used_bytes(worker)
        used -= sum(replica_bytes(self._view, r) for r in self._gone.get(worker, ()))
        self[worker] = used
        return used
