"""What the scheduler knows of the cluster: immutable values built from etcd, read by the pure planner.

Invariants:
- Nothing here does I/O. ``state.py`` builds a ``ClusterView`` from its etcd watches; ``plan.py`` turns
  a view into actions; tests build views by hand.
- Documents are parsed and validated by their ``mcpcore.records`` types (``ModelSpecDoc``, ``TrafficDoc``
  and ``Demand`` are those types); a view only ever holds valid documents (the last good one when a write was
  rejected). ``breakers`` holds the levels in force at ``now``: a forced level past its ``until`` is 0.
- Replicas are indexed by model and by worker (``by_model``, ``by_worker``: the keys, a superset of
  ``replicas``' is allowed), so ``replicas_of`` and ``replicas_on`` cost what they return, not the cluster.
  ``state.py`` keeps the indexes as it applies changes (``indexed``); any other view computes them once,
  when first read.
- A view read from ``ClusterState`` shares the state's dicts: it is consistent until the next await (the
  planner reads it without awaiting), not a copy to keep.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace

from mcpcore.lifecycle import ReplicaState
from mcpcore.records import Demand, ModelSpecDoc, TrafficDoc

__all__ = [
    "ClusterView",
    "Demand",
    "ModelSpecDoc",
    "ReplicaInfo",
    "ReplicaKey",
    "TrafficDoc",
    "WorkerInfo",
]

#: (model, version, worker)
ReplicaKey = tuple[str, str, str]


@dataclass(frozen=True)
class WorkerInfo:
    """A worker whose record is in etcd (``/mcp/workers/<id>``, lease-bound: present means alive)."""

    id: str
    grpc: str
    zmq: str
    capacity_bytes: int
    labels: Mapping[str, str] = field(default_factory=dict)
    stopped: bool = False  # emergency-stopped (load report): takes no new replicas
    draining: bool = False  # ``/mcp/drain/<id>``: takes no new replicas, its replicas move away
    last_beat: float = 0.0
    incarnation: str = ""  # the worker process now holding the id ("": a record from before incarnations)
    # memory its GPU has for this worker's models: the device's total less what other processes hold
    # (NVML, at its last load report; its own models' bytes are not subtracted, so it moves only when others'
    # use does); placement counts at most that as capacity. None: not reported (a worker without
    # place_by_gpu_memory, no NVML, an older worker)
    device_room_bytes: int | None = None


@dataclass(frozen=True)
class ReplicaInfo:
    """A replica record (``/mcp/replicas/<m>/<v>/<worker>``)."""

    model: str
    version: str
    worker: str
    state: ReplicaState
    since: float
    reason: str = ""
    revision: int = 0
    memory_bytes: int = 0  # measured by the worker (record info), 0 while unknown
    incarnation: str = ""  # the worker process that wrote it (record info)

    @property
    def key(self) -> ReplicaKey:
        return (self.model, self.version, self.worker)


@dataclass(frozen=True)
class ClusterView:
    now: float
    workers: Mapping[str, WorkerInfo] = field(default_factory=dict)
    specs: Mapping[str, ModelSpecDoc] = field(default_factory=dict)
    traffic: Mapping[str, TrafficDoc] = field(default_factory=dict)  # wanted (operator / SetTraffic)
    routing: Mapping[str, TrafficDoc] = field(default_factory=dict)  # in force (written by the planner)
    replicas: Mapping[ReplicaKey, ReplicaInfo] = field(default_factory=dict)
    demand: Mapping[str, tuple[Demand, ...]] = field(default_factory=dict)
    breakers: Mapping[str, int] = field(default_factory=dict)  # model -> breaker level in force (>= 1)

    # -- indexes (not fields: ``dataclasses.replace`` makes a view that computes its own) ------------------
    def indexed(
        self,
        by_model: Mapping[str, Collection[ReplicaKey]],
        by_worker: Mapping[str, Collection[ReplicaKey]],
        used: dict[str, int] | None = None,
    ) -> ClusterView:
        """This view with indexes kept by the caller (their keys: a superset of ``replicas``'), and a
        cache of ``used_bytes`` per worker that the caller clears for a worker whose replicas change, and
        for the workers of a model whose spec changes."""
        object.__setattr__(self, "_by_model", by_model)
        object.__setattr__(self, "_by_worker", by_worker)
        object.__setattr__(self, "_used", {} if used is None else used)
        return self

    def with_replicas(self, replicas: Mapping[ReplicaKey, ReplicaInfo]) -> ClusterView:
        """This view with ``replicas`` whose keys are among this view's: the indexes are shared (not the
        ``used_bytes`` cache: the replicas differ)."""
        return replace(self, replicas=replicas).indexed(self.by_model, self.by_worker)

    @property
    def by_model(self) -> Mapping[str, Collection[ReplicaKey]]:
        if "_by_model" not in self.__dict__:
            self._index()
        return self.__dict__["_by_model"]  # type: ignore[no-any-return]

    @property
    def by_worker(self) -> Mapping[str, Collection[ReplicaKey]]:
        if "_by_worker" not in self.__dict__:
            self._index()
        return self.__dict__["_by_worker"]  # type: ignore[no-any-return]

    def used_bytes(self, worker: str) -> int:
        """Memory the replicas recorded on ``worker`` hold: measured, else their spec's declared bytes."""
        if "_used" not in self.__dict__:
            self._index()
        cache: dict[str, int] = self.__dict__["_used"]
        held = cache.get(worker)
        if held is None:
            held = 0
            for r in self.replicas_on(worker):
                spec = self.specs.get(r.model)
                held += r.memory_bytes or (spec.memory_bytes if spec is not None else 0)
            cache[worker] = held
        return held

    def _index(self) -> None:
        by_model: dict[str, set[ReplicaKey]] = {}
        by_worker: dict[str, set[ReplicaKey]] = {}
        for key in self.replicas:
            by_model.setdefault(key[0], set()).add(key)
            by_worker.setdefault(key[2], set()).add(key)
        self.indexed(by_model, by_worker)

    def replicas_of(self, model: str, version: str | None = None) -> list[ReplicaInfo]:
        return [
            r
            for k in self.by_model.get(model, ())
            if (version is None or k[1] == version) and (r := self.replicas.get(k)) is not None
        ]

    def replicas_on(self, worker: str) -> list[ReplicaInfo]:
        return [r for k in self.by_worker.get(worker, ()) if (r := self.replicas.get(k)) is not None]

    def models(self) -> set[str]:
        """Every model the view knows of: with a spec, a replica record or a routing."""
        return {*self.specs, *(m for m, keys in self.by_model.items() if keys), *self.routing}
