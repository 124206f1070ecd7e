"""``Router``: the DataPlane over the routing table and the forwarder (the one request path of all APIs).

Per request: pick the version (explicit; else breaker level 3 → fallback; else the split in force, the
canary sticky by routing key and dropped while the breaker is above 0), pick the worker on that version's
ring by bounded loads, forward over ZeroMQ, and retry on the next distinct ring node when the worker went
away or said the request was not started. Retries draw from a budget (a fraction of recent requests), so
they cannot amplify an outage. Nothing here awaits etcd.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping

import numpy as np

from mcp_router.dataplane import (
    DataPlane,
    InferResult,
    ModelIndexEntry,
    ModelMetadata,
    RouteDecision,
)
from mcp_router.forwarder import Forwarder, WorkerGone
from mcp_router.ring import HashRing
from mcp_router.snapshot import ModelRoute, Snapshots
from mcp_router.split import SmoothWeightedRoundRobin, canary_for_key
from mcp_router.stats import RequestStats
from mcpapi.v2 import tensor_pb2
from mcpcore import wire
from mcpcore.errors import InvalidArgument, MCPError, NotFound, Unavailable, error_class

__all__ = ["RetryBudget", "Router"]

FLAG_SECONDARY_OFF = tensor_pb2.FLAG_SECONDARY_FEATURES_OFF


class RetryBudget:
    """Token bucket: each request earns ``ratio`` of a retry, each retry spends one (at most ``burst``)."""

    def __init__(self, ratio: float = 0.2, burst: float = 20.0) -> None:
        self._ratio, self._burst, self._tokens = ratio, burst, burst

    def earn(self) -> None:
        self._tokens = min(self._burst, self._tokens + self._ratio)

    def spend(self) -> bool:
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


class Router(DataPlane):
    def __init__(
        self,
        snapshots: Snapshots,
        forwarder: Forwarder,
        stats: RequestStats,
        *,
        load_factor: float = 1.25,
        default_timeout_s: float = 30.0,
        retry_budget: RetryBudget | None = None,
        scheduler_load: Callable[[str, str], Awaitable[None]] | None = None,
        scheduler_unload: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self._snap = snapshots
        self._fwd = forwarder
        self._stats = stats
        self._c = load_factor
        self._timeout = default_timeout_s
        self._budget = retry_budget or RetryBudget()
        self._rr: dict[str, SmoothWeightedRoundRobin] = {}
        self._scheduler_load = scheduler_load
        self._scheduler_unload = scheduler_unload
        self._ids = itertools.count()
        self._prefix = uuid.uuid4().hex[:8]

    # -- health and metadata ---------------------------------------------------------------------------
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return self._snap.synced.is_set()

    def _model(self, model: str) -> ModelRoute:
        route = self._snap.table.models.get(model)
        if route is None:
            raise NotFound(f"model {model} is not loaded; load it first (RepositoryModelLoad or LoadModel)")
        return route

    def model_ready(self, model: str, version: str = "") -> bool:
        route = self._snap.table.models.get(model)
        if route is None:
            return False
        return bool(route.rings.get(version)) if version else bool(route.rings)

    def model_metadata(self, model: str, version: str = "") -> ModelMetadata:
        route = self._model(model)
        if route.metadata is None or (version and version not in route.rings):
            raise NotFound(f"model {model}{'/' + version if version else ''} has no RUNNING replica")
        return route.metadata

    def index(self) -> list[ModelIndexEntry]:
        out = []
        for name, route in sorted(self._snap.table.models.items()):
            versions = sorted(route.rings, key=int) or ([route.routing.stable] if route.routing else [])
            for v in versions:
                ready = v in route.rings
                out.append(
                    ModelIndexEntry(
                        name, v, "READY" if ready else "UNAVAILABLE", "" if ready else "no RUNNING replica"
                    )
                )
        return out

    async def load(self, model: str, version: str = "") -> None:
        if self._scheduler_load is None:
            raise Unavailable("this router has no scheduler address configured")
        await self._scheduler_load(model, version)

    async def unload(self, model: str) -> None:
        if self._scheduler_unload is None:
            raise Unavailable("this router has no scheduler address configured")
        await self._scheduler_unload(model)

    # -- routing -----------------------------------------------------------------------------------------
    def _version(self, route: ModelRoute, version: str, key: str, now: float) -> tuple[str, int, int]:
        """(version, breaker level, header flags) for a request."""
        level = route.breaker_level(now)
        flags = FLAG_SECONDARY_OFF if level >= 2 else 0
        if version:
            return version, level, flags
        if level >= 3 and route.fallback_version and route.fallback_version in route.rings:
            return route.fallback_version, level, flags
        split = route.routing
        if split is None:
            if route.load_on_demand:
                self._stats.demand(route.name)
                raise Unavailable(f"model {route.name} is being loaded on demand; retry in a second")
            raise Unavailable(f"model {route.name} has no version in service yet; retry shortly")
        if split.canary and split.canary_percent and level == 0:
            if key:
                if canary_for_key(key, split.canary_percent, salt=route.name):
                    return split.canary, level, flags
            else:
                rr = self._rr.get(route.name)
                weights = {split.stable: 100 - split.canary_percent, split.canary: split.canary_percent}
                if rr is None or rr.weights != weights:
                    rr = self._rr[route.name] = SmoothWeightedRoundRobin(weights)
                return rr.pick(), level, flags
        return split.stable, level, flags

    def _ring(self, route: ModelRoute, version: str) -> HashRing:
        ring = route.rings.get(version)
        if ring is None:
            raise Unavailable(f"model {route.name} version {version} has no RUNNING replica; retry shortly")
        return ring

    def _pick(self, route: ModelRoute, ring: HashRing, key: str, exclude: set[str]) -> str:
        nodes = [n for n in ring.preference(key) if n not in exclude and not self._fwd.is_down(n)]
        if not nodes:
            raise Unavailable(f"no worker of model {route.name} could take the request; retry shortly")
        loads = self._fwd.loads(nodes)
        cap = self._c * (sum(loads.values()) + 1) / len(nodes)
        for node in nodes:
            if loads[node] < cap:
                return node
        self._stats.overflow(route.name)
        return nodes[0]

    def route(self, model: str, version: str = "", routing_key: str = "") -> RouteDecision:
        route = self._model(model)
        chosen, level, flags = self._version(route, version, routing_key, time.time())
        worker = self._pick(route, self._ring(route, chosen), routing_key or uuid.uuid4().hex, set())
        endpoint = self._snap.table.workers[worker]
        return RouteDecision(model, chosen, worker, endpoint.zmq, level, flags)

    # -- inference -------------------------------------------------------------------------------------
    async def infer(
        self,
        model: str,
        version: str,
        request_id: str,
        inputs: Mapping[str, np.ndarray],
        *,
        routing_key: str = "",
        priority: int = 0,
        timeout_s: float | None = None,
        outputs: tuple[str, ...] = (),
        parameters: Mapping[str, str] | None = None,
    ) -> InferResult:
        started = time.perf_counter()
        self._budget.earn()
        try:
            result = await self._infer(
                model,
                version,
                request_id,
                inputs,
                routing_key=routing_key,
                priority=priority,
                timeout_s=timeout_s,
            )
        except MCPError as err:
            self._stats.record(model, version, error_class(err), time.perf_counter() - started, err.code.name)
            raise
        self._stats.record(model, result.version, None, time.perf_counter() - started, "OK")
        if outputs:
            missing = [n for n in outputs if n not in result.outputs]
            if missing:
                raise InvalidArgument(
                    f"model {model} has no output(s) {missing}; it has {sorted(result.outputs)}"
                )
            return InferResult(
                result.model, result.version, result.worker_id, {n: result.outputs[n] for n in outputs}
            )
        return result

    async def _infer(
        self,
        model: str,
        version: str,
        request_id: str,
        inputs: Mapping[str, np.ndarray],
        *,
        routing_key: str,
        priority: int,
        timeout_s: float | None,
    ) -> InferResult:
        route = self._model(model)
        deadline = time.monotonic() + (timeout_s or self._timeout)
        rid = request_id or f"{self._prefix}-{next(self._ids)}"
        chosen, _level, flags = self._version(route, version, routing_key, time.time())
        key = routing_key or rid
        tried: set[str] = set()
        while True:
            ring = self._ring(self._snap.table.models.get(model, route), chosen)
            worker = self._pick(route, ring, key, tried)
            left = deadline - time.monotonic()
            header = tensor_pb2.TensorHeader(
                kind=tensor_pb2.KIND_REQUEST, request_id=rid, model=model, version=chosen,
                timeout_us=max(1, int(left * 1e6)), priority=priority, flags=flags,
            )  # fmt: skip
            try:
                reply = await self._fwd.send(worker, header, inputs, timeout_s=max(left, 0.001))
            except WorkerGone:
                tried.add(worker)
                if self._may_retry(deadline):
                    continue
                raise
            if reply.header.status_code:
                # the worker said it did not start the request (stopping, draining): another one may
                if reply.header.flags & wire.FLAG_RETRYABLE and self._may_retry(deadline):
                    tried.add(worker)
                    continue
                wire.raise_for_status(reply.header)
            return InferResult(model, reply.header.version or chosen, worker, reply.named())

    def _may_retry(self, deadline: float) -> bool:
        return time.monotonic() < deadline and self._budget.spend()
