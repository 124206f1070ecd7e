"""The router's routing table: an immutable snapshot of etcd, swapped atomically, read by every request.

Invariants:
- Nothing on the request path touches etcd: requests read ``Snapshots.table``, a frozen value that the watch
  loop replaces whole. With etcd down, routers keep routing on the last table.
- Only RUNNING replicas on registered workers are in a ring, and only records of the worker's current
  incarnation: a record left by an earlier process under the same worker id (restarted, killed) is stale
  and routes nothing. Virtual nodes are weighted by each worker's declared ``capacity``.
- A worker whose record vanished (its lease expired) while its ZeroMQ link is healthy is kept for
  ``grace_s`` with the replicas it had: the lease may have lapsed only because etcd was frozen or away.
  It is dropped at once when its link fails, when the grace runs out, or when it registers again (then
  its records, written in the same transaction as its record, say what it holds).
- A worker whose record says ``draining`` takes no new requests (it stays in the table so that its
  in-flight requests are answered).
- Per batch of etcd events only the models they touch are rebuilt; ``mcp_watch_apply_seconds`` measures
  event arrival → new table in use.
- A breaker document or policy that does not parse is rejected (logged, counted), and the last good value
  stays.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from mcp_router.dataplane import Batching, ModelConfigInfo, ModelMetadata, TensorMeta
from mcp_router.ring import HashRing
from mcpcore import wire
from mcpcore.breaker import BreakerDoc, parse_breaker, parse_policy
from mcpcore.errors import InvalidArgument
from mcpcore.keys import Keyspace
from mcpcore.mirror import PrefixMirror
from mcpcore.modelspec import DEFAULT_MAX_ONGOING_REQUESTS
from mcpcore.signing import RecordVerifier, local_claim, payload
from mcpcore.store import EventType, Store

__all__ = ["ModelRoute", "RoutingTable", "Snapshots", "Split", "WorkerEndpoint"]

log = logging.getLogger(__name__)


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
    record_certificate: str = ""  # the signed record's proof (mcpcore.signing), handed to direct clients
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


@dataclass
class _Ghost:
    """A worker whose record vanished while its link was healthy, and what it was serving then."""

    endpoint: WorkerEndpoint
    since: float
    running: dict[tuple[str, str], dict[str, Any]]  # (model, version) -> its replica record


class Snapshots:
    """List-then-watch of the keys a router needs; ``table`` is always a complete, consistent snapshot."""

    def __init__(
        self,
        store: Store,
        keys: Keyspace,
        *,
        link_ok: Callable[[str], bool] = lambda worker: False,
        grace_s: float = 30.0,
        on_rejected: Callable[[str], None] = lambda key: None,
        on_error: Callable[[str], None] = lambda loop: None,
        on_applied: Callable[[float], None] = lambda seconds: None,
        on_swap: Callable[[RoutingTable, RoutingTable], None] = lambda old, new: None,
        clock: Callable[[], float] = time.monotonic,
        verifier: RecordVerifier | None = None,
    ) -> None:
        self._keys = keys
        self._verifier = verifier  # given the CA: only records signed for their worker id are routed
        self._link_ok = link_ok
        self._grace = grace_s
        self._on_rejected = on_rejected
        self._on_swap = on_swap
        self._clock = clock
        self._workers: dict[str, WorkerEndpoint] = {}
        self._ghosts: dict[str, _Ghost] = {}
        self._replicas: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}  # model -> (v, w) -> record
        self._routing: dict[str, Split] = {}
        self._specs: dict[str, dict[str, Any]] = {}
        self._breakers: dict[str, BreakerDoc] = {}
        self._features_off: tuple[str, ...] = ()
        self._expiry: asyncio.Task[None] | None = None
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
        self._expiry = asyncio.create_task(self._expire_ghosts(), name="router-ghosts")

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            await asyncio.gather(self._expiry, return_exceptions=True)
        await self.mirror.stop()

    # -- ghosts ----------------------------------------------------------------------------------------
    @property
    def ghosts(self) -> frozenset[str]:
        """Workers kept past their lease because their link is healthy."""
        return frozenset(self._ghosts)

    def link_down(self, worker: str) -> None:
        """The forwarder lost ``worker``'s link: a worker kept past its lease goes now."""
        if self._ghosts.pop(worker, None) is not None:
            log.warning("worker %s: its link failed while its lease was gone; dropped from routing", worker)
            self._swap(set(), all_models=True)

    async def _expire_ghosts(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self._grace / 4))  # a periodic check, not a synchronisation
            try:
                self._expire_once()
            except Exception:
                log.exception("router snapshot: expiring workers kept past their lease failed; going on")

    def _expire_once(self) -> None:
        if self._ghosts:
            now = self._clock()
            gone = [
                w for w, g in self._ghosts.items() if now - g.since >= self._grace or not self._link_ok(w)
            ]
            for worker in gone:
                del self._ghosts[worker]
                log.warning("worker %s did not register again within %.0fs; dropped", worker, self._grace)
            if gone:
                self._swap(set(), all_models=True)

    def _lost(self, worker: str) -> None:
        """``worker``'s record is gone: keep it as a ghost if its link is healthy."""
        endpoint = self._workers.pop(worker, None)
        if endpoint is None or endpoint.draining or not self._link_ok(worker):
            return  # a drained worker revokes its lease on purpose
        running = {
            (model, version): doc
            for model, records in self._replicas.items()
            for (version, w), doc in records.items()
            if w == worker and _serves(doc, endpoint)
        }
        self._ghosts[worker] = _Ghost(endpoint, self._clock(), running)
        log.warning(
            "worker %s: its record is gone but its link is healthy; routing to it for up to %.0fs "
            "(etcd may be away)", worker, self._grace,
        )  # fmt: skip

    # -- applying events -------------------------------------------------------------------------------
    def _changed(self, keys: set[str]) -> None:
        dirty: set[str] = set()
        workers_changed = False
        for key in keys:
            value = self.mirror.values.get(key)
            try:
                touched = self._apply(EventType.DELETE if value is None else EventType.PUT, key, value or b"")
            except Exception:  # one bad value must not keep the others out of the table
                self._on_rejected("record")
                log.exception("router snapshot: could not apply %s; the rest goes on", key)
                continue
            workers_changed |= touched == "*"
            if touched and touched != "*":
                dirty.add(touched)
        if dirty or workers_changed or not self.table.revision:
            self._swap(dirty, all_models=workers_changed or not self.table.revision)

    def _apply(self, kind: EventType, key: str, value: bytes) -> str:
        """Apply one event; returns the model touched, "*" for a worker or the policy, "" for nothing."""
        k = self._keys
        deleted = kind is EventType.DELETE
        if (wk := k.parse_worker_key(key)) is not None:
            return self._apply_worker(wk[0], None if deleted else value) if not wk[1] else ""
        if (rid := k.parse_replica_key(key)) is not None:
            records = self._replicas.setdefault(rid.model, {})
            doc = None if deleted else _json(value)
            if isinstance(doc, dict):
                records[(rid.version, rid.worker)] = doc
            else:
                records.pop((rid.version, rid.worker), None)
            return rid.model
        if (mk := k.parse_model_key(key)) is not None:
            return self._apply_model(mk[0], mk[1], None if deleted else value)
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
        if key == k.breaker_config():
            return self._apply_policy(None if deleted else value)
        return ""

    def _apply_worker(self, worker: str, value: bytes | None) -> str:
        if value is None:
            self._lost(worker)
            return "*"
        doc = _json(value)
        why = _bad_worker_record(doc)
        if why:
            self._on_rejected("worker")
            log.warning("rejected the record of worker %s: %s", worker, why)
            return ""
        if self._verifier is not None:
            why = self._verify(worker, doc)
            if why:
                self._on_rejected("worker_signature")
                log.warning("rejected the record of worker %s: %s (nothing is sent there)", worker, why)
                return ""
        features = _features(doc.get("zmq_features"))
        if (
            self._verifier is not None
            and wire.FEATURE_LOCAL in features
            and not self._local_signed(worker, doc)
        ):
            # an unsigned offer of the same-host endpoint is not taken: the link goes to the signed endpoint
            log.warning(
                "worker %s: its offer of a same-host endpoint is not signed; using %s", worker, doc["zmq"]
            )
            features -= wire.SAME_HOST_FEATURES
        self._ghosts.pop(worker, None)  # registered again: its records say what it holds
        capacity = doc.get("capacity", 1.0)
        valid = isinstance(capacity, int | float) and not isinstance(capacity, bool) and 0 < capacity <= 64
        self._workers[worker] = WorkerEndpoint(
            worker,
            doc["zmq"],
            str(doc.get("curve_public_key", "")),
            str(doc.get("incarnation", "")),
            float(capacity) if valid else 1.0,
            bool(doc.get("draining")),
            str(doc.get("grpc", "")),
            features,
            str(doc.get("record_certificate", "")),
            str(doc.get("record_signature", "")),
            str(doc.get("record_local_signature", "")),
        )
        return "*"

    def _local_signed(self, worker: str, doc: dict[str, Any]) -> bool:
        """Its offer of a same-host endpoint carries a valid signature (``record_local_signature``)."""
        assert self._verifier is not None
        data = local_claim(_signed_payload(worker, doc))
        certificate, signature = doc.get("record_certificate"), doc.get("record_local_signature")
        return not self._verifier.verify(worker, data, certificate, signature)

    def _verify(self, worker: str, doc: dict[str, Any]) -> str:
        assert self._verifier is not None
        data = _signed_payload(worker, doc)
        return self._verifier.verify(worker, data, doc.get("record_certificate"), doc.get("record_signature"))

    def _apply_model(self, model: str, what: str, value: bytes | None) -> str:
        if what == "routing":
            split = None if value is None else _split(value)
            if split is None:
                self._routing.pop(model, None)
            else:
                self._routing[model] = split
            return model
        if what == "spec":
            doc = None if value is None else _json(value)
            if isinstance(doc, dict):
                self._specs[model] = doc
            else:
                self._specs.pop(model, None)
            return model
        return ""

    def _apply_policy(self, value: bytes | None) -> str:
        if value is None:
            self._features_off = ()
            return "*"
        try:
            self._features_off = parse_policy(value).features_off
        except InvalidArgument as exc:
            self._on_rejected("breaker_policy")
            log.warning("rejected the breaker policy: %s (the last good one stays)", exc.message)
            return ""
        return "*"

    # -- building the table ----------------------------------------------------------------------------
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
        workers = {**{w: g.endpoint for w, g in self._ghosts.items()}, **self._workers}
        self.table = RoutingTable(
            models=models,
            workers=workers,
            revision=max(1, self.mirror.revision),
            features_off=self._features_off,
        )
        self._on_swap(old, self.table)

    def _running(self, model: str) -> dict[tuple[str, str], dict[str, Any]]:
        """(version, worker) -> record of every replica that may take requests now."""
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for (version, worker), doc in self._replicas.get(model, {}).items():
            endpoint = self._workers.get(worker)
            if endpoint is not None and _serves(doc, endpoint):
                out[(version, worker)] = doc
        for worker, ghost in self._ghosts.items():  # what it served when its record went
            for (m, version), doc in ghost.running.items():
                if m == model:
                    out[(version, worker)] = doc
        return out

    def _build(self, model: str) -> ModelRoute | None:
        running: dict[str, dict[str, float]] = {}
        metadata: dict[str, ModelMetadata] = {}
        configs: dict[str, ModelConfigInfo] = {}
        idempotent: dict[str, bool] = {}
        ongoing: dict[str, int] = {}
        secondary: dict[str, frozenset[str]] = {}
        for (version, worker), doc in sorted(self._running(model).items()):
            endpoint = self._workers.get(worker) or self._ghosts[worker].endpoint
            running.setdefault(version, {})[worker] = endpoint.capacity
            if version not in metadata and (meta := _metadata(model, doc)) is not None:
                metadata[version] = meta
                if (config := _config(model, version, doc, meta)) is not None:
                    configs[version] = config
            info = doc.get("info") or {}
            # a record that does not say is taken as not idempotent: never run twice on a guess
            idempotent[version] = idempotent.get(version, True) and info.get("idempotent") is True
            names = info.get("secondary")
            if isinstance(names, list):
                secondary[version] = frozenset(str(n) for n in names)
            limit = info.get("max_ongoing_requests", DEFAULT_MAX_ONGOING_REQUESTS)
            if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
                ongoing[version] = min(ongoing.get(version, limit), limit)
        spec = self._specs.get(model, {})
        if not running and model not in self._routing and not spec:
            return None
        serving = tuple(sorted(running, key=int))
        metadata = {v: replace(m, versions=serving) for v, m in metadata.items()}
        configs = {v: replace(c, versions=serving) for v, c in configs.items()}
        fallback = spec.get("fallback_version")
        versions = spec.get("versions")
        declared = frozenset(str(v) for v in versions) if isinstance(versions, list) else frozenset()
        return ModelRoute(
            name=model,
            routing=self._routing.get(model),
            rings={v: HashRing(nodes) for v, nodes in running.items()},
            breaker=self._breakers.get(model, BreakerDoc()),
            fallback_version=str(fallback) if fallback not in (None, "") else None,
            load_on_demand=bool(spec.get("load_on_demand", False)),
            metadata=metadata,
            configs=configs,
            declared=declared | ({str(fallback)} if fallback not in (None, "") else frozenset()),
            idempotent=idempotent,
            max_ongoing=ongoing,
            secondary=secondary,
        )


_ENDPOINT = re.compile(r"(tcp://(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):[0-9]{1,5}|ipc://\S+)")
_Z85_KEY = re.compile(r"[0-9A-Za-z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")


def _bad_worker_record(doc: Any) -> str:
    """Why a worker record cannot be routed to ("" when it can): a bad endpoint or key must not reach a
    socket (ZeroMQ raises on them) and break routing for everyone else."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    endpoint, key = doc.get("zmq"), doc.get("curve_public_key", "")
    if not isinstance(endpoint, str) or not _ENDPOINT.fullmatch(endpoint):
        return f"zmq endpoint {endpoint!r} is not tcp://host:port or ipc://path"
    if key and (not isinstance(key, str) or not _Z85_KEY.fullmatch(key)):
        return "curve_public_key is not a 40-character z85 key"
    return ""


def _signed_payload(worker: str, doc: dict[str, Any]) -> bytes:
    """What the worker's record signature covers (mcpcore.signing.payload)."""
    key = str(doc.get("curve_public_key", ""))
    return payload(worker, str(doc.get("incarnation", "")), doc["zmq"], key, str(doc.get("grpc", "")))


def _features(value: Any) -> frozenset[str]:
    """A worker record's ``zmq_features``: the names it lists (anything else: none, single messages only)."""
    if not isinstance(value, list):
        return frozenset()
    return frozenset(v for v in value if isinstance(v, str))


def _serves(doc: Mapping[str, Any], endpoint: WorkerEndpoint) -> bool:
    """A RUNNING record written by the worker's current incarnation (records from before incarnations
    were recorded, and workers that record none, are taken as current)."""
    if doc.get("state") != "RUNNING":
        return False
    incarnation = (doc.get("info") or {}).get("incarnation")
    return not incarnation or not endpoint.incarnation or incarnation == endpoint.incarnation


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


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def _config(model: str, version: str, doc: Mapping[str, Any], meta: ModelMetadata) -> ModelConfigInfo | None:
    """The version's configuration from its replica record (None: a record from before workers wrote
    one, or one that is not well formed: ModelConfig then says so)."""
    summary = (doc.get("info") or {}).get("config")
    if not isinstance(summary, dict):
        return None
    batching = summary.get("dynamic_batching")
    dynamic = None
    if isinstance(batching, dict):
        sizes = batching.get("preferred_batch_sizes")
        dynamic = Batching(
            max_queue_delay_us=_int(batching.get("max_queue_delay_us")),
            preferred_batch_sizes=tuple(n for n in sizes if _int(n) > 0) if isinstance(sizes, list) else (),
            priority_levels=_int(batching.get("priority_levels"), 1),
            default_priority_level=_int(batching.get("default_priority_level"), 1),
            default_queue_timeout_us=_int(batching.get("default_queue_timeout_us")),
            max_queue_size=_int(batching.get("max_queue_size")),
        )
    device = summary.get("device")
    return ModelConfigInfo(
        name=model,
        version=version,
        backend=meta.platform,
        max_batch_size=_int(summary.get("max_batch_size")),
        inputs=meta.inputs,
        outputs=meta.outputs,
        dynamic_batching=dynamic,
        instance_count=_int(summary.get("instance_count"), 1),
        device=device if device in ("cpu", "gpu") else "cpu",
        versions=(),
        decoupled=summary.get("decoupled") is True,
    )
