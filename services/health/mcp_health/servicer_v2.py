"""``mcpapi.v2.Health/ClusterHealth``: workers with heartbeat age, replicas by state, breaker levels.

The breaker levels shown are the ones in force here: the last good document of each model (the breaker
loop's ``OperatorDocs``), so a malformed write shows the level that still holds, not nothing."""

from __future__ import annotations

import time
from collections import Counter

from mcp_health.detector import Detector
from mcpapi.v2 import health_pb2, health_pb2_grpc, model_pb2
from mcpcore.errors import InvalidArgument
from mcpcore.keys import Keyspace
from mcpcore.mirror import PrefixMirror
from mcpcore.records import BreakerDoc, DrainDoc, OperatorDocs, ReplicaRecord, WorkerRecord

__all__ = ["HealthV2"]


class HealthV2(health_pb2_grpc.HealthServicer):
    def __init__(
        self, mirror: PrefixMirror, keys: Keyspace, detector: Detector, breakers: OperatorDocs[object]
    ) -> None:
        self._mirror, self._keys, self._detector, self._breakers = mirror, keys, detector, breakers

    def _drained(self, worker: str) -> str:
        """Why ``worker`` is drained ("drained" when its drain says not); "" when it is not."""
        key = self._keys.drain(worker)
        raw = self._mirror.values.get(key)
        if raw is None:
            return ""
        try:
            return DrainDoc.parse(key, raw).reason or "drained"
        except InvalidArgument:
            return "drained"

    def _stopping(self, worker: str) -> bool:
        key = self._keys.worker(worker)
        raw = self._mirror.values.get(key)
        try:
            return raw is not None and bool(WorkerRecord.parse(key, raw).draining)
        except InvalidArgument:
            return False

    async def ClusterHealth(self, request, context):  # type: ignore[no-untyped-def]
        now, local = time.time(), time.monotonic()
        states: Counter[str] = Counter()
        per_worker: Counter[str] = Counter()
        breakers = []
        for key, raw in self._mirror.values.items():
            if (rid := self._keys.parse_replica_key(key)) is not None:
                try:
                    states[ReplicaRecord.parse(key, raw).state.value] += 1
                except InvalidArgument:
                    continue
                per_worker[rid.worker] += 1
            elif (model := self._keys.parse_breaker_key(key)) is not None:
                doc = self._breakers.get(key)
                if not isinstance(doc, BreakerDoc):
                    continue  # rejected, with no good document before it: absent
                state = model_pb2.BreakerState(model=model, level=doc.level_at(now), reason=doc.reason)
                state.since_unix_ms, state.set_by = int(doc.since * 1000), doc.set_by
                state.until_unix_ms = int((doc.until or 0) * 1000)
                breakers.append(state)
        workers = [
            health_pb2.WorkerHealth(
                worker_id=w.id,
                alive=w.alive,
                heartbeat_age_ms=int(max(0.0, local - w.arrived) * 1000),  # on this host's clock
                last_active_unix_ms=int(w.last_active * 1000),
                replicas=per_worker[w.id],
                queue_depth=w.queue_depth,
                drained=self._drained(w.id),
                stopping=self._stopping(w.id),
            )
            for w in sorted(self._detector.workers.values(), key=lambda w: w.id)
        ]
        by_state = [
            health_pb2.StateCount(state=model_pb2.ModelState.Value(s), count=n)
            for s, n in sorted(states.items())
            if s in model_pb2.ModelState.keys()  # noqa: SIM118  (an enum wrapper, not a dict)
        ]
        return health_pb2.ClusterHealthResponse(
            workers=workers, replicas_by_state=by_state, breakers=breakers, as_of_unix_ms=int(now * 1000)
        )
