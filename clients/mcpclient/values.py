"""The SDK's public values: what a router's ``Route`` says (``Route``), what the scheduler's status says
(``ModelInfo`` with its ``ReplicaInfo``), and what a client did (``ClientStats``).

Invariants:
- Plain frozen dataclasses (``ClientStats`` excepted: the client counts into it), no protobuf and no I/O;
  ``mcpclient.convert`` builds them from the wire messages.
- ``Route`` is also the link target of the direct path (``mcpcore.transport.link.LinkTarget``: ``id``,
  ``zmq``, ``draining``), so the forwarder links to a worker straight from a Route answer.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ClientStats", "ModelInfo", "ReplicaInfo", "Route"]


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request would go (the router's ``Route`` answer); also the link target of the direct path."""

    model: str
    version: str
    worker_id: str
    endpoint: str  # the worker's ZeroMQ endpoint
    breaker_level: int
    header_flags: int
    curve_public_key: str = ""
    features_off: tuple[str, ...] = ()
    zmq_features: frozenset[str] = frozenset()
    incarnation: str = ""
    idempotent: bool = False  # the version may run twice: sent once more after its worker failed
    record_certificate: str = ""  # the worker record's proof (mcpcore.record_signing)
    record_signature: str = ""
    control_endpoint: str = ""  # the worker's gRPC address (signed with the record)
    record_local_signature: str = ""  # its signed offer of a same-host endpoint (record_signing.local_claim)

    # mcpcore.transport.link.LinkTarget
    @property
    def id(self) -> str:
        return self.worker_id

    @property
    def zmq(self) -> str:
        return self.endpoint

    @property
    def draining(self) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    version: str
    worker_id: str
    state: str  # LOADING, RUNNING, PAUSED, UNLOADING, ERROR ...
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    model: str
    versions: tuple[str, ...]
    replicas: tuple[ReplicaInfo, ...]
    breaker_level: int
    stable: str = ""
    canary: str = ""
    canary_percent: int = 0
    pending: str = ""  # what the scheduler is still doing for it, if anything

    def running(self, version: str | None = None) -> int:
        return sum(1 for r in self.replicas if r.state == "RUNNING" and version in (None, r.version))


@dataclass(slots=True)
class ClientStats:
    """What this client did (tests, benchmarks, and a user who wants to know where requests went)."""

    routed: int = 0  # answered through a router
    direct: int = 0  # answered by a worker directly
    fallbacks: int = 0  # direct requests that provably did not start at the worker, sent through a router
    resends: int = 0  # direct requests of idempotent versions sent again through a router after a failure
    route_calls: int = 0  # Route RPCs made (the cache's misses)
    failovers: int = 0  # calls moved to another router
    shared: int = 0  # direct requests whose tensors went by shared memory (a worker on this host)
