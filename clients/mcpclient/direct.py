"""``infer(direct=True)``: the tensors go straight to the worker a cached ``Route`` names, over ZeroMQ through
``mcpcore.transport.forwarder``, the router's own link (this client's correlation ids, the deadline as
``timeout_us``, priority, the route's header flags and features, CURVE with the worker's published key,
coalescing where the worker takes it, no copies), plus ``FLAG_DIRECT`` so the worker counts the outcome for
the breakers. The SDK never reads etcd.

Invariants (the router's delivery rules, DESIGN.md 7):
- ``DirectPath.infer`` answers the worker's outputs, or ``None`` for "send it through a router", which it
  says only for a request that provably did not start at the worker (``stats.fallbacks``): never sent (no
  link up, the send refused) at once; answered "not started" (a refusal, draining) while a retry budget
  lasts (a fifth of recent requests, as the router's); never once its deadline has passed.
- One whose worker failed while holding it may have run: an idempotent version is sent once more through
  a router (``None``, ``stats.resends``); any other fails ``Unavailable`` "may have started".
- Every such failure drops the model's cached routes (``RouteCache.forget``).
- Given the CA, a worker's signed record is checked before any tensor goes to it (``PermissionDenied``
  when it does not verify); an unverified offer of a same-host endpoint is dropped, not trusted.
- Same host: a request of at least ``shm.MIN_BYTES`` of tensors, to a worker reached on its same-host
  endpoint whose record lists ``FEATURE_SHM``, lends the worker a region of this process's shared memory
  (``shm_lease``, through the forwarder): inputs copied there once, outputs returned as read-only views of
  it that keep it from reuse while any lives (``stats.shared``). A worker that cannot take it answers not
  started; the request goes again at once with frames, and that incarnation gets frames from then on.
- A link closes only when no cached route names its worker and nothing is in flight on it.
"""

from __future__ import annotations

import functools
import time
from dataclasses import replace

import numpy as np

from mcpapi.v2 import tensor_pb2
from mcpclient.convert import InferCall
from mcpclient.routes import RouteCache
from mcpclient.values import ClientStats, Route
from mcpcore import wire
from mcpcore.errors import DeadlineExceeded, PermissionDenied, Unavailable
from mcpcore.record_signing import RecordVerifier, local_claim, payload
from mcpcore.retry import RetryBudget
from mcpcore.transport.forwarder import Forwarder, MayHaveStarted, NotSent

__all__ = ["DirectPath"]

_CONNECT_WAIT_S = 1.0  # the most a direct request waits for a new link's handshake before the router
_UNREACHABLE_S = 5.0  # then, how long that worker's requests go by the router without waiting again
_VERIFIED_KEPT = 4096  # verified routes remembered (the cache is cleared when it grows past this)


class DirectPath:
    """The client's links to workers and the direct delivery rules above."""

    def __init__(
        self,
        routes: RouteCache,
        stats: ClientStats,
        *,
        verifier: RecordVerifier | None,
        curve_keypair: tuple[bytes, bytes] | None,
        max_in_flight: int,
        shared_memory: bool,
    ) -> None:
        self._routes = routes
        self._stats = stats
        self._verifier = verifier
        self._verified: dict[Route, Route] = {}  # a route checked -> the one to use
        self._curve = curve_keypair
        self._max_in_flight = max_in_flight
        self._shared_memory = shared_memory
        self.forwarder: Forwarder | None = None  # made on the first direct request
        self._targets: dict[str, Route] = {}  # worker -> the route its link was opened for
        self._budget = RetryBudget()
        self._unreachable: dict[str, float] = {}  # worker -> until when its link is not waited for

    @property
    def in_flight(self) -> int:
        """Direct requests sent and not yet answered."""
        return 0 if self.forwarder is None else sum(self.forwarder.loads.values())

    def in_flight_at(self, worker: str) -> int:
        return 0 if self.forwarder is None else self.forwarder.in_flight(worker)

    async def close(self) -> None:
        if self.forwarder is not None:
            await self.forwarder.close()
            self.forwarder = None

    async def infer(self, call: InferCall) -> dict[str, np.ndarray] | None:
        """The worker's answer, or None for "send it through a router" (the delivery rules above)."""
        self._budget.earn()
        model = call.model
        route = await self._routes.get(call, self.in_flight_at)
        if self._unreachable.get(route.worker_id, 0.0) > time.monotonic():  # its link would not come up
            return self._fall_back(call)
        if self._verifier is not None:
            route = self._verified.get(route) or self._verify(route)
        fwd = self._link(route)
        if not await fwd.wait_connected(route.worker_id, min(call.left(), _CONNECT_WAIT_S)):
            self._routes.forget(model)
            if call.left() > 0:  # it had the whole wait: the next requests go by the router for a while
                self._unreachable[route.worker_id] = time.monotonic() + _UNREACHABLE_S
            return self._fall_back(call)
        left = call.left()
        if left <= 0:
            raise DeadlineExceeded(f"request to {model} ran out of time before it was sent")
        header = tensor_pb2.TensorHeader(
            kind=tensor_pb2.KIND_REQUEST, request_id=fwd.new_id(), model=model, version=route.version,
            timeout_us=max(1, int(left * 1e6)), priority=call.priority,
            flags=route.header_flags | wire.FLAG_DIRECT,
        )  # fmt: skip
        if route.features_off and route.header_flags & wire.FLAG_SECONDARY_FEATURES_OFF:
            header.parameters[wire.PARAM_FEATURES_OFF] = ",".join(route.features_off)
        nbytes = sum(a.nbytes for a in call.arrays.values())
        try:
            reply = await fwd.send(route.worker_id, header, call.arrays, timeout_s=left, nbytes=nbytes)
        except NotSent:
            self._routes.forget(model)
            return self._fall_back(call)
        except MayHaveStarted as err:
            self._routes.forget(model)
            if route.idempotent and call.left() > 0:  # as the router: once more, elsewhere
                self._stats.resends += 1
                return None
            why = f"model {model}/{route.version} is not idempotent"
            why = "no time was left" if route.idempotent else why
            raise Unavailable(
                f"{err.message}; it may have started, so it was not sent again ({why}): retry only if "
                "running it twice is safe"
            ) from None
        h = reply.header
        if not h.status_code:
            self._stats.shared += reply.shared
            self._stats.direct += 1
            return reply.named()
        if h.flags & (wire.FLAG_RETRYABLE | wire.FLAG_DRAINING):  # not started there
            self._routes.forget(model)  # the route is stale, or the worker is leaving
            if call.left() > 0 and (h.flags & wire.FLAG_DRAINING or self._budget.spend()):
                return self._fall_back(call)
        wire.raise_for_status(h)
        raise AssertionError("raise_for_status raised")  # unreachable: the status was not OK

    def _fall_back(self, call: InferCall) -> None:
        """The request goes through a router (it provably did not start at the worker)."""
        if call.left() <= 0:
            raise DeadlineExceeded(
                f"request to {call.model} ran out of time (it did not start at the worker)"
            )
        self._stats.fallbacks += 1

    def _verify(self, route: Route) -> Route:
        """``route`` once its record's signature verifies (else ``PermissionDenied``), without its offer of a
        same-host endpoint when that offer's own signature does not verify (its link then goes to the
        signed endpoint)."""
        assert self._verifier is not None
        signed = payload(
            route.worker_id, route.incarnation, route.endpoint, route.curve_public_key, route.control_endpoint
        )
        verify = functools.partial(
            self._verifier.verify, route.worker_id, certificate=route.record_certificate
        )
        why = verify(signed, signature=route.record_signature)
        if why:
            raise PermissionDenied(f"worker {route.worker_id} at {route.endpoint}: {why}; nothing sent")
        use = route
        if wire.FEATURE_LOCAL in route.zmq_features and verify(
            local_claim(signed), signature=route.record_local_signature
        ):
            use = replace(route, zmq_features=route.zmq_features - wire.SAME_HOST_FEATURES)
        if len(self._verified) > _VERIFIED_KEPT:
            self._verified.clear()
        self._verified[route] = use
        return use

    def _link(self, route: Route) -> Forwarder:
        """The forwarder, with a link to ``route``'s worker as that route describes it."""
        if self.forwarder is None:
            self.forwarder = Forwarder(
                max_in_flight=self._max_in_flight,
                curve_keypair=self._curve,
                shared_memory=self._shared_memory,
            )
        known = self._targets.get(route.worker_id)
        if known is None or (
            known.endpoint,
            known.curve_public_key,
            known.incarnation,
            wire.FEATURE_LOCAL in known.zmq_features,
        ) != (
            route.endpoint,
            route.curve_public_key,
            route.incarnation,  # restarted: its same-host endpoint has a new name
            wire.FEATURE_LOCAL in route.zmq_features,  # the same-host endpoint offered or withdrawn
        ):
            self._targets[route.worker_id] = route
            fwd, held = self.forwarder, self._routes.workers() | {route.worker_id}
            # a link closes only when no route names it and nothing is in flight on it
            self._targets = {w: r for w, r in self._targets.items() if w in held or fwd.in_flight(w)}
            fwd.sync(self._targets)
        return self.forwarder
