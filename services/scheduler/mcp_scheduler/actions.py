"""What a plan says (pure): the actions the planner emits, the actions in flight it must assume, and the
per-model status it reports. The planner (``plan``) builds them; the reconciler executes and tracks them.

Invariants:
- A ``ReplicaAction`` names one replica (``key``: model, version, worker); the executor runs at most one
  action per key at a time, and ``InFlightActions`` holds at most one kind per key.
- Every ``ReplicaAction`` class has exactly one ``InFlight`` kind (``kind_of``): what the planner must assume
  of a replica while that action is under way (a load counts as a copy, an unload or forget as gone).
- ``InFlightActions`` keeps its two indexes (by (model, version), by worker) equal to its keys: a plan of a
  few models reads only the actions that concern them.
- Actions and statuses are frozen values: equal inputs give equal plans.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from mcp_scheduler.view import ReplicaKey, TrafficDoc

__all__ = [
    "Action",
    "ForgetReplica",
    "InFlight",
    "InFlightActions",
    "LoadReplica",
    "ModelStatus",
    "PauseReplica",
    "Plan",
    "PublishRouting",
    "ReplicaAction",
    "RollbackCanary",
    "StartReplica",
    "UnloadReplica",
    "kind_of",
]


@dataclass(frozen=True)
class ReplicaAction:
    """An action on one replica; the executor runs at most one at a time per ``key``."""

    model: str
    version: str
    worker: str

    @property
    def key(self) -> ReplicaKey:
        return (self.model, self.version, self.worker)


@dataclass(frozen=True)
class LoadReplica(ReplicaAction):
    reason: str = ""


@dataclass(frozen=True)
class StartReplica(ReplicaAction):
    """READY or PAUSED -> RUNNING (the worker's Resume)."""


@dataclass(frozen=True)
class PauseReplica(ReplicaAction):
    pass


@dataclass(frozen=True)
class UnloadReplica(ReplicaAction):
    reason: str = ""


@dataclass(frozen=True)
class ForgetReplica(ReplicaAction):
    """Mark the record ERROR if possible, then delete it at ``revision``."""

    revision: int
    reason: str = ""


@dataclass(frozen=True)
class PublishRouting:
    """Write ``/mcp/models/<m>/routing`` (None: delete it)."""

    model: str
    routing: TrafficDoc | None


@dataclass(frozen=True)
class RollbackCanary:
    """Write ``/mcp/models/<m>/traffic`` without its canary (only if unchanged since the view)."""

    model: str
    traffic: TrafficDoc  # the wanted traffic with the canary removed: stable only
    reason: str = ""


Action = ReplicaAction | PublishRouting | RollbackCanary

#: The kind of an action in flight on a replica (``kind_of``): what the planner must assume of it.
InFlight = Literal["load", "start", "pause", "unload", "forget"]
_KINDS: dict[type, InFlight] = {
    LoadReplica: "load",
    StartReplica: "start",
    PauseReplica: "pause",
    UnloadReplica: "unload",
    ForgetReplica: "forget",
}


def kind_of(action: ReplicaAction) -> InFlight:
    return _KINDS[type(action)]


class InFlightActions(Mapping[ReplicaKey, InFlight]):
    """Replica actions under way by key, indexed by (model, version) and by worker, so a plan of a few
    models reads what concerns them, not every action in flight (the reconciler keeps one up to date)."""

    def __init__(self, items: Mapping[ReplicaKey, InFlight] | None = None) -> None:
        self._kinds: dict[ReplicaKey, InFlight] = {}
        self._by_mv: dict[tuple[str, str], dict[str, InFlight]] = {}
        self._by_worker: dict[str, dict[ReplicaKey, InFlight]] = {}
        for key, kind in (items or {}).items():
            self.set(key, kind)

    def __getitem__(self, key: ReplicaKey) -> InFlight:
        return self._kinds[key]

    def __contains__(self, key: object) -> bool:
        return key in self._kinds

    def __iter__(self) -> Iterator[ReplicaKey]:
        return iter(self._kinds)

    def __len__(self) -> int:
        return len(self._kinds)

    def set(self, key: ReplicaKey, kind: InFlight) -> None:
        self._kinds[key] = kind
        self._by_mv.setdefault(key[:2], {})[key[2]] = kind  # type: ignore[index]
        self._by_worker.setdefault(key[2], {})[key] = kind

    def discard(self, key: ReplicaKey) -> None:
        if self._kinds.pop(key, None) is None:
            return
        for index, sub, item in ((self._by_mv, key[:2], key[2]), (self._by_worker, key[2], key)):
            entries = index[sub]  # type: ignore[index]
            del entries[item]  # type: ignore[arg-type]
            if not entries:
                del index[sub]  # type: ignore[arg-type]

    def of(self, model: str, version: str) -> Mapping[str, InFlight]:
        """Workers with an action in flight on ``model``/``version``, and its kind."""
        return self._by_mv.get((model, version), {})

    def on(self, worker: str) -> Mapping[ReplicaKey, InFlight]:
        return self._by_worker.get(worker, {})


@dataclass(frozen=True)
class ModelStatus:
    model: str
    versions: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # version -> (running, required)
    pending: str = ""
    error: str = ""
    error_code: str = ""  # "" or a status code name, e.g. "RESOURCE_EXHAUSTED"


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    status: Mapping[str, ModelStatus]
    deferred: tuple[str, ...] = ()  # models not planned: the placement budget ran out before them
