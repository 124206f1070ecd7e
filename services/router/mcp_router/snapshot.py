"""The router's view of etcd: the routing table (``routing.table``) rebuilt from the watch and swapped
atomically, read by every request.

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
- Every value is read through its ``mcpcore.records`` type. Operator documents (spec, breaker, breaker
  policy) get the mesh's one rule (``records.OperatorDocs``): one that does not parse is logged, counted,
  published to ``/mcp/rejected/router/<id>``, and the last good value stays. A process document (worker
  record, replica record, routing) that does not parse is absent.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mcp_router.routing.table import ModelRoute, RoutingTable, Split, WorkerEndpoint, build_route, serves
from mcpcore import wire
from mcpcore.errors import InvalidArgument
from mcpcore.keys import Keyspace
from mcpcore.mirror import PrefixMirror
from mcpcore.record_signing import RecordVerifier, local_claim, payload
from mcpcore.records import (
    BreakerDoc,
    BreakerPolicy,
    ModelSpecDoc,
    ReplicaRecord,
    TrafficDoc,
    WorkerRecord,
    published_operator_docs,
)
from mcpcore.store import EventType, Store

__all__ = ["Snapshots"]

log = logging.getLogger(__name__)


@dataclass
class _Ghost:
    """A worker whose record vanished while its link was healthy, and what it was serving then."""

    endpoint: WorkerEndpoint
    since: float
    running: dict[tuple[str, str], ReplicaRecord]  # (model, version) -> its replica record


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
        instance: str = "router",
    ) -> None:
        self._keys = keys
        self.operator_docs, self.rejections_publisher = published_operator_docs(
            "router",
            instance,
            store,
            keys.rejected("router", instance),
            on_rejected=on_rejected,
            on_error=on_error,
        )
        self._verifier = verifier  # given the CA: only records signed for their worker id are routed
        self._link_ok = link_ok
        self._grace = grace_s
        self._on_rejected = on_rejected
        self._on_swap = on_swap
        self._clock = clock
        self._workers: dict[str, WorkerEndpoint] = {}
        self._ghosts: dict[str, _Ghost] = {}
        self._replicas: dict[str, dict[tuple[str, str], ReplicaRecord]] = {}  # model -> (v, w) -> record
        self._routing: dict[str, Split] = {}
        self._specs: dict[str, ModelSpecDoc] = {}
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
        self.rejections_publisher.start()

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            await asyncio.gather(self._expiry, return_exceptions=True)
        await self.rejections_publisher.stop()
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
            if w == worker and serves(doc, endpoint)
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
            record = None if deleted else _parsed(key, lambda: ReplicaRecord.parse(key, value))
            if record is not None:
                records[(rid.version, rid.worker)] = record
            else:
                records.pop((rid.version, rid.worker), None)
            return rid.model
        if (mk := k.parse_model_key(key)) is not None:
            return self._apply_model(key, mk[0], mk[1], None if deleted else value)
        if (model := k.parse_breaker_key(key)) is not None:
            doc = self.operator_docs.apply(key, None if deleted else value, BreakerDoc.parse, "breaker")
            if doc is None:
                self._breakers.pop(model, None)
            else:
                self._breakers[model] = doc
            return model
        if key == k.breaker_config():
            policy = self.operator_docs.apply(
                key, None if deleted else value, BreakerPolicy.parse, "breaker_policy"
            )
            self._features_off = policy.features_off if policy is not None else ()
            return "*"
        return ""

    def _apply_worker(self, worker: str, value: bytes | None) -> str:
        if value is None:
            self._lost(worker)
            return "*"
        try:
            doc = WorkerRecord.parse(self._keys.worker(worker), value)
        except InvalidArgument as exc:
            why = exc.message
        else:
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
        features = frozenset(doc.zmq_features)
        if (
            self._verifier is not None
            and wire.FEATURE_LOCAL in features
            and not self._local_signed(worker, doc)
        ):
            # an unsigned offer of the same-host endpoint is not taken: the link goes to the signed endpoint
            log.warning(
                "worker %s: its offer of a same-host endpoint is not signed; using %s", worker, doc.zmq
            )
            features -= wire.SAME_HOST_FEATURES
        self._ghosts.pop(worker, None)  # registered again: its records say what it holds
        self._workers[worker] = WorkerEndpoint(
            worker,
            doc.zmq,
            doc.curve_public_key,
            doc.incarnation,
            doc.capacity,
            bool(doc.draining),
            doc.grpc,
            features,
            doc.record_certificate,
            doc.record_signature,
            doc.record_local_signature,
        )
        return "*"

    def _local_signed(self, worker: str, doc: WorkerRecord) -> bool:
        """Its offer of a same-host endpoint carries a valid signature (``record_local_signature``)."""
        assert self._verifier is not None
        data = local_claim(_signed_payload(worker, doc))
        return not self._verifier.verify(worker, data, doc.record_certificate, doc.record_local_signature)

    def _verify(self, worker: str, doc: WorkerRecord) -> str:
        assert self._verifier is not None
        data = _signed_payload(worker, doc)
        return self._verifier.verify(worker, data, doc.record_certificate, doc.record_signature)

    def _apply_model(self, key: str, model: str, what: str, value: bytes | None) -> str:
        if what == "routing":
            routing = None if value is None else _parsed(key, lambda: TrafficDoc.parse(key, value))
            if routing is None:
                self._routing.pop(model, None)
            else:
                self._routing[model] = Split(routing.stable, routing.canary, routing.canary_percent)
            return model
        if what == "spec":
            spec = self.operator_docs.apply(key, value, ModelSpecDoc.parse, "spec")
            if spec is None:
                self._specs.pop(model, None)
            else:
                self._specs[model] = spec
            return model
        return ""

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

    def _running(self, model: str) -> dict[tuple[str, str], ReplicaRecord]:
        """(version, worker) -> record of every replica that may take requests now."""
        out: dict[tuple[str, str], ReplicaRecord] = {}
        for (version, worker), doc in self._replicas.get(model, {}).items():
            endpoint = self._workers.get(worker)
            if endpoint is not None and serves(doc, endpoint):
                out[(version, worker)] = doc
        for worker, ghost in self._ghosts.items():  # what it served when its record went
            for (m, version), doc in ghost.running.items():
                if m == model:
                    out[(version, worker)] = doc
        return out

    def _build(self, model: str) -> ModelRoute | None:
        running = self._running(model)
        capacity = {
            w: (self._workers.get(w) or self._ghosts[w].endpoint).capacity for _, w in running
        }  # fmt: skip
        return build_route(
            model, running, capacity, spec=self._specs.get(model), routing=self._routing.get(model),
            breaker=self._breakers.get(model),
        )  # fmt: skip


_ENDPOINT = re.compile(r"(tcp://(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):[0-9]{1,5}|ipc://\S+)")
_Z85_KEY = re.compile(r"[0-9A-Za-z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")


def _bad_worker_record(doc: WorkerRecord) -> str:
    """Why a worker record cannot be routed to ("" when it can): a bad endpoint or key must not reach a
    socket (ZeroMQ raises on them) and break routing for everyone else."""
    if not _ENDPOINT.fullmatch(doc.zmq):
        return f"zmq endpoint {doc.zmq!r} is not tcp://host:port or ipc://path"
    if doc.curve_public_key and not _Z85_KEY.fullmatch(doc.curve_public_key):
        return "curve_public_key is not a 40-character z85 key"
    return ""


def _signed_payload(worker: str, doc: WorkerRecord) -> bytes:
    """What the worker's record signature covers (mcpcore.record_signing.payload)."""
    return payload(worker, doc.incarnation, doc.zmq, doc.curve_public_key, doc.grpc)


def _parsed(key: str, parse: Callable[[], Any]) -> Any:
    """A process-written document, or None (absent) when it does not parse."""
    try:
        return parse()
    except InvalidArgument as exc:
        log.warning("ignoring %s: %s", key, exc.message)
        return None
