"""The routing table: the immutable value every request reads, and how one model's route is built from
its records (pure: no I/O; ``snapshot`` watches etcd and swaps in a new table).

Invariants:
- Only RUNNING replicas of a worker's current incarnation are in a ring (``serves``); virtual nodes are
  weighted by each worker's declared ``capacity``.
- A version's metadata and configuration come from its replicas' records, and list the versions served.
- A version is idempotent only if every record of it says so: never run twice on a guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from mcp_router.dataplane import Batching, ModelConfigInfo, ModelMetadata, TensorMeta
from mcp_router.routing.ring import HashRing
from mcpcore.modelspec import DEFAULT_MAX_ONGOING_REQUESTS
from mcpcore.records import BreakerDoc, ModelSpecDoc, ReplicaRecord, ReplicaState
from mcpcore.records.replica import ConfigSummary

__all__ = ["ModelRoute", "RoutingTable", "Split", "WorkerEndpoint", "build_route", "serves"]


@dataclass(frozen=True)
class WorkerEndpoint:
    id: str
    zmq: str
    curve_public_key: str = ""
    incarnation: str = ""
    capacity: float = 1.0
    draining: bool = False
    grpc: str = ""  # its WorkerControl address (model statistics)
    zmq_features: frozenset[str] = frozenset()  # what its tensor socket takes besides single messages
    record_certificate: str = ""  # the signed record's proof (mcpcore.record_signing), for direct clients
    record_signature: str = ""
    record_local_signature: str = ""  # its signed offer of the same-host endpoint (signing.local_claim)


@dataclass(frozen=True)
class Split:
    stable: str
    canary: str | None = None
    canary_percent: int = 0


@dataclass(frozen=True)
class ModelRoute:
    name: str
    routing: Split | None
    rings: Mapping[str, HashRing]  # version -> ring over its RUNNING replicas' workers
    breaker: BreakerDoc = field(default_factory=BreakerDoc)
    fallback_version: str | None = None
    load_on_demand: bool = False
    metadata: Mapping[str, ModelMetadata] = field(default_factory=dict)  # version -> its own metadata
    configs: Mapping[str, ModelConfigInfo] = field(default_factory=dict)  # version -> its configuration
    declared: frozenset[str] = frozenset()  # versions the spec names (any other is NOT_FOUND)
    idempotent: Mapping[str, bool] = field(default_factory=dict)  # version -> may run twice (unsaid: no)
    max_ongoing: Mapping[str, int] = field(default_factory=dict)  # version -> requests per replica
    secondary: Mapping[str, frozenset[str]] = field(default_factory=dict)  # version -> level-2 outputs

    def breaker_level(self, now: float) -> int:
        return self.breaker.level_at(now)

    def knows(self, version: str) -> bool:
        return version in self.declared or version in self.rings

    def default_version(self) -> str | None:
        """The version a request without one goes to when the breaker is down: the split's stable one,
        else the highest RUNNING version (versions compare as integers: "10" is newer than "9")."""
        if self.routing is not None and self.routing.stable in self.rings:
            return self.routing.stable
        return max(self.rings, key=int) if self.rings else None


@dataclass(frozen=True)
class RoutingTable:
    models: Mapping[str, ModelRoute] = field(default_factory=dict)
    workers: Mapping[str, WorkerEndpoint] = field(default_factory=dict)
    revision: int = 0
    features_off: tuple[str, ...] = ()  # the breaker policy's level-2 features


def build_route(
    model: str,
    running: Mapping[tuple[str, str], ReplicaRecord],
    capacity: Mapping[str, float],
    *,
    spec: ModelSpecDoc | None,
    routing: Split | None,
    breaker: BreakerDoc | None,
) -> ModelRoute | None:
    """``model``'s route from its RUNNING records (``(version, worker)`` -> record, each worker's
    ``capacity`` known), its spec, split and breaker; None when nothing names the model any more."""
    rings: dict[str, dict[str, float]] = {}
    metadata: dict[str, ModelMetadata] = {}
    configs: dict[str, ModelConfigInfo] = {}
    idempotent: dict[str, bool] = {}
    ongoing: dict[str, int] = {}
    secondary: dict[str, frozenset[str]] = {}
    for (version, worker), doc in sorted(running.items()):
        rings.setdefault(version, {})[worker] = capacity[worker]
        if version not in metadata:
            metadata[version] = meta = _metadata(model, doc)
            if (config := _config(model, version, doc, meta)) is not None:
                configs[version] = config
        info = doc.details
        # a record that does not say is taken as not idempotent: never run twice on a guess
        idempotent[version] = idempotent.get(version, True) and info.idempotent
        if info.secondary is not None:
            secondary[version] = frozenset(info.secondary)
        limit = info.max_ongoing_requests or DEFAULT_MAX_ONGOING_REQUESTS
        ongoing[version] = min(ongoing.get(version, limit), limit)
    if not rings and routing is None and spec is None:
        return None
    serving = tuple(sorted(rings, key=int))
    metadata = {v: replace(m, versions=serving) for v, m in metadata.items()}
    configs = {v: replace(c, versions=serving) for v, c in configs.items()}
    fallback = spec.fallback_version if spec is not None else None
    declared = frozenset(spec.versions) if spec is not None else frozenset()
    return ModelRoute(
        name=model,
        routing=routing,
        rings={v: HashRing(nodes) for v, nodes in rings.items()},
        breaker=breaker if breaker is not None else BreakerDoc(),
        fallback_version=fallback,
        load_on_demand=spec is not None and spec.load_on_demand,
        metadata=metadata,
        configs=configs,
        declared=declared | ({fallback} if fallback is not None else frozenset()),
        idempotent=idempotent,
        max_ongoing=ongoing,
        secondary=secondary,
    )


def serves(doc: ReplicaRecord, endpoint: WorkerEndpoint) -> bool:
    """A RUNNING record written by the worker's current incarnation (records from before incarnations
    were recorded, and workers that record none, are taken as current)."""
    if doc.state is not ReplicaState.RUNNING:
        return False
    incarnation = doc.details.incarnation
    return not incarnation or not endpoint.incarnation or incarnation == endpoint.incarnation


def _metadata(model: str, doc: ReplicaRecord) -> ModelMetadata:
    info = doc.details
    inputs = tuple(TensorMeta(t.name, t.dtype, t.shape) for t in info.inputs or ())
    outputs = tuple(TensorMeta(t.name, t.dtype, t.shape) for t in info.outputs or ())
    return ModelMetadata(model, (), info.platform, inputs, outputs)


def _config(model: str, version: str, doc: ReplicaRecord, meta: ModelMetadata) -> ModelConfigInfo | None:
    """The version's configuration from its replica record (None: a record from before workers wrote
    one: ModelConfig then says so)."""
    summary: ConfigSummary | None = doc.details.config
    if summary is None:
        return None
    b = summary.dynamic_batching
    dynamic = None
    if b is not None:
        dynamic = Batching(
            max_queue_delay_us=b.max_queue_delay_us,
            preferred_batch_sizes=b.preferred_batch_sizes,
            priority_levels=b.priority_levels,
            default_priority_level=b.default_priority_level,
            default_queue_timeout_us=b.default_queue_timeout_us,
            max_queue_size=b.max_queue_size,
        )
    return ModelConfigInfo(
        name=model,
        version=version,
        backend=meta.platform,
        max_batch_size=summary.max_batch_size,
        inputs=meta.inputs,
        outputs=meta.outputs,
        dynamic_batching=dynamic,
        instance_count=summary.instance_count,
        device=summary.device,
        versions=(),
        decoupled=summary.decoupled,
    )
