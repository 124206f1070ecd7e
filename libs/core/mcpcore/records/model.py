"""A model's documents: ``/mcp/models/<m>/{spec,traffic,routing,status}`` (DESIGN.md section 4).

Invariants:
- ``spec`` and ``traffic`` are operator documents (etcdctl, mcpctl, the scheduler API): strict.
  ``routing`` (the split in force) and ``status`` are written by the leader scheduler: unknown fields are
  ignored and counted. Traffic and routing share one type and one format; the key says which it is.
- Versions are decimal strings ("1"); ints are accepted on input and normalised.
- ``to_json`` of spec and traffic parses what it wrote back: a document the mesh writes is one it reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from mcpcore.errors import InvalidArgument
from mcpcore.keys import Keyspace
from mcpcore.records.base import Reader, dumps, show

__all__ = ["ModelSpecDoc", "ModelStatusDoc", "TrafficDoc", "VersionCount", "model_of"]

_KEYS = Keyspace()


def model_of(key: str) -> str:
    """The model a ``.../models/<m>/<what>`` key is for (any prefix)."""
    parts = key.rsplit("/", 2)
    if len(parts) != 3 or not parts[1]:
        raise InvalidArgument(f"{key}: not a model key (…/models/<model>/<what>)")
    return parts[1]


@dataclass(frozen=True)
class TrafficDoc:
    """A traffic split: all requests to ``stable`` but ``canary_percent`` to ``canary``.

    ``/mcp/models/<m>/traffic`` (wanted; operator-written, strict) and ``/mcp/models/<m>/routing`` (in
    force; scheduler-written, tolerant): ``{"stable": "1", "canary": "2", "canary_percent": 10}``.
    """

    stable: str
    canary: str | None = None
    canary_percent: int = 0

    @property
    def versions(self) -> tuple[str, ...]:
        return (self.stable,) if self.canary is None else (self.stable, self.canary)

    @classmethod
    def parse(cls, key: str, raw: bytes | str) -> TrafficDoc:
        routing = key.endswith("/routing")
        d = Reader(key, raw, ("stable", "canary", "canary_percent"), kind="routing", strict=not routing)
        stable = d.version("stable", d.get("stable"))
        canary_raw = d.get("canary", None)
        canary = None if canary_raw is None else d.version("canary", canary_raw)
        percent = d.int_("canary_percent", 0, lo=0, hi=100)
        if canary == stable:
            d.fail("canary", f"must differ from stable ({stable})")
        if percent > 0 and canary is None:
            d.fail("canary_percent", f"{percent} needs a canary version")
        return cls(stable=stable, canary=canary, canary_percent=percent)

    def to_json(self) -> bytes:
        body: dict[str, Any] = {"stable": self.stable}
        if self.canary is not None or self.canary_percent:
            body |= {"canary": self.canary, "canary_percent": self.canary_percent}
        raw = dumps(body)
        TrafficDoc.parse("traffic", raw)  # the same rules as an operator's etcdctl put
        return raw


@dataclass(frozen=True)
class ModelSpecDoc:
    """The desired state of one model (``/mcp/models/<m>/spec``; operator-written, strict)."""

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

    @classmethod
    def parse(cls, key: str, raw: bytes | str) -> ModelSpecDoc:
        """The fields of this class (``model`` optional, must match the key's model)."""
        model = model_of(key)
        d = Reader(key, raw, _SPEC_FIELDS, kind="spec", strict=True)
        if d.get("model", model) != model:
            d.fail("model", f"names {show(d.body['model'])} but the key is for {model!r}")
        versions = d.versions("versions")
        if not versions:
            d.fail("versions", "must list at least one version")
        on_demand = d.bool_("load_on_demand", False)
        replicas = d.int_("replicas", 1, lo=0)
        if replicas == 0 and not on_demand:
            d.fail("replicas", "0 needs load_on_demand: true (else the model is never loaded)")
        max_replicas = d.int_("max_replicas", 0, lo=0)
        if 0 < max_replicas < replicas:
            d.fail(
                "max_replicas", f"must be 0 (no extra copies) or >= replicas ({replicas}), got {max_replicas}"
            )
        min_replicas = d.int_("min_replicas", 0, lo=0)
        if min_replicas > replicas:
            d.fail(
                "min_replicas",
                f"must be 0 (no fewer than replicas) or <= replicas ({replicas}), got {min_replicas}",
            )
        fallback = d.get("fallback_version", None)
        delay = d.get("max_queue_delay_us", None)
        paused = d.versions("paused_versions", [])
        unknown = [v for v in paused if v not in versions]
        if unknown:
            d.fail("paused_versions", f"version {unknown[0]} is not in versions {list(versions)}")
        return cls(
            model=model,
            versions=versions,
            replicas=replicas,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            priority=d.int_("priority", 0),
            memory_bytes=d.int_("memory_bytes", 0, lo=0),
            labels=d.labels("labels"),
            fallback_version=None if fallback is None else d.version("fallback_version", fallback),
            load_on_demand=on_demand,
            latency_sensitivity=d.float_("latency_sensitivity", 0.5, 0.0, 1.0),
            max_batch_size=d.int_("max_batch_size", 0, lo=0),
            max_queue_delay_us=None if delay is None else d.int_("max_queue_delay_us", lo=0),
            paused_versions=paused,
        )

    def to_json(self) -> bytes:
        body = {f: getattr(self, f) for f in _SPEC_FIELDS if f != "model"}
        body |= {
            "versions": list(self.versions),
            "labels": dict(self.labels),
            "paused_versions": list(self.paused_versions),
        }
        raw = dumps(body)
        ModelSpecDoc.parse(_KEYS.model_spec(self.model), raw)  # the same rules as an operator's write
        return raw


_SPEC_FIELDS = tuple(f.name for f in fields(ModelSpecDoc))


@dataclass(frozen=True)
class VersionCount:
    running: int = 0
    required: int = 0


@dataclass(frozen=True)
class ModelStatusDoc:
    """The leader scheduler's view of one model (``/mcp/models/<m>/status``; tolerant)."""

    model: str
    versions: Mapping[str, VersionCount] = field(default_factory=dict)
    pending: str = ""
    error: str = ""
    error_code: str = ""
    retrying: str = ""
    traffic_rejected: str = ""  # why the operator's traffic document was rejected ("" when it was not)
    spec_revision: int = 0  # the spec and traffic revisions the status was planned from
    traffic_revision: int = 0

    @classmethod
    def parse(cls, key: str, raw: bytes | str) -> ModelStatusDoc:
        d = Reader(key, raw, _STATUS_FIELDS, kind="status", strict=False)
        counts = d.obj("versions") or {}
        versions = {}
        for version, count in counts.items():
            c = Reader(
                f"{key}: versions.{version}", count, ("running", "required"), kind="status", strict=False
            )
            versions[d.version(f"versions.{version}", version)] = VersionCount(
                c.int_("running", 0, lo=0), c.int_("required", 0, lo=0)
            )
        return cls(
            model=d.str_("model", model_of(key)),
            versions=versions,
            pending=d.str_("pending", "", empty=True),
            error=d.str_("error", "", empty=True),
            error_code=d.str_("error_code", "", empty=True),
            retrying=str(d.get("retrying", "") or ""),
            traffic_rejected=d.str_("traffic_rejected", "", empty=True),
            spec_revision=d.int_("spec_revision", 0, lo=0),
            traffic_revision=d.int_("traffic_revision", 0, lo=0),
        )

    def to_dict(self) -> dict[str, Any]:
        """The wire form; ``retrying`` and ``traffic_rejected`` only when set (as the scheduler writes)."""
        body: dict[str, Any] = {
            "model": self.model,
            "versions": {v: {"running": c.running, "required": c.required} for v, c in self.versions.items()},
            "pending": self.pending,
            "error": self.error,
            "error_code": self.error_code,
            "spec_revision": self.spec_revision,
            "traffic_revision": self.traffic_revision,
        }
        if self.retrying:
            body["retrying"] = self.retrying
        if self.traffic_rejected:
            body["traffic_rejected"] = self.traffic_rejected
        return body

    def to_json(self) -> bytes:
        return dumps(self.to_dict(), sort_keys=True)


_STATUS_FIELDS = tuple(f.name for f in fields(ModelStatusDoc))
