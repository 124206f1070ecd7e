"""``AsyncMeshClient``: the mesh from asyncio code. It checks each call, then hands it to the path that
serves it: a router (``routers``), or with ``direct=True`` the worker a cached route names (``direct``, over
``routes``), falling back to a router when the direct path says so; control calls go to the scheduler
(``control``).

Invariants:
- Through the router: the mesh's v2 ``Infer``, moved between routers only by ``routers``' rules; a call
  whose router went away mid-call moves on only when its model version is idempotent (learned from
  ``Route`` answers, asked once per model when unknown).
- ``direct=True`` answers from the worker, or (only when the direct path says the request provably did
  not start there, or may be resent because its version is idempotent) through a router.
- ``route_ttl_s`` is at most ``MAX_ROUTE_TTL_S``, so what the mesh decides reaches direct traffic within it.
- Every failure is an ``MCPError`` (``mcpcore.errors``) with the server's message.
- Create and use it on one event loop; ``close()`` releases every channel and link.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mcpapi.v2 import inference_pb2
from mcpclient.config import client_environment
from mcpclient.control import Control
from mcpclient.convert import InferCall, array_of, checked_call, tensor_of
from mcpclient.direct import DirectPath
from mcpclient.routers import Routers
from mcpclient.routes import RouteCache
from mcpclient.values import ClientStats, ModelInfo, Route
from mcpcore.errors import InvalidArgument
from mcpcore.record_signing import RecordVerifier
from mcpcore.tls import TLSConfig, load_curve_keypair

__all__ = ["DEFAULT_ROUTER", "DEFAULT_SCHEDULER", "MAX_ROUTE_TTL_S", "AsyncMeshClient"]

DEFAULT_ROUTER = "127.0.0.1:8001"
DEFAULT_SCHEDULER = "127.0.0.1:50051"
MAX_ROUTE_TTL_S = 1.0  # the most a cached route may live


class AsyncMeshClient:
    """The mesh from asyncio code. Create and use it on one event loop; ``await client.close()`` (or
    ``async with``) when done."""

    def __init__(
        self,
        routers: str | Sequence[str] = DEFAULT_ROUTER,
        *,
        scheduler: str | None = None,
        timeout: float = 30.0,
        route_ttl_s: float = 1.0,
        max_in_flight: int = 1024,
        tls: TLSConfig | None = None,
        curve_secret_key_file: str = "",
        shared_memory: bool = True,
    ) -> None:
        addresses = [routers] if isinstance(routers, str) else list(routers)
        if not addresses or not all(isinstance(a, str) and a for a in addresses):
            raise InvalidArgument("MeshClient needs at least one router address, e.g. '127.0.0.1:8001'")
        if not timeout > 0 or not 0 <= route_ttl_s <= MAX_ROUTE_TTL_S:
            raise InvalidArgument(
                f"timeout must be > 0 and route_ttl_s within 0..{MAX_ROUTE_TTL_S} s (a route may be cached "
                f"at most that long), got {timeout}, {route_ttl_s}"
            )
        self.timeout = timeout
        self.stats = ClientStats()
        self._routers = Routers(addresses, tls, self.stats)
        self._routes = RouteCache(self._routers, self.stats, ttl_s=route_ttl_s, timeout_s=timeout)
        self._direct = DirectPath(
            self._routes,
            self.stats,
            # given the CA, a worker's signed record is checked before tensors go to it
            verifier=RecordVerifier(tls.ca_file) if tls is not None and tls.ca_file else None,
            curve_keypair=load_curve_keypair(curve_secret_key_file) if curve_secret_key_file else None,
            max_in_flight=max_in_flight,
            shared_memory=shared_memory,
        )
        scheduler_address = scheduler or client_environment().scheduler or DEFAULT_SCHEDULER
        self._control = Control(scheduler_address, tls, timeout)

    @property
    def in_flight(self) -> int:
        """Direct requests sent and not yet answered (those through a router are the router's)."""
        return self._direct.in_flight

    async def __aenter__(self) -> AsyncMeshClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._direct.close()
        await self._routers.close()
        await self._control.close()

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        version: str | None = None,
        key: str | None = None,
        priority: int = 0,
        timeout: float | None = None,  # noqa: ASYNC109  (a deadline sent to the servers, not a local wait)
        direct: bool = False,
        outputs: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run one request; the outputs by name (all of them, or those named in ``outputs``)."""
        call = checked_call(
            model, inputs, version=version, key=key, priority=priority, timeout=timeout, outputs=outputs,
            default_s=self.timeout,
        )  # fmt: skip
        if direct:
            result = await self._direct.infer(call)
            if result is not None:
                return call.select(result)
        return await self._infer_routed(call)

    async def _infer_routed(self, call: InferCall) -> dict[str, np.ndarray]:
        request = inference_pb2.InferRequest(
            model=call.model, version=call.version, routing_key=call.key, priority=call.priority,
            inputs=[tensor_of(name, arr) for name, arr in call.arrays.items()], outputs=call.outputs,
        )  # fmt: skip
        resend = lambda: self._routes.is_idempotent(call)  # noqa: E731  (asked only if a router is lost mid-call)
        reply = await self._routers.call("Infer", request, call.deadline, idempotent=False, resend_if=resend)
        self.stats.routed += 1
        return {t.name: array_of(t) for t in reply.outputs}

    async def route(
        self, model: str, key: str | None = None, *, version: str | None = None, priority: int = 0
    ) -> Route:
        """Where a request would go now (asks a router; never cached)."""
        deadline = time.monotonic() + self.timeout
        return (await self._routes.ask(model, version or "", key or "", priority, deadline))[0]

    async def load(
        self,
        model: str,
        versions: Sequence[str] = ("1",),
        replicas: int = 1,
        *,
        max_replicas: int = 0,
        fallback_version: str = "",
        priority: int = 0,
        timeout: float | None = None,  # noqa: ASYNC109  (the LoadModel deadline the scheduler gets)
    ) -> ModelInfo:
        """Load ``model`` (its ``versions``, ``replicas`` copies each) and wait until they run."""
        return await self._control.load(
            model, versions, replicas, max_replicas=max_replicas, fallback_version=fallback_version,
            priority=priority, deadline_s=timeout,
        )  # fmt: skip

    async def unload(
        self,
        model: str,
        version: str | None = None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109  (the call's deadline, sent to the scheduler)
    ) -> None:
        await self._control.unload(model, version, timeout)
        self._routes.forget(model)

    async def status(
        self,
        model: str | None = None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109  (the call's deadline, sent to the scheduler)
    ) -> list[ModelInfo]:
        """Every model the scheduler knows (or one): versions, replicas and their states, breaker, split."""
        return await self._control.status(model, timeout)
