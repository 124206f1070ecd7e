"""The etcd keyspace (DESIGN.md section 4), built in exactly one place.

Every value under these keys has one typed definition in ``mcpcore.records``.

Rule: no other module writes a key literal; services ask a ``Keyspace`` for every key and prefix, and parse
keys they watch back with the ``parse_*`` methods. Names are validated here, so a model called ``a/b`` can
never alias another model's keys.

    /mcp/workers/<id>                      worker record (under the worker's lease)
    /mcp/workers/<id>/load                 load report (under the worker's lease)
    /mcp/models/<m>/spec                   desired state
    /mcp/models/<m>/traffic                traffic split wanted (operator-writable JSON)
    /mcp/models/<m>/routing                traffic split in force (scheduler-written: a flip lands here
                                           only once its versions are RUNNING on their replica count)
    /mcp/models/<m>/status                 the leader scheduler's view: copies per version, pending, error
    /mcp/demand/<m>/<router>               requests for a model with no copy, and bounded-load overflows
                                           (router-written, under the router's lease)
    /mcp/drain/<worker>                    a worker being drained (scheduler-written)
    /mcp/replicas/<m>/<v>/<worker>         replica state
    /mcp/breakers/<m>                      breaker level (operator-writable JSON)
    /mcp/config/breaker                    breaker policy (operator-writable JSON)
    /mcp/stats/<source>/<m>                windowed request/error counts: a router's (source = its id), or a
                                           worker's for direct (SDK) traffic (source = direct.<worker id>);
                                           under the writer's lease
    /mcp/routers/<id>                      a router's addresses (grpc, rest, metrics; under its lease)
    /mcp/rejected/<service>/<instance>     the operator documents a service instance rejected, and why
                                           (``mcpcore.records.rejections``; under its own lease)
    /mcp/leader/<service>                  leader election
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mcpcore.errors import InvalidArgument

__all__ = ["NAME_RE", "VERSION_RE", "Keyspace", "ReplicaId", "check_name", "check_version"]

#: Model, worker, router and key names: no '/', no leading punctuation, bounded length (tensor names:
#: ``mcpcore.tensor_signature.TENSOR_NAME_RE``).
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
#: Versions are positive integers written in decimal ("1", "2", ...).
VERSION_RE = re.compile(r"[1-9][0-9]{0,8}")
LEADER_ROLES = frozenset({"scheduler", "health"})
SERVICES = frozenset({"scheduler", "health", "router", "worker"})
MODEL_KEYS = ("spec", "traffic", "routing", "status")
DIRECT_SOURCE = "direct."  # a stats source that is a worker counting direct traffic, not a router


def check_name(value: str, what: str = "name") -> str:
    if not isinstance(value, str) or NAME_RE.fullmatch(value) is None:
        raise InvalidArgument(
            f"{what} {value!r} is not valid: use 1-128 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return value


def check_version(value: str, what: str = "version") -> str:
    if not isinstance(value, str) or VERSION_RE.fullmatch(value) is None:
        raise InvalidArgument(f"{what} {value!r} is not valid: use a positive integer such as '1'")
    return value


@dataclass(frozen=True, slots=True)
class ReplicaId:
    model: str
    version: str
    worker: str

    def __str__(self) -> str:
        return f"{self.model}/{self.version}@{self.worker}"


@dataclass(frozen=True, slots=True)
class Keyspace:
    """All keys under one prefix (default ``/mcp``; configurable so clusters or tests can share an etcd)."""

    prefix: str = "/mcp"

    def __post_init__(self) -> None:
        if not self.prefix.startswith("/") or self.prefix.endswith("/") or "//" in self.prefix:
            raise InvalidArgument(
                f"key prefix {self.prefix!r} must start with '/' and not end with '/', e.g. '/mcp'"
            )

    # -- workers --------------------------------------------------------------------------------------
    def workers_prefix(self) -> str:
        return f"{self.prefix}/workers/"

    def worker(self, worker: str) -> str:
        return f"{self.prefix}/workers/{check_name(worker, 'worker id')}"

    def worker_load(self, worker: str) -> str:
        return f"{self.worker(worker)}/load"

    def parse_worker_key(self, key: str) -> tuple[str, bool] | None:
        """``(worker id, is_load_report)`` for a key under ``workers_prefix()``, else None."""
        rest = self._strip(key, self.workers_prefix())
        if rest is None:
            return None
        parts = rest.split("/")
        if len(parts) == 1 and NAME_RE.fullmatch(parts[0]):
            return parts[0], False
        if len(parts) == 2 and parts[1] == "load" and NAME_RE.fullmatch(parts[0]):
            return parts[0], True
        return None

    # -- models ---------------------------------------------------------------------------------------
    def models_prefix(self) -> str:
        return f"{self.prefix}/models/"

    def model_spec(self, model: str) -> str:
        return f"{self.prefix}/models/{check_name(model, 'model name')}/spec"

    def model_traffic(self, model: str) -> str:
        return f"{self.prefix}/models/{check_name(model, 'model name')}/traffic"

    def model_routing(self, model: str) -> str:
        return f"{self.prefix}/models/{check_name(model, 'model name')}/routing"

    def model_status(self, model: str) -> str:
        return f"{self.prefix}/models/{check_name(model, 'model name')}/status"

    def parse_model_key(self, key: str) -> tuple[str, str] | None:
        """``(model, one of MODEL_KEYS)`` for a key under ``models_prefix()``, else None."""
        rest = self._strip(key, self.models_prefix())
        parts = rest.split("/") if rest is not None else []
        if len(parts) == 2 and NAME_RE.fullmatch(parts[0]) and parts[1] in MODEL_KEYS:
            return parts[0], parts[1]
        return None

    # -- demand and drains ----------------------------------------------------------------------------
    def demand_prefix(self, model: str | None = None) -> str:
        base = f"{self.prefix}/demand/"
        return base if model is None else f"{base}{check_name(model, 'model name')}/"

    def demand(self, model: str, router: str) -> str:
        return f"{self.demand_prefix(model)}{check_name(router, 'router id')}"

    def parse_demand_key(self, key: str) -> tuple[str, str] | None:
        """``(model, router)`` for a key under ``demand_prefix()``, else None."""
        rest = self._strip(key, self.demand_prefix())
        parts = rest.split("/") if rest is not None else []
        if len(parts) == 2 and all(NAME_RE.fullmatch(p) for p in parts):
            return parts[0], parts[1]
        return None

    def drains_prefix(self) -> str:
        return f"{self.prefix}/drain/"

    def drain(self, worker: str) -> str:
        return f"{self.drains_prefix()}{check_name(worker, 'worker id')}"

    def parse_drain_key(self, key: str) -> str | None:
        rest = self._strip(key, self.drains_prefix())
        return rest if rest is not None and NAME_RE.fullmatch(rest) else None

    # -- replicas -------------------------------------------------------------------------------------
    def replicas_prefix(self, model: str | None = None, version: str | None = None) -> str:
        if model is None:
            return f"{self.prefix}/replicas/"
        base = f"{self.prefix}/replicas/{check_name(model, 'model name')}/"
        return base if version is None else f"{base}{check_version(version)}/"

    def replica(self, model: str, version: str, worker: str) -> str:
        return f"{self.replicas_prefix(model, version)}{check_name(worker, 'worker id')}"

    def replica_key(self, rid: ReplicaId) -> str:
        return self.replica(rid.model, rid.version, rid.worker)

    def parse_replica_key(self, key: str) -> ReplicaId | None:
        rest = self._strip(key, self.replicas_prefix())
        parts = rest.split("/") if rest is not None else []
        if (
            len(parts) == 3
            and NAME_RE.fullmatch(parts[0])
            and VERSION_RE.fullmatch(parts[1])
            and NAME_RE.fullmatch(parts[2])
        ):
            return ReplicaId(*parts)
        return None

    # -- breakers, config, stats, leaders -------------------------------------------------------------
    def breakers_prefix(self) -> str:
        return f"{self.prefix}/breakers/"

    def breaker(self, model: str) -> str:
        return f"{self.breakers_prefix()}{check_name(model, 'model name')}"

    def parse_breaker_key(self, key: str) -> str | None:
        rest = self._strip(key, self.breakers_prefix())
        return rest if rest is not None and NAME_RE.fullmatch(rest) else None

    def breaker_config(self) -> str:
        return f"{self.prefix}/config/breaker"

    def stats_prefix(self, router: str | None = None) -> str:
        base = f"{self.prefix}/stats/"
        return base if router is None else f"{base}{check_name(router, 'router id')}/"

    def stats(self, router: str, model: str) -> str:
        return f"{self.stats_prefix(router)}{check_name(model, 'model name')}"

    def direct_stats(self, worker: str, model: str) -> str:
        """A worker's counts of the requests clients sent it directly (``FLAG_DIRECT``)."""
        return self.stats(f"{DIRECT_SOURCE}{check_name(worker, 'worker id')}", model)

    def routers_prefix(self) -> str:
        return f"{self.prefix}/routers/"

    def router(self, router: str) -> str:
        return f"{self.routers_prefix()}{check_name(router, 'router id')}"

    def parse_stats_key(self, key: str) -> tuple[str, str] | None:
        rest = self._strip(key, self.stats_prefix())
        parts = rest.split("/") if rest is not None else []
        if len(parts) == 2 and all(NAME_RE.fullmatch(p) for p in parts):
            return parts[0], parts[1]
        return None

    def rejected_prefix(self) -> str:
        return f"{self.prefix}/rejected/"

    def rejected(self, service: str, instance: str) -> str:
        """Where one service instance publishes the operator documents it rejected."""
        if service not in SERVICES:
            raise InvalidArgument(f"service {service!r} is not one of {sorted(SERVICES)}")
        return f"{self.rejected_prefix()}{service}/{check_name(instance, f'{service} id')}"

    def parse_rejected_key(self, key: str) -> tuple[str, str] | None:
        """``(service, instance)`` for a key under ``rejected_prefix()``, else None."""
        rest = self._strip(key, self.rejected_prefix())
        parts = rest.split("/") if rest is not None else []
        if len(parts) == 2 and parts[0] in SERVICES and NAME_RE.fullmatch(parts[1]):
            return parts[0], parts[1]
        return None

    def leader(self, role: str) -> str:
        if role not in LEADER_ROLES:
            raise InvalidArgument(f"leader role {role!r} is not one of {sorted(LEADER_ROLES)}")
        return f"{self.prefix}/leader/{role}"

    @staticmethod
    def _strip(key: str, prefix: str) -> str | None:
        return key[len(prefix) :] if key.startswith(prefix) else None
