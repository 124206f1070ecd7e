"""The direct path's route cache: ``Route`` asked of a router once per (model, version, key), kept a short
while, and what the answers taught about which model versions may run twice.

Invariants:
- A cached route lives at most its ttl (``async_client.MAX_ROUTE_TTL_S``), so traffic splits, breaker
  levels and moved replicas reach direct traffic within that; at most ``_ROUTES_KEPT`` are kept, the
  least recently used dropped first.
- One ``Route`` call per key at a time, on the client's own timeout, not a caller's: every request that
  wants the key waits on that one call, each within its own deadline.
- ``forget(model)`` drops the model's routes, and an answer asked before it is not cached (it may be
  stale): the direct path calls it whenever a worker says it does not hold the model, is draining, or its
  link fails.
- A keyless request's entry holds up to ``_SPREAD`` copies of its version (``RouteRequest.candidates``);
  each request takes the copy with the fewest of this client's requests in flight, so a client's keyless
  traffic spreads over the replicas as a router's does.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from mcpapi.v2 import inference_pb2
from mcpclient.convert import InferCall, route_of
from mcpclient.routers import Routers
from mcpclient.values import ClientStats, Route
from mcpcore.errors import DeadlineExceeded, MCPError

__all__ = ["RouteCache"]

_SPREAD = 8  # the most copies a keyless request's cache entry spreads over (RouteRequest.candidates)
_ROUTES_KEPT = 1024  # cached routes (one per model, version and routing key), least recent dropped

_Key = tuple[str, str, str]  # (model, version, routing key)


@dataclass(slots=True)
class _Cached:
    routes: tuple[Route, ...]  # one, or for a keyless request the copies it may go to
    expires: float
    turn: int = 0

    def pick(self, in_flight: Callable[[str], int]) -> Route:
        """The route whose worker has the fewest of this client's requests in flight (ties in turn)."""
        if len(self.routes) == 1:
            return self.routes[0]
        self.turn += 1
        n = len(self.routes)
        return min((self.routes[(self.turn + i) % n] for i in range(n)), key=lambda r: in_flight(r.worker_id))


class RouteCache:
    """Routes asked of ``routers`` and cached for ``ttl_s``; ``timeout_s`` bounds each Route call."""

    def __init__(self, routers: Routers, stats: ClientStats, *, ttl_s: float, timeout_s: float) -> None:
        self._routers = routers
        self._stats = stats
        self._ttl = ttl_s
        self._timeout = timeout_s
        self._routes: OrderedDict[_Key, _Cached] = OrderedDict()
        self._asking: dict[_Key, asyncio.Future[tuple[Route, ...]]] = {}
        self._forgotten: dict[str, int] = {}  # model -> how often its routes were dropped (stale answers)
        self._idempotent: dict[tuple[str, str], bool] = {}  # (model, version asked) -> may run twice

    def workers(self) -> set[str]:
        """The workers some cached route names."""
        return {r.worker_id for c in self._routes.values() for r in c.routes}

    async def get(self, call: InferCall, in_flight: Callable[[str], int]) -> Route:
        """``call``'s route: cached, or asked (within the call's deadline); of several copies the one with
        the fewest requests ``in_flight``."""
        model, cache_key = call.model, (call.model, call.version, call.key)
        cached = self._routes.get(cache_key)
        if cached is not None and cached.expires > time.monotonic():
            self._routes.move_to_end(cache_key)
            return cached.pick(in_flight)
        asking = self._asking.get(cache_key)
        if asking is None:  # one Route call per key at a time, on the client's deadline, not a caller's
            candidates = 1 if call.key else _SPREAD
            ask = self.ask(
                call.model, call.version, call.key, call.priority, time.monotonic() + self._timeout,
                candidates=candidates,
            )  # fmt: skip
            asking = asyncio.ensure_future(ask)
            self._asking[cache_key] = asking
            generation = self._forgotten.get(model, 0)
            asking.add_done_callback(lambda done: self._asked(cache_key, generation, done))
        left = call.left()
        if left <= 0:
            raise DeadlineExceeded(f"request to {model} ran out of time waiting for its route")
        try:
            routes = await asyncio.wait_for(asyncio.shield(asking), left)
        except TimeoutError:
            raise DeadlineExceeded(f"request to {model} ran out of time waiting for its route") from None
        cached = self._routes.get(cache_key)  # filled by ``_asked`` before its waiters resume
        return cached.pick(in_flight) if cached is not None else routes[0]

    def _asked(self, cache_key: _Key, generation: int, done: asyncio.Future[tuple[Route, ...]]) -> None:
        """A Route call ended: cache its answer, unless the model's routes were dropped meanwhile."""
        self._asking.pop(cache_key, None)
        if done.cancelled() or done.exception() is not None:  # (retrieved: its waiters raise it)
            return
        if self._forgotten.get(cache_key[0], 0) != generation:
            return  # asked before a failure dropped the model's routes: maybe stale
        self._routes[cache_key] = _Cached(done.result(), time.monotonic() + self._ttl)
        self._routes.move_to_end(cache_key)
        while len(self._routes) > _ROUTES_KEPT:
            self._routes.popitem(last=False)

    async def ask(
        self, model: str, version: str, key: str, priority: int, deadline: float, *, candidates: int = 1
    ) -> tuple[Route, ...]:
        """A router's Route answer now (never cached here): the route, then its alternatives."""
        request = inference_pb2.RouteRequest(
            model=model, version=version, routing_key=key, priority=priority, candidates=candidates
        )
        r = await self._routers.call("Route", request, deadline, idempotent=True)
        self._stats.route_calls += 1
        self._idempotent[(model, r.version)] = r.idempotent
        if not version:
            self._idempotent[(model, "")] = r.idempotent
        return tuple(route_of(model, answer) for answer in (r, *r.alternatives))

    async def is_idempotent(self, call: InferCall) -> bool:
        """Whether ``call``'s model version may run twice (a Route answer says; asked if not known yet)."""
        known = self._idempotent.get((call.model, call.version))
        if known is None:
            try:
                await self.ask(call.model, call.version, call.key, call.priority, call.deadline)
            except MCPError:
                return False  # not known: the safe answer
            known = self._idempotent.get((call.model, call.version), False)
        return known

    def forget(self, model: str) -> None:
        """Drop ``model``'s routes; an answer still on its way is not cached."""
        self._forgotten[model] = self._forgotten.get(model, 0) + 1
        for cache_key in [k for k in self._routes if k[0] == model]:
            del self._routes[cache_key]
