"""What the scheduler knows of the cluster: immutable values built from etcd, read by the pure planner.

Invariants:
- Nothing here does I/O. ``state.py`` builds a ``ClusterView`` from its etcd watches; ``plan.py`` turns
  a view into actions; tests build views by hand.
- Documents that operators can write (spec, traffic, breakers) are parsed and validated (``docs.py``,
  ``mcpcore.breaker``); a view only ever holds valid documents (the last good one when a write was
  rejected). ``breakers`` holds the levels in force at ``now``: a forced level past its ``until`` is 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from mcpcore.lifecycle import ReplicaState

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
class TrafficDoc:
    """A traffic split: all requests to ``stable`` but ``canary_percent`` to ``canary``."""

    stable: str
    canary: str | None = None
    canary_percent: int = 0

    @property
    def versions(self) -> tuple[str, ...]:
        return (self.stable,) if self.canary is None else (self.stable, self.canary)


@dataclass(frozen=True)
class ModelSpecDoc:
    """The desired state of one model (``/mcp/models/<m>/spec``)."""

    model: str
    versions: tuple[str, ...]  # versions kept loaded (pinned); traffic may add more
    replicas: int = 1  # copies of each needed version (0 with load_on_demand: none until asked for)
    min_replicas: int = 0
    max_replicas: int = 0  # 0 = replicas (no extra copies for hot models)
    priority: int = 0  # higher wins placement and is never evicted for a lower one
    memory_bytes: int = 0  # declared per replica; 0 = unknown until a replica is measured
    labels: Mapping[str, str] = field(default_factory=dict)  # a worker must carry all of them
    fallback_version: str | None = None  # breaker level 3 sends traffic here: kept loaded (1 copy)
    load_on_demand: bool = False
    latency_sensitivity: float = 0.5
    max_batch_size: int = 0  # 0 = model.yaml's
    max_queue_delay_us: int | None = None
    paused_versions: tuple[str, ...] = ()  # PauseModel: kept loaded, PAUSED (no new traffic)


@dataclass(frozen=True)
class Demand:
    """A router's report for one model (``/mcp/demand/<m>/<router>``)."""

    model: str
    router: str
    requests: int = 0  # requests that found no copy (load on demand)
    overflow: int = 0  # requests that found every copy at its bounded-load cap (hot model)
    at: float = 0.0


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

    def replicas_of(self, model: str, version: str | None = None) -> list[ReplicaInfo]:
        return [
            r
            for r in self.replicas.values()
            if r.model == model and (version is None or r.version == version)
        ]

    def replicas_on(self, worker: str) -> list[ReplicaInfo]:
        return [r for r in self.replicas.values() if r.worker == worker]
