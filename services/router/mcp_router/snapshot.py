"""The router's routing table: an immutable snapshot of etcd, swapped atomically, read by every request.

Invariants:
- Nothing on the request path touches etcd: requests read ``Snapshots.table``, a frozen value that the watch
  loop replaces whole. With etcd down, routers keep routing on the last table.
- Only RUNNING replicas on registered workers are in a ring; a worker whose lease lapsed leaves every ring
  in the same swap.
- Per batch of etcd events only the models they touch are rebuilt; ``mcp_watch_apply_seconds`` measures
  event arrival → new table in use.
- A breaker document that does not parse is rejected (logged, counted), and the last good level stays.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mcp_router.dataplane import ModelMetadata, TensorMeta
from mcp_router.ring import HashRing
from mcpcore.breaker import BreakerDoc, parse_breaker
from mcpcore.errors import InvalidArgument
from mcpcore.keys import Keyspace
from mcpcore.mirror import PrefixMirror
from mcpcore.store import EventType, Store

__all__ = ["ModelRoute", "RoutingTable", "Snapshots", "Split", "WorkerEndpoint"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerEndpoint:
    id: str
    zmq: str
    curve_public_key: str = ""


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
    metadata: ModelMetadata | None = None

    def breaker_level(self, now: float) -> int:
        return self.breaker.level_at(now)


@dataclass(frozen=True)
class RoutingTable:
    models: Mapping[str, ModelRoute] = field(default_factory=dict)
    workers: Mapping[str, WorkerEndpoint] = field(default_factory=dict)
    revision: int = 0


class Snapshots:
    """List-then-watch of the keys a router needs; ``table`` is always a complete, consistent snapshot."""

    def __init__(
        self,
        store: Store,
        keys: Keyspace,
        *,
        on_rejected: Callable[[str], None] = lambda key: None,
        on_error: Callable[[str], None] = lambda loop: None,
        on_applied: Callable[[float], None] = lambda seconds: None,
        on_swap: Callable[[RoutingTable, RoutingTable], None] = lambda old, new: None,
    ) -> None:
        self._keys = keys
        self._on_rejected = on_rejected
        self._on_swap = on_swap
        self._workers: dict[str, WorkerEndpoint] = {}
        self._replicas: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}  # model -> (v, w) -> record
        self._routing: dict[str, Split] = {}
        self._specs: dict[str, dict[str, Any]] = {}
        self._breakers: dict[str, BreakerDoc] = {}
        self.table = RoutingTable()
        self.mirror = PrefixMirror(
            store, keys.prefix + "/", on_change=self._changed, on_error=on_error, on_applied=on_applied,
            name="router-snapshot",
        )  # fmt: skip

    @property
    def synced(self) -> asyncio.Event:
        return self.mirror.synced

    async def start(self) -> None:
        await self.mirror.start()

    async def stop(self) -> None:
        await self.mirror.stop()

    def _changed(self, keys: set[str]) -> None:
        dirty: set[str] = set()
        workers_changed = False
        for key in keys:
            value = self.mirror.values.get(key)
            touched = self._apply(EventType.DELETE if value is None else EventType.PUT, key, value or b"")
            workers_changed |= touched == "*"
            if touched and touched != "*":
                dirty.add(touched)
        if dirty or workers_changed or not self.table.revision:
            self._swap(dirty, all_models=workers_changed or not self.table.revision)

    # -- applying events: return the model touched, "*" for a worker, "" for nothing ------------------
    def _apply(self, kind: EventType, key: str, value: bytes) -> str:
        k = self._keys
        deleted = kind is EventType.DELETE
        if (wk := k.parse_worker_key(key)) is not None:
            if wk[1]:
                return ""
            if deleted:
                self._workers.pop(wk[0], None)
            else:
                doc = _json(value)
                if isinstance(doc, dict) and isinstance(doc.get("zmq"), str):
                    self._workers[wk[0]] = WorkerEndpoint(
                        wk[0], doc["zmq"], str(doc.get("curve_public_key", ""))
                    )
            return "*"
        if (rid := k.parse_replica_key(key)) is not None:
            records = self._replicas.setdefault(rid.model, {})
            doc = None if deleted else _json(value)
            if isinstance(doc, dict):
                records[(rid.version, rid.worker)] = doc
            else:
                records.pop((rid.version, rid.worker), None)
            return rid.model
        if (mk := k.parse_model_key(key)) is not None:
            model, what = mk
            if what == "routing":
                split = None if deleted else _split(value)
                if split is None:
                    self._routing.pop(model, None)
                else:
                    self._routing[model] = split
                return model
            if what == "spec":
                doc = None if deleted else _json(value)
                if isinstance(doc, dict):
                    self._specs[model] = doc
                else:
                    self._specs.pop(model, None)
                return model
            return ""
        if (model := k.parse_breaker_key(key)) is not None:
            if deleted:
                self._breakers.pop(model, None)
                return model
            try:
                self._breakers[model] = parse_breaker(model, value)
            except InvalidArgument as exc:
                self._on_rejected("breaker")
                log.warning("rejected %s: %s (the last good level stays)", key, exc.message)
                return ""
            return model
        return ""

    def _swap(self, dirty: set[str], *, all_models: bool) -> None:
        old = self.table
        models = dict(old.models)
        names = (
            set(models) | set(self._specs) | set(self._replicas) | set(self._routing) if all_models else dirty
        )
        for name in names:
            route = self._build(name)
            if route is None:
                models.pop(name, None)
            else:
                models[name] = route
        self.table = RoutingTable(
            models=models, workers=dict(self._workers), revision=max(1, self.mirror.revision)
        )
        self._on_swap(old, self.table)

    def _build(self, model: str) -> ModelRoute | None:
        records = self._replicas.get(model, {})
        running: dict[str, dict[str, float]] = {}
        metadata = None
        for (version, worker), doc in sorted(records.items()):
            if doc.get("state") == "RUNNING" and worker in self._workers:
                running.setdefault(version, {})[worker] = 1.0
                metadata = metadata or _metadata(model, doc)
        spec = self._specs.get(model, {})
        if not running and model not in self._routing and not spec:
            return None
        if metadata is not None:
            metadata = ModelMetadata(
                model, tuple(sorted(running, key=int)), metadata.platform, metadata.inputs, metadata.outputs
            )
        fallback = spec.get("fallback_version")
        return ModelRoute(
            name=model,
            routing=self._routing.get(model),
            rings={v: HashRing(nodes) for v, nodes in running.items()},
            breaker=self._breakers.get(model, BreakerDoc()),
            fallback_version=str(fallback) if fallback not in (None, "") else None,
            load_on_demand=bool(spec.get("load_on_demand", False)),
            metadata=metadata,
        )


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _split(raw: bytes) -> Split | None:
    doc = _json(raw)
    if not isinstance(doc, dict) or not doc.get("stable"):
        return None
    canary = doc.get("canary")
    return Split(str(doc["stable"]), str(canary) if canary else None, int(doc.get("canary_percent") or 0))


def _metadata(model: str, doc: Mapping[str, Any]) -> ModelMetadata | None:
    info = doc.get("info") or {}
    try:
        inputs = tuple(TensorMeta(t["name"], t["dtype"], tuple(t["shape"])) for t in info.get("inputs", ()))
        outputs = tuple(TensorMeta(t["name"], t["dtype"], tuple(t["shape"])) for t in info.get("outputs", ()))
    except (KeyError, TypeError):
        return None
    return ModelMetadata(model, (), str(info.get("platform", "")), inputs, outputs)
