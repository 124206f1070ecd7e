"""A worker's documents: ``/mcp/workers/<id>`` (its record) and ``/mcp/workers/<id>/load`` (its load
report), both written by the worker under its lease (DESIGN.md sections 4 and 8).

Invariants:
- Process documents: fields a newer worker adds are ignored and counted (``UNKNOWN_FIELDS``), so it never
  drops out of an older reader's view.
- ``to_json`` writes sorted keys, compact: the bytes workers have always written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from mcpcore.records.base import Reader, dumps, show

__all__ = ["Device", "LoadReport", "ReplicaLoad", "WorkerRecord"]

_MAX_CAPACITY = 64.0


def _worker_of(key: str) -> str:
    parts = key.split("/")
    return parts[-2] if parts[-1] == "load" else parts[-1]


@dataclass(frozen=True)
class Device:
    index: int
    memory_total_bytes: int


@dataclass(frozen=True)
class WorkerRecord:
    """Where a worker is and what it offers (``/mcp/workers/<id>``)."""

    worker_id: str
    grpc: str  # its WorkerControl address
    zmq: str  # its tensor endpoint (tcp://host:port or ipc://path)
    memory_capacity_bytes: int
    metrics: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    devices: tuple[Device, ...] = ()
    started_at: float = 0.0
    curve_public_key: str = ""  # z85, 40 characters; "" without CURVE
    incarnation: str = ""  # the process now holding the id ("": a record from before incarnations)
    zmq_features: tuple[str, ...] = ()  # what its tensor socket takes besides single messages
    capacity: float = 1.0  # relative weight in the routing rings, (0, 64]
    draining: str = ""  # why it is stopping ("" while it is not): it takes no new requests
    record_certificate: str = ""  # the signed record's proof (mcpcore.record_signing)
    record_signature: str = ""
    record_local_signature: str = ""  # its signed offer of the same-host endpoint

    @classmethod
    def parse(cls, key: str, raw: bytes | str | Mapping[str, Any]) -> WorkerRecord:
        worker = _worker_of(key)
        d = Reader(key, raw, _RECORD_FIELDS, kind="worker", strict=False)
        if d.get("worker_id", worker) != worker:
            d.fail("worker_id", f"names {show(d.body['worker_id'])} but the key is for {worker!r}")
        devices = d.get("devices", [])
        if not isinstance(devices, list):
            d.fail("devices", "expected a list of devices")
        return cls(
            worker_id=worker,
            grpc=d.str_("grpc"),
            zmq=d.str_("zmq"),
            memory_capacity_bytes=d.int_("memory_capacity_bytes", lo=0),
            metrics=d.str_("metrics", "", empty=True),
            labels=d.labels("labels"),
            devices=tuple(_device(key, i, dev) for i, dev in enumerate(devices)),
            started_at=d.float_("started_at", 0.0),
            curve_public_key=d.str_("curve_public_key", "", empty=True),
            incarnation=d.str_("incarnation", "", empty=True),
            zmq_features=d.strs("zmq_features"),
            capacity=d.float_("capacity", 1.0, lo=1e-9, hi=_MAX_CAPACITY),
            draining=_reason(d, "draining"),
            record_certificate=d.str_("record_certificate", "", empty=True),
            record_signature=d.str_("record_signature", "", empty=True),
            record_local_signature=d.str_("record_local_signature", "", empty=True),
        )

    def to_json(self) -> bytes:
        body: dict[str, Any] = {f: getattr(self, f) for f in _RECORD_FIELDS}
        body |= {
            "labels": dict(self.labels),
            "devices": [{"index": d.index, "memory_total_bytes": d.memory_total_bytes} for d in self.devices],
            "zmq_features": list(self.zmq_features),
        }
        for name in ("record_certificate", "record_signature", "record_local_signature"):
            if not body[name]:
                del body[name]  # an unsigned record carries no signature fields
        return dumps(body, sort_keys=True)


def _reason(d: Reader, name: str) -> str:
    """A reason field: the why as text ("" for none); ``true``/``false`` from older writers are read too."""
    value = d.get(name, "")
    if isinstance(value, bool):
        return name if value else ""
    if not isinstance(value, str):
        d.fail(name, f"expected the {name} reason (a string), got {show(value)}")
    return value


def _device(key: str, i: int, raw: Any) -> Device:
    d = Reader(
        f"{key}: devices[{i}]",
        raw if isinstance(raw, dict) else {"index": raw},
        ("index", "memory_total_bytes"),
        kind="worker",
        strict=False,
    )
    return Device(d.int_("index", lo=0), d.int_("memory_total_bytes", 0, lo=0))


_RECORD_FIELDS = tuple(f.name for f in fields(WorkerRecord))


@dataclass(frozen=True)
class ReplicaLoad:
    """One loaded replica in a load report (``models["<model>/<version>"]``)."""

    state: str = ""
    queue_depth: int = 0
    batch_utilization: float = 0.0
    memory_bytes: int = 0
    mean_exec_s: float = 0.0
    max_batch_size: int = 0
    breaker_level: int = 0


_REPLICA_LOAD_FIELDS = tuple(f.name for f in fields(ReplicaLoad))


@dataclass(frozen=True)
class LoadReport:
    """A worker's heartbeat (``/mcp/workers/<id>/load``), published when it changes, rate-limited."""

    worker_id: str
    queue_depth: int = 0
    in_flight: int = 0
    batch_utilization: float = 0.0
    mean_exec_s: float = 0.0
    memory_used_bytes: int = 0
    memory_capacity_bytes: int = 0
    last_active: float = 0.0
    stopped: str = ""  # why it was emergency-stopped ("" while it is not)
    exec_errors_total: int = 0  # requests its models failed (backend faults)
    buffer_pool_hits: int = 0  # tensor frames received straight into pooled buffers
    device_error: str = ""  # a device fault ("" when none)
    models: Mapping[str, ReplicaLoad] = field(default_factory=dict)
    device_room_bytes: int | None = None  # None: not measured
    heartbeat_interval_s: float = 0.0
    last_beat: float = 0.0

    @classmethod
    def parse(cls, key: str, raw: bytes | str | Mapping[str, Any]) -> LoadReport:
        d = Reader(key, raw, _LOAD_FIELDS, kind="load", strict=False)
        models = {}
        for name, body in (d.obj("models") or {}).items():
            m = Reader(f"{key}: models.{name}", body, _REPLICA_LOAD_FIELDS, kind="load", strict=False)
            models[name] = ReplicaLoad(
                state=m.str_("state", "", empty=True),
                queue_depth=m.int_("queue_depth", 0, lo=0),
                batch_utilization=m.float_("batch_utilization", 0.0),
                memory_bytes=m.int_("memory_bytes", 0, lo=0),
                mean_exec_s=m.float_("mean_exec_s", 0.0),
                max_batch_size=m.int_("max_batch_size", 0, lo=0),
                breaker_level=m.int_("breaker_level", 0, lo=0),
            )
        room = d.get("device_room_bytes", None)
        return cls(
            worker_id=d.str_("worker_id", _worker_of(key)),
            queue_depth=d.int_("queue_depth", 0, lo=0),
            in_flight=d.int_("in_flight", 0, lo=0),
            batch_utilization=d.float_("batch_utilization", 0.0),
            mean_exec_s=d.float_("mean_exec_s", 0.0),
            memory_used_bytes=d.int_("memory_used_bytes", 0, lo=0),
            memory_capacity_bytes=d.int_("memory_capacity_bytes", 0, lo=0),
            last_active=d.float_("last_active", 0.0),
            stopped=_reason(d, "stopped"),
            exec_errors_total=d.int_("exec_errors_total", 0, lo=0),
            buffer_pool_hits=d.int_("buffer_pool_hits", 0, lo=0),
            device_error=d.str_("device_error", "", empty=True),
            models=models,
            device_room_bytes=None if room is None else d.int_("device_room_bytes", lo=0),
            heartbeat_interval_s=d.float_("heartbeat_interval_s", 0.0),
            last_beat=d.float_("last_beat", 0.0),
        )

    def to_json(self) -> bytes:
        body: dict[str, Any] = {f: getattr(self, f) for f in _LOAD_FIELDS}
        body["models"] = {
            name: {f: getattr(m, f) for f in _REPLICA_LOAD_FIELDS} for name, m in self.models.items()
        }
        if self.device_room_bytes is None:
            del body["device_room_bytes"]  # absent: not measured
        return dumps(body, sort_keys=True)


_LOAD_FIELDS = tuple(f.name for f in fields(LoadReport))
