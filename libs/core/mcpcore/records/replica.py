"""A replica's record: ``/mcp/replicas/<m>/<v>/<worker>`` (DESIGN.md sections 4 and 5).

Written by the scheduler and the worker through ``mcpcore.lifecycle`` (compare-and-swap); read by the
router, the health service and the scheduler.

Invariants:
- A process document: fields a newer writer adds (at the top or in ``info``) are ignored and counted.
- ``info`` is what the worker says of the loaded model. It travels as a mapping (the lifecycle merges a
  transition's additions into it), and ``details`` is its typed reading, checked whenever a record is
  built or parsed: a record whose ``info`` is malformed does not exist, for its writer or any reader.
- ``revision`` is the key's mod revision, never part of the JSON.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mcpcore.errors import InvalidArgument
from mcpcore.records.base import Reader, dumps

__all__ = [
    "Batching",
    "ConfigSummary",
    "ReplicaDetails",
    "ReplicaRecord",
    "ReplicaState",
    "TensorInfo",
    "Transition",
]


class ReplicaState(enum.Enum):
    IDLE = "IDLE"
    LOADING = "LOADING"
    READY = "READY"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    UNLOADING = "UNLOADING"
    ERROR = "ERROR"
    RECOVERING = "RECOVERING"


@dataclass(frozen=True, slots=True)
class Transition:
    src: ReplicaState
    dst: ReplicaState
    at: float
    reason: str = ""


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Batching:
    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    priority_levels: int = 1
    default_priority_level: int = 1
    default_queue_timeout_us: int = 0
    max_queue_size: int = 0


@dataclass(frozen=True, slots=True)
class ConfigSummary:
    """How the replica batches and where it runs (what routers report as KServe's ModelConfig)."""

    max_batch_size: int = 0
    instance_count: int = 1
    device: str = "cpu"  # "cpu" or "gpu"
    device_id: int | None = None
    cpu_fallback: str = ""  # why a model that asks for a GPU runs on the CPU
    decoupled: bool = False
    dynamic_batching: Batching | None = None


@dataclass(frozen=True, slots=True)
class ReplicaDetails:
    """The typed reading of a record's ``info`` (every field optional: an older worker wrote fewer)."""

    memory_bytes: int = 0  # measured by the worker, 0 while unknown
    incarnation: str = ""  # the worker process that wrote it
    zmq: str = ""
    grpc: str = ""
    platform: str = ""
    inputs: tuple[TensorInfo, ...] | None = None  # None: the record carries no signature
    outputs: tuple[TensorInfo, ...] | None = None
    secondary: tuple[str, ...] | None = None  # outputs a breaker at level 2 drops
    idempotent: bool = False  # a record that does not say is not: never run twice on a guess
    max_ongoing_requests: int | None = None
    config: ConfigSummary | None = None

    @classmethod
    def parse(cls, where: str, info: Any) -> ReplicaDetails:
        d = Reader(where, info, _INFO_FIELDS, kind="replica", strict=False)
        secondary = d.get("secondary", None)
        limit = d.get("max_ongoing_requests", None)
        config = d.obj("config")
        return cls(
            memory_bytes=d.int_("memory_bytes", 0, lo=0),
            incarnation=d.str_("incarnation", "", empty=True),
            zmq=d.str_("zmq", "", empty=True),
            grpc=d.str_("grpc", "", empty=True),
            platform=d.str_("platform", "", empty=True),
            inputs=_tensors(d, "inputs"),
            outputs=_tensors(d, "outputs"),
            secondary=None if secondary is None else d.strs("secondary"),
            idempotent=d.bool_("idempotent", False),
            max_ongoing_requests=None if limit is None else d.int_("max_ongoing_requests", lo=1),
            config=None if config is None else _config(f"{where}.config", config),
        )


_INFO_FIELDS = (
    "memory_bytes", "incarnation", "zmq", "grpc", "platform", "inputs", "outputs", "secondary", "idempotent",
    "max_ongoing_requests", "config",
)  # fmt: skip
_CONFIG_FIELDS = (
    "max_batch_size", "instance_count", "device", "device_id", "cpu_fallback", "decoupled",
    "dynamic_batching",
)  # fmt: skip
_BATCHING_FIELDS = (
    "max_queue_delay_us", "preferred_batch_sizes", "priority_levels", "default_priority_level",
    "default_queue_timeout_us", "max_queue_size",
)  # fmt: skip


def _tensors(d: Reader, name: str) -> tuple[TensorInfo, ...] | None:
    items = d.get(name, None)
    if items is None:
        return None
    if not isinstance(items, list):
        d.fail(name, "expected a list of tensors")
    out = []
    for i, item in enumerate(items):
        t = Reader(f"{d.key}: {name}[{i}]", item, ("name", "dtype", "shape"), kind="replica", strict=False)
        shape = t.get("shape")
        if not isinstance(shape, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in shape
        ):
            t.fail("shape", "expected a list of integers")
        out.append(TensorInfo(t.str_("name"), t.str_("dtype"), tuple(shape)))
    return tuple(out)


def _config(where: str, body: dict[str, Any]) -> ConfigSummary:
    c = Reader(where, body, _CONFIG_FIELDS, kind="replica", strict=False)
    batching = c.obj("dynamic_batching")
    device = c.get("device_id", None)
    fallback = c.get("cpu_fallback", None)
    dynamic = None
    if batching is not None:
        b = Reader(f"{where}.dynamic_batching", batching, _BATCHING_FIELDS, kind="replica", strict=False)
        sizes = b.get("preferred_batch_sizes", [])
        if not isinstance(sizes, list) or not all(isinstance(n, int) and n > 0 for n in sizes):
            b.fail("preferred_batch_sizes", "expected a list of positive integers")
        dynamic = Batching(
            max_queue_delay_us=b.int_("max_queue_delay_us", 0, lo=0),
            preferred_batch_sizes=tuple(sizes),
            priority_levels=b.int_("priority_levels", 1, lo=0),
            default_priority_level=b.int_("default_priority_level", 1, lo=0),
            default_queue_timeout_us=b.int_("default_queue_timeout_us", 0, lo=0),
            max_queue_size=b.int_("max_queue_size", 0, lo=0),
        )
    return ConfigSummary(
        max_batch_size=c.int_("max_batch_size", 0, lo=0),
        instance_count=c.int_("instance_count", 1, lo=0),
        device="gpu" if c.get("device", "cpu") == "gpu" else "cpu",
        device_id=None if device is None else c.int_("device_id", lo=0),
        cpu_fallback="" if fallback is None else str(fallback),
        decoupled=c.bool_("decoupled", False),
        dynamic_batching=dynamic,
    )


@dataclass(frozen=True, slots=True)
class ReplicaRecord:
    """One replica's stored state. ``revision`` is the key's mod revision (not part of the JSON)."""

    state: ReplicaState
    since: float
    reason: str = ""
    history: tuple[Transition, ...] = ()
    info: Mapping[str, Any] = field(default_factory=dict)
    revision: int = 0
    details: ReplicaDetails = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "details", ReplicaDetails.parse("info", dict(self.info)))

    def to_json(self) -> bytes:
        return dumps(
            {
                "state": self.state.value,
                "since": self.since,
                "reason": self.reason,
                "transitions": [
                    {"from": t.src.value, "to": t.dst.value, "at": t.at, "reason": t.reason}
                    for t in self.history
                ],
                "info": dict(self.info),
            }
        )

    @classmethod
    def parse(cls, key: str, raw: bytes | str, *, revision: int = 0) -> ReplicaRecord:
        d = Reader(
            key, raw, ("state", "since", "reason", "transitions", "info"), kind="replica", strict=False
        )
        history = []
        transitions = d.get("transitions", [])
        if not isinstance(transitions, list):
            d.fail("transitions", "expected a list")
        for i, item in enumerate(transitions):
            t = Reader(
                f"{key}: transitions[{i}]", item, ("from", "to", "at", "reason"), kind="replica", strict=False
            )
            history.append(
                Transition(
                    _state(t, "from"), _state(t, "to"), t.float_("at"), t.str_("reason", "", empty=True)
                )
            )
        info = d.obj("info") or {}
        try:
            return cls(
                state=_state(d, "state"),
                since=d.float_("since"),
                reason=d.str_("reason", "", empty=True),
                history=tuple(history),
                info=info,
                revision=revision,
            )
        except InvalidArgument as exc:  # the info's check, raised before the key was known
            raise InvalidArgument(f"{key}: {exc.message}") from None


def _state(d: Reader, name: str) -> ReplicaState:
    value = d.get(name)
    try:
        return ReplicaState(value)
    except ValueError:
        d.fail(name, f"expected one of {', '.join(s.value for s in ReplicaState)}, got {value!r}")
