"""Reading and writing the scheduler's JSON documents in etcd (DESIGN.md section 4).

Invariants:
- Every parse error is an ``InvalidArgument`` whose message names the document and the field, e.g.
  ``traffic of demo-mlp: canary_percent: must be 0..100, got 150``; nothing else ever escapes (bad UTF-8,
  bad JSON, NaN, deep nesting, wrong types all end here), so a watcher can log, count and keep the last
  good value.
- Operator-writable documents (spec, traffic, routing, demand) reject unknown fields, suggesting the
  closest known name: a typo must not silently mean "default". The worker's record and load report are
  written by our own worker and grow additively, so only the fields the scheduler reads are checked there.
- ``*_to_json`` validate what they write by parsing it back: a document the scheduler writes is always one
  it can read.
- Versions are decimal strings ("1"); ints are accepted on input and normalised.
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import fields
from typing import Any, NoReturn

from mcp_scheduler.view import Demand, ModelSpecDoc, ReplicaInfo, TrafficDoc, WorkerInfo
from mcpcore.errors import DataLoss, InvalidArgument
from mcpcore.keys import VERSION_RE, check_name, check_version
from mcpcore.lifecycle import ReplicaRecord

__all__ = [
    "demand_to_json",
    "parse_demand",
    "parse_replica",
    "parse_routing",
    "parse_spec",
    "parse_traffic",
    "parse_worker",
    "routing_to_json",
    "spec_to_json",
    "traffic_to_json",
]

_SPEC_FIELDS = tuple(f.name for f in fields(ModelSpecDoc))
_TRAFFIC_FIELDS = ("stable", "canary", "canary_percent")
_DEMAND_FIELDS = ("requests", "overflow", "at")
_MISSING: Any = object()


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not allowed")


class _Doc:
    """One JSON object being read; ``fail`` raises ``<what>: <field>: <problem>``."""

    def __init__(self, what: str, raw: bytes | str, allowed: tuple[str, ...] | None = None) -> None:
        self.what = what
        try:
            text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray, memoryview)) else raw
            body = json.loads(text, parse_constant=_no_constant)
        except UnicodeDecodeError:
            raise InvalidArgument(f"{what}: not UTF-8 text") from None
        except (ValueError, TypeError) as exc:
            raise InvalidArgument(f"{what}: not valid JSON ({exc})") from None
        except RecursionError:
            raise InvalidArgument(f"{what}: not valid JSON (nested too deeply)") from None
        if not isinstance(body, dict):
            raise InvalidArgument(f"{what}: expected a JSON object, got {_show(body)}")
        self.body: dict[str, Any] = body
        for key in body if allowed is not None else ():
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.5)
                hint = f"did you mean {close[0]!r}?" if close else f"known fields: {', '.join(allowed)}"
                self.fail(key, f"unknown field ({hint})")

    def fail(self, name: str, msg: str) -> NoReturn:
        raise InvalidArgument(f"{self.what}: {name}: {msg}")

    def get(self, name: str, default: Any = _MISSING) -> Any:
        if name in self.body:
            return self.body[name]
        if default is _MISSING:
            self.fail(name, "required")
        return default

    def int_(self, name: str, default: Any = _MISSING, lo: int | None = None, hi: int | None = None) -> int:
        value = self.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(name, f"expected an integer, got {_show(value)}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bound = f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"{lo}..{hi}"
            self.fail(name, f"must be {bound}, got {value}")
        return value

    def float_(self, name: str, default: Any = _MISSING, lo: float = 0.0, hi: float = math.inf) -> float:
        value = self.get(name, default)
        try:
            number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        except OverflowError:  # an integer literal too large for a float
            number = None
        if number is None or not math.isfinite(number):
            self.fail(name, f"expected a finite number, got {_show(value)}")
        if not lo <= number <= hi:
            self.fail(name, f"must be {lo:g}..{hi:g}, got {value}" if hi < math.inf else f"must be >= {lo:g}")
        return number

    def bool_(self, name: str, default: Any = _MISSING) -> bool:
        value = self.get(name, default)
        if not isinstance(value, bool):
            self.fail(name, f"expected true or false, got {_show(value)}")
        return value

    def str_(self, name: str, default: Any = _MISSING) -> str:
        value = self.get(name, default)
        if not isinstance(value, str) or not value:
            self.fail(name, f"expected a non-empty string, got {_show(value)}")
        return value

    def version(self, name: str, value: Any) -> str:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str) or not VERSION_RE.fullmatch(value):
            self.fail(name, f'expected a version (a positive integer such as "1"), got {_show(value)}')
        return value

    def versions(self, name: str, default: Any = _MISSING) -> tuple[str, ...]:
        items = self.get(name, default)
        if not isinstance(items, list):
            self.fail(name, f"expected a list of versions, got {_show(items)}")
        out = tuple(self.version(f"{name}[{i}]", v) for i, v in enumerate(items))
        dup = next((v for i, v in enumerate(out) if v in out[:i]), None)
        if dup is not None:
            self.fail(name, f"version {dup} is listed twice")
        return out

    def labels(self, name: str) -> dict[str, str]:
        value = self.get(name, {})
        if not isinstance(value, dict):
            self.fail(name, f"expected an object of string labels, got {_show(value)}")
        for key, val in value.items():
            if not key or "=" in key:
                self.fail(f"{name}.{key}", "a label name is non-empty and has no '='")
            if not isinstance(val, str):
                self.fail(f"{name}.{key}", f"expected a string, got {_show(val)}")
        return dict(sorted(value.items()))


# --- model spec ----------------------------------------------------------------------------------------


def parse_spec(model: str, raw: bytes) -> ModelSpecDoc:
    """``/mcp/models/<model>/spec``: the fields of ``ModelSpecDoc`` (``model`` optional, must match)."""
    check_name(model, "model name")
    d = _Doc(f"spec of {model}", raw, _SPEC_FIELDS)
    if d.get("model", model) != model:
        d.fail("model", f"names {_show(d.body['model'])} but the key is for {model!r}")
    versions = d.versions("versions")
    if not versions:
        d.fail("versions", "must list at least one version")
    on_demand = d.bool_("load_on_demand", False)
    replicas = d.int_("replicas", 1, lo=0)
    if replicas == 0 and not on_demand:
        d.fail("replicas", "0 needs load_on_demand: true (else the model is never loaded)")
    max_replicas = d.int_("max_replicas", 0, lo=0)
    if 0 < max_replicas < replicas:
        d.fail("max_replicas", f"must be 0 (no extra copies) or >= replicas ({replicas}), got {max_replicas}")
    min_replicas = d.int_("min_replicas", 0, lo=0)
    if min_replicas > replicas:
        d.fail(
            "min_replicas",
            f"must be 0 (no fewer than replicas) or <= replicas ({replicas}), got {min_replicas}",
        )
    fallback = d.get("fallback_version", None)
    delay = d.get("max_queue_delay_us", None)
    return ModelSpecDoc(
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
        paused_versions=_paused(d, versions),
    )


def _paused(d: _Doc, versions: tuple[str, ...]) -> tuple[str, ...]:
    paused = d.versions("paused_versions", [])
    unknown = [v for v in paused if v not in versions]
    if unknown:
        d.fail("paused_versions", f"version {unknown[0]} is not in versions {list(versions)}")
    return paused


def spec_to_json(doc: ModelSpecDoc) -> bytes:
    body = {f: getattr(doc, f) for f in _SPEC_FIELDS if f != "model"}
    body |= {
        "versions": list(doc.versions),
        "labels": dict(doc.labels),
        "paused_versions": list(doc.paused_versions),
    }
    return _checked(json.dumps(body, separators=(",", ":")).encode(), lambda raw: parse_spec(doc.model, raw))


# --- traffic (wanted) and routing (in force) -----------------------------------------------------------


def parse_traffic(model: str, raw: bytes) -> TrafficDoc:
    """``/mcp/models/<model>/traffic``: ``{"stable": "1", "canary": "2", "canary_percent": 10}``."""
    return _traffic(f"traffic of {check_name(model, 'model name')}", raw)


def parse_routing(model: str, raw: bytes) -> TrafficDoc:
    """``/mcp/models/<model>/routing``: the split in force, same format as traffic."""
    return _traffic(f"routing of {check_name(model, 'model name')}", raw)


def _traffic(what: str, raw: bytes | str) -> TrafficDoc:
    d = _Doc(what, raw, _TRAFFIC_FIELDS)
    stable = d.version("stable", d.get("stable"))
    canary_raw = d.get("canary", None)
    canary = None if canary_raw is None else d.version("canary", canary_raw)
    percent = d.int_("canary_percent", 0, lo=0, hi=100)
    if canary == stable:
        d.fail("canary", f"must differ from stable ({stable})")
    if percent > 0 and canary is None:
        d.fail("canary_percent", f"{percent} needs a canary version")
    return TrafficDoc(stable=stable, canary=canary, canary_percent=percent)


def traffic_to_json(doc: TrafficDoc) -> bytes:
    body: dict[str, Any] = {"stable": doc.stable}
    if doc.canary is not None or doc.canary_percent:
        body |= {"canary": doc.canary, "canary_percent": doc.canary_percent}
    return _checked(json.dumps(body, separators=(",", ":")).encode(), lambda raw: _traffic("traffic", raw))


def routing_to_json(doc: TrafficDoc) -> bytes:
    return traffic_to_json(doc)


# --- demand ---------------------------------------------------------------------------------------------


def parse_demand(model: str, router: str, raw: bytes) -> Demand:
    """``/mcp/demand/<model>/<router>``: ``{"requests": 3, "overflow": 0, "at": 1700000000.0}``."""
    check_name(model, "model name")
    check_name(router, "router id")
    d = _Doc(f"demand for {model} from {router}", raw, _DEMAND_FIELDS)
    return Demand(
        model=model,
        router=router,
        requests=d.int_("requests", 0, lo=0),
        overflow=d.int_("overflow", 0, lo=0),
        at=d.float_("at", 0.0),
    )


def demand_to_json(doc: Demand) -> bytes:
    raw = json.dumps(
        {"requests": doc.requests, "overflow": doc.overflow, "at": doc.at}, separators=(",", ":")
    ).encode()
    return _checked(raw, lambda r: parse_demand(doc.model, doc.router, r))


# --- worker record and load report (written by the worker) ----------------------------------------------


def parse_worker(worker_id: str, record_raw: bytes, load_raw: bytes | None, draining: bool) -> WorkerInfo:
    """``/mcp/workers/<id>`` (+ ``/load``). Only the fields the scheduler reads are checked."""
    check_name(worker_id, "worker id")
    rec = _Doc(f"worker record of {worker_id}", record_raw)
    if rec.get("worker_id", worker_id) != worker_id:
        rec.fail("worker_id", f"names {_show(rec.body['worker_id'])} but the key is for {worker_id!r}")
    stopped, last_beat, measured = False, 0.0, None
    if load_raw is not None:
        load = _Doc(f"load report of {worker_id}", load_raw)
        flag = load.get("stopped", "")
        if not isinstance(flag, (str, bool)):
            load.fail("stopped", f"expected the stop reason (a string), got {_show(flag)}")
        stopped = bool(flag)
        last_beat = load.float_("last_beat", 0.0)
        if load.get("device_room_bytes", None) is not None:  # absent or null: not measured
            measured = load.int_("device_room_bytes", lo=0)
    return WorkerInfo(
        id=worker_id,
        grpc=rec.str_("grpc"),
        zmq=rec.str_("zmq"),
        capacity_bytes=rec.int_("memory_capacity_bytes", lo=0),
        labels=rec.labels("labels"),
        stopped=stopped,
        draining=draining or bool(rec.body.get("draining")),  # a drain key, or the worker stopping
        last_beat=last_beat,
        incarnation=str(rec.body.get("incarnation", "")),
        device_room_bytes=measured,
    )


# --- replica record -------------------------------------------------------------------------------------


def parse_replica(model: str, version: str, worker: str, raw: bytes, revision: int) -> ReplicaInfo:
    """``/mcp/replicas/<m>/<v>/<worker>`` (``ReplicaRecord`` JSON); memory from ``info.memory_bytes``."""
    check_name(model, "model name")
    check_version(version)
    check_name(worker, "worker id")
    what = f"replica {model}/{version}@{worker}"
    d = _Doc(what, raw)  # rejects non-JSON, NaN and non-objects before the record's own parser sees it
    try:
        record = ReplicaRecord.from_json(raw, revision=revision, key=what)
    except DataLoss as exc:
        raise InvalidArgument(exc.message) from None
    except (OverflowError, ValueError, TypeError) as exc:
        raise InvalidArgument(f"{what}: not a valid replica record ({exc})") from None
    if not math.isfinite(record.since):
        d.fail("since", f"expected a finite number, got {record.since}")
    memory = record.info.get("memory_bytes", 0)
    if isinstance(memory, bool) or not isinstance(memory, int) or memory < 0:
        d.fail("info.memory_bytes", f"expected an integer >= 0, got {_show(memory)}")
    return ReplicaInfo(
        model=model,
        version=version,
        worker=worker,
        state=record.state,
        since=record.since,
        reason=record.reason,
        revision=revision,
        memory_bytes=memory,
        incarnation=str(record.info.get("incarnation", "")),
    )


def _checked(raw: bytes, parse: Any) -> bytes:
    parse(raw)
    return raw
