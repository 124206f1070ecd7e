"""``mcpapi.v2.ModelControl``: protobuf in, ``ControlService`` calls, protobuf out. No logic lives here."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from mcp_scheduler.service import ControlService, ModelStatusView
from mcp_scheduler.state import ClusterState, replica_info
from mcp_scheduler.view import ModelSpecDoc, ReplicaInfo, TrafficDoc
from mcpapi.v2 import control_pb2, control_pb2_grpc, model_pb2
from mcpcore.errors import InvalidArgument, ResourceExhausted
from mcpcore.keys import Keyspace
from mcpcore.records import BreakerDoc
from mcpcore.store import EventType

__all__ = ["ModelControlV2", "deadline_s", "spec_from_proto", "status_to_proto"]


def deadline_s(context: grpc.aio.ServicerContext) -> float | None:
    """What is left of the caller's deadline, less a margin to answer in (None: no deadline)."""
    left = context.time_remaining()
    return None if left is None else max(0.0, left - 0.25)


def spec_from_proto(spec: model_pb2.ModelSpec) -> ModelSpecDoc:
    if not spec.model:
        raise InvalidArgument("spec.model: required")
    if not spec.versions:
        raise InvalidArgument("spec.versions: name at least one version to load, e.g. ['1']")
    replicas = spec.replicas or (0 if spec.load_on_demand else 1)
    return ModelSpecDoc(
        model=spec.model,
        versions=tuple(spec.versions),
        replicas=replicas,
        min_replicas=spec.min_replicas,
        max_replicas=spec.max_replicas,
        priority=spec.priority,
        memory_bytes=spec.placement.memory_bytes,
        labels=dict(spec.placement.labels),
        fallback_version=spec.fallback_version or None,
        load_on_demand=spec.load_on_demand,
        latency_sensitivity=spec.qos.latency_sensitivity if spec.HasField("qos") else 0.5,
        max_batch_size=spec.batching.max_batch_size,
        max_queue_delay_us=spec.batching.max_queue_delay_us or None,
    )


def spec_to_proto(doc: ModelSpecDoc) -> model_pb2.ModelSpec:
    return model_pb2.ModelSpec(
        model=doc.model,
        versions=list(doc.versions),
        replicas=doc.replicas,
        min_replicas=doc.min_replicas,
        max_replicas=doc.max_replicas,
        placement=model_pb2.PlacementConstraints(memory_bytes=doc.memory_bytes, labels=dict(doc.labels)),
        priority=doc.priority,
        qos=model_pb2.QoS(latency_sensitivity=doc.latency_sensitivity),
        batching=model_pb2.BatchingPolicy(
            max_batch_size=doc.max_batch_size, max_queue_delay_us=doc.max_queue_delay_us or 0
        ),
        fallback_version=doc.fallback_version or "",
        load_on_demand=doc.load_on_demand,
    )


def replica_to_proto(r: ReplicaInfo) -> model_pb2.ReplicaStatus:
    return model_pb2.ReplicaStatus(
        model=r.model,
        version=r.version,
        worker_id=r.worker,
        state=model_pb2.ModelState.Value(r.state.value),
        since_unix_ms=int(r.since * 1000),
        reason=r.reason,
        revision=r.revision,
    )


def traffic_to_proto(t: TrafficDoc | None) -> model_pb2.TrafficSplit:
    if t is None:
        return model_pb2.TrafficSplit()
    return model_pb2.TrafficSplit(stable=t.stable, canary=t.canary or "", canary_percent=t.canary_percent)


def breaker_to_proto(model: str, b: BreakerDoc | None) -> model_pb2.BreakerState:
    b = b or BreakerDoc()
    return model_pb2.BreakerState(
        model=model,
        level=b.level,
        reason=b.reason,
        since_unix_ms=int(b.since * 1000),
        set_by=b.set_by,
        until_unix_ms=int((b.until or 0) * 1000),
    )


def status_to_proto(s: ModelStatusView) -> model_pb2.ModelStatus:
    state = s.state
    return model_pb2.ModelStatus(
        model=s.model,
        state=model_pb2.ModelState.Value(state.value) if state else model_pb2.STATE_UNSPECIFIED,
        replicas=[replica_to_proto(r) for r in s.replicas],
        spec=spec_to_proto(s.spec) if s.spec else None,
        traffic=traffic_to_proto(s.routing),
        breaker=breaker_to_proto(s.model, s.breaker),
        pending=_pending(s),
    )


def _pending(s: ModelStatusView) -> str:
    doc = s.status
    parts = [p for p in (doc.error, doc.pending) if p]
    if doc.traffic_rejected:
        parts.append(f"traffic key rejected, last good split stays: {doc.traffic_rejected}")
    return "; ".join(parts)


class ModelControlV2(control_pb2_grpc.ModelControlServicer):
    def __init__(self, service: ControlService, state: ClusterState, keys: Keyspace) -> None:
        self._s = service
        self._state = state
        self._keys = keys
        self._encoded: dict[str, tuple[tuple[object, ...], bytes]] = {}  # model -> (its parts, its status)

    async def LoadModel(self, request, context):  # type: ignore[no-untyped-def]
        status = await self._s.load_model(spec_from_proto(request.spec), timeout_s=deadline_s(context))
        return control_pb2.LoadModelResponse(status=status_to_proto(status))

    async def UnloadModel(self, request, context):  # type: ignore[no-untyped-def]
        status = await self._s.unload_model(request.model, request.version, timeout_s=deadline_s(context))
        return control_pb2.UnloadModelResponse(status=status_to_proto(status))

    async def GetModelStatus(self, request, context):  # type: ignore[no-untyped-def]
        return control_pb2.GetModelStatusResponse(
            status=status_to_proto(self._s.status(request.model, request.version))
        )

    async def ListModels(self, request, context):  # type: ignore[no-untyped-def]
        response = control_pb2.ListModelsResponse()
        listed = set()
        async for chunk in self._s.list_models(request.prefix):
            for s in chunk:
                response.models.add().MergeFromString(self._status_bytes(s))
                listed.add(s.model)
        if not request.prefix:  # forget models that are gone
            for model in [m for m in self._encoded if m not in listed]:
                del self._encoded[model]
        return response

    def _status_bytes(self, s: ModelStatusView) -> bytes:
        """``status_to_proto(s)``, encoded once per change of what it is made of: the state replaces a
        document's object whenever its etcd value changes, so the same objects mean the same status."""
        parts = (s.spec, s.traffic, s.routing, s.status, s.breaker, *s.replicas)
        hit = self._encoded.get(s.model)
        if (
            hit is not None
            and len(hit[0]) == len(parts)
            and all(a is b for a, b in zip(hit[0], parts, strict=True))
        ):
            return hit[1]
        encoded = status_to_proto(s).SerializeToString()
        self._encoded[s.model] = (parts, encoded)
        return encoded

    async def SetTraffic(self, request, context):  # type: ignore[no-untyped-def]
        t = request.traffic
        doc = TrafficDoc(stable=t.stable, canary=t.canary or None, canary_percent=t.canary_percent)
        traffic, pending = await self._s.set_traffic(request.model, doc)
        return control_pb2.SetTrafficResponse(traffic=traffic_to_proto(traffic), pending=pending)

    async def PauseModel(self, request, context):  # type: ignore[no-untyped-def]
        status = await self._s.set_paused(request.model, request.version, True, timeout_s=deadline_s(context))
        return control_pb2.PauseModelResponse(status=status_to_proto(status))

    async def ResumeModel(self, request, context):  # type: ignore[no-untyped-def]
        status = await self._s.set_paused(
            request.model, request.version, False, timeout_s=deadline_s(context)
        )
        return control_pb2.ResumeModelResponse(status=status_to_proto(status))

    async def GetBreaker(self, request, context):  # type: ignore[no-untyped-def]
        return control_pb2.GetBreakerResponse(
            breaker=breaker_to_proto(request.model, self._s.breaker(request.model))
        )

    async def SetBreaker(self, request, context):  # type: ignore[no-untyped-def]
        doc = BreakerDoc(
            level=request.level,
            reason=request.reason,
            set_by=request.set_by or "operator",
            until=request.until_unix_ms / 1000 if request.until_unix_ms else None,
        )
        result = await self._s.set_breaker(request.model, doc, clear=request.clear)
        return control_pb2.SetBreakerResponse(breaker=breaker_to_proto(request.model, result))

    async def Drain(self, request, context):  # type: ignore[no-untyped-def]
        replicas = await self._s.drain(request.worker_id, request.reason)
        return control_pb2.DrainResponse(replicas=[replica_to_proto(r) for r in replicas])

    async def Undrain(self, request, context):  # type: ignore[no-untyped-def]
        return control_pb2.UndrainResponse(reason=await self._s.undrain(request.worker_id))

    async def WatchModels(self, request, context) -> AsyncIterator[control_pb2.ModelEvent]:  # type: ignore[no-untyped-def]
        wanted = set(request.models)
        sub = self._state.subscribe()
        try:
            if request.initial_snapshot:
                async for chunk in self._s.list_models():
                    for status in chunk:
                        if not wanted or status.model in wanted:
                            for event in self._snapshot_events(status):
                                yield event
                yield control_pb2.ModelEvent(
                    kind=control_pb2.EVENT_KIND_SYNCED, revision=self._state.revision
                )
            while True:
                item = await sub.queue.get()
                if item is None or sub.overflowed:
                    raise ResourceExhausted(
                        "this watch fell too far behind the cluster's changes; watch again"
                    )
                event = self._event(*item)
                if event is not None and (not wanted or event.model in wanted):
                    yield event
        except asyncio.CancelledError:
            raise
        finally:
            self._state.unsubscribe(sub)

    def _snapshot_events(self, s: ModelStatusView) -> list[control_pb2.ModelEvent]:
        rev = self._state.revision
        events = [
            _ev(control_pb2.EVENT_KIND_REPLICA, s.model, rev, replica=replica_to_proto(r)) for r in s.replicas
        ]
        if s.spec is not None:
            events.append(_ev(control_pb2.EVENT_KIND_SPEC, s.model, rev, spec=spec_to_proto(s.spec)))
        if s.routing is not None:
            events.append(
                _ev(control_pb2.EVENT_KIND_TRAFFIC, s.model, rev, traffic=traffic_to_proto(s.routing))
            )
        if s.breaker is not None:
            breaker = breaker_to_proto(s.model, s.breaker)
            events.append(_ev(control_pb2.EVENT_KIND_BREAKER, s.model, rev, breaker=breaker))
        return events

    def _event(self, kind: EventType, key: str, value: bytes, rev: int) -> control_pb2.ModelEvent | None:
        """The ModelEvent for one etcd event, or None when the key is not news for watchers."""
        k = self._keys
        removed = kind is EventType.DELETE
        try:
            if (rid := k.parse_replica_key(key)) is not None:
                if removed:
                    replica = model_pb2.ReplicaStatus(
                        model=rid.model, version=rid.version, worker_id=rid.worker
                    )
                    return _ev(control_pb2.EVENT_KIND_REPLICA_REMOVED, rid.model, rev, replica=replica)
                info = replica_info(key, value, rev)
                return _ev(control_pb2.EVENT_KIND_REPLICA, rid.model, rev, replica=replica_to_proto(info))
            if (mk := k.parse_model_key(key)) is not None:
                model, what = mk
                if what == "spec" and removed:
                    return _ev(control_pb2.EVENT_KIND_MODEL_REMOVED, model, rev)
                if what == "spec":
                    return _ev(
                        control_pb2.EVENT_KIND_SPEC,
                        model,
                        rev,
                        spec=spec_to_proto(ModelSpecDoc.parse(key, value)),
                    )
                if what == "routing":
                    traffic = None if removed else TrafficDoc.parse(key, value)
                    return _ev(control_pb2.EVENT_KIND_TRAFFIC, model, rev, traffic=traffic_to_proto(traffic))
            if (model := k.parse_breaker_key(key)) is not None:
                breaker = None if removed else BreakerDoc.parse(key, value)
                return _ev(
                    control_pb2.EVENT_KIND_BREAKER, model, rev, breaker=breaker_to_proto(model, breaker)
                )
        except InvalidArgument:
            return None  # a rejected document is not news; the status explains it
        return None


def _ev(kind: int, model: str, revision: int, **payload: object) -> control_pb2.ModelEvent:
    return control_pb2.ModelEvent(kind=kind, model=model, revision=revision, **payload)
