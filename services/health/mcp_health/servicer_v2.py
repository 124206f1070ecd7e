"""``mcpapi.v2.Health/ClusterHealth``: workers with heartbeat age, replicas by state, breaker levels."""

from __future__ import annotations

import json
import time
from collections import Counter

from mcp_health.detector import Detector
from mcpapi.v2 import health_pb2, health_pb2_grpc, model_pb2
from mcpcore.breaker import parse_breaker
from mcpcore.errors import InvalidArgument
from mcpcore.keys import Keyspace
from mcpcore.mirror import PrefixMirror

__all__ = ["HealthV2"]


class HealthV2(health_pb2_grpc.HealthServicer):
    def __init__(self, mirror: PrefixMirror, keys: Keyspace, detector: Detector) -> None:
        self._mirror, self._keys, self._detector = mirror, keys, detector

    def _doc_field(self, key: str, field: str, present: str) -> str:
        """``field`` of the JSON at ``key`` as text; ``present`` if the key lacks it; "" if no key."""
        raw = self._mirror.values.get(key)
        if raw is None:
            return ""
        try:
            value = json.loads(raw).get(field)
        except (ValueError, AttributeError):
            return present
        return str(value) if value else present

    async def ClusterHealth(self, request, context):  # type: ignore[no-untyped-def]
        now, local = time.time(), time.monotonic()
        states: Counter[str] = Counter()
        per_worker: Counter[str] = Counter()
        breakers = []
        for key, raw in self._mirror.values.items():
            if (rid := self._keys.parse_replica_key(key)) is not None:
                try:
                    states[json.loads(raw).get("state", "")] += 1
                except (ValueError, AttributeError):
                    continue
                per_worker[rid.worker] += 1
            elif (model := self._keys.parse_breaker_key(key)) is not None:
                try:
                    doc = parse_breaker(model, raw)
                except InvalidArgument:
                    continue
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
                drained=self._doc_field(self._keys.drain(w.id), "reason", "drained"),
                stopping=bool(self._doc_field(self._keys.worker(w.id), "draining", "")),
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
