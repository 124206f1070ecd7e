"""The Python SDK: ``AsyncMeshClient`` (asyncio) and ``MeshClient`` (blocking, the same client on a private
event loop in a background thread, safe to share between threads).

    with MeshClient("127.0.0.1:8001") as mesh:
        out = mesh.infer("demo-mlp", {"INPUT0": x})              # through the router
        out = mesh.infer("demo-mlp", {"INPUT0": x}, direct=True)  # tensors straight to the worker

Invariants:
- Through the router: the mesh's v2 ``Infer``. Several routers: the client takes a list and uses the one
  that last answered; it moves to the next only when a request provably did not start there (the router
  said so, ``mcp-not-started``, or no connection to it could be made); any other failure is the answer.
- ``direct=True``: ``Route`` once per (model, version, key), cached at most ``route_ttl_s`` (1 s), so
  traffic splits, breaker levels and moved replicas reach direct traffic within a second; the cache is
  dropped for a model whenever the worker says it does not hold it, is draining, or its link fails. The
  tensors go to the worker over ZeroMQ through ``mcpcore.transport`` — the router's own link: this
  client's correlation ids, the deadline as ``timeout_us``, priority, the route's header flags and
  features, CURVE with the worker's published key, coalescing where the worker takes it, no copies — plus
  ``FLAG_DIRECT``, so the worker counts the outcome for the breakers. The SDK never reads etcd.
- Direct delivery, as the router's (DESIGN.md 7): a request that provably did not start at the worker
  goes through a router instead (``stats.fallbacks``): never sent (no link up, the send refused) at once,
  answered "not started" (a refusal, draining) while a retry budget lasts (a fifth of recent requests, as
  the router's), and never once its deadline has passed. One whose worker failed while holding it may have
  run: an idempotent version is sent once more through a router (``stats.resends``), any other fails
  ``Unavailable`` "may have started".
- Routed delivery, the same rule one hop up: a call no router could be reached for moves to the next
  router; a router that went away holding a call (its connection broke mid-call: killed, or cancelled as
  it stopped) may have run it, so the call goes to the next router only when its model version is
  idempotent (learned from ``Route`` answers, asked once per model when unknown; ``stats.failovers``),
  else it fails ``Unavailable`` "may have started".
- Same host: a direct request of at least ``shm.MIN_BYTES`` of tensors, to a worker reached on
  its same-host endpoint whose record lists ``FEATURE_SHM``, lends the worker a region of this process's
  shared memory (``shm_lease``, through the forwarder, as a router does): the inputs are copied there
  once, the worker reads them in place and writes its outputs into the same region, and the outputs
  returned are read-only views of it, which keep it from reuse while any of them lives
  (``stats.shared``). A worker that cannot take it answers not started; the request goes again at once
  with frames, and that worker incarnation gets frames from then on. ``shared_memory=False`` turns it off.
- Links to workers close only when no cached route names them and nothing is in flight on them.
- Every failure is an ``MCPError`` (``mcpcore.errors``: ``NotFound``, ``InvalidArgument``,
  ``ResourceExhausted``, ``Unavailable``, ``DeadlineExceeded``, ...), with the server's message.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import grpc
import grpc.aio
import numpy as np

from mcpapi.v2 import (
    control_pb2,
    control_pb2_grpc,
    inference_pb2,
    inference_pb2_grpc,
    model_pb2,
    tensor_pb2,
)
from mcpclient.config import client_environment
from mcpcore import dtypes, wire
from mcpcore.errors import (
    DeadlineExceeded,
    InvalidArgument,
    MCPError,
    PermissionDenied,
    Unavailable,
    not_started,
)
from mcpcore.record_signing import RecordVerifier, local_claim, payload
from mcpcore.retry import RetryBudget
from mcpcore.tls import TLSConfig, aio_channel, load_curve_keypair
from mcpcore.transport.forwarder import Forwarder, MayHaveStarted, NotSent
from mcpcore.transport.grpc_status import from_rpc_error

__all__ = ["AsyncMeshClient", "ClientStats", "MeshClient", "ModelInfo", "ReplicaInfo", "Route", "TLSConfig"]

T = TypeVar("T")
log = logging.getLogger(__name__)
DEFAULT_ROUTER = "127.0.0.1:8001"
DEFAULT_SCHEDULER = "127.0.0.1:50051"
_MAX_MESSAGE = 256 << 20  # gRPC message limit both ways (bulk tensors through the router)
_CONNECT_WAIT_S = 1.0  # the most a direct request waits for a new link's handshake before the router
_SPREAD = 8  # the most copies a keyless request's cache entry spreads over (RouteRequest.candidates)
_UNREACHABLE_S = 5.0  # then, how long that worker's requests go by the router without waiting again
_ROUTES_KEPT = 1024  # cached routes (one per model, version and routing key), least recent dropped
MAX_ROUTE_TTL_S = 1.0  # the most a cached route may live
MAX_PRIORITY = (1 << 32) - 1  # TensorHeader.priority is a uint32
#: gRPC's words for a call that could not reach its server at all (so it never left this process)
#: A call whose router went away mid-call: the connection broke (UNAVAILABLE with these words) or the
#: server cancelled it (CANCELLED: this client never cancels a call it still waits for).
_BROKEN = ("socket closed", "connection reset", "stream removed", "broken pipe", "goaway", "rst_stream",
           "connection aborted", "end of tcp stream")  # fmt: skip

_UNREACHED = (
    "failed to connect",
    "connection refused",
    "errors resolving",
    "dns resolution",
    "name resolution",
)


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request would go (the router's ``Route`` answer); also the link target of the direct path."""

    model: str
    version: str
    worker_id: str
    endpoint: str  # the worker's ZeroMQ endpoint
    breaker_level: int
    header_flags: int
    curve_public_key: str = ""
    features_off: tuple[str, ...] = ()
    zmq_features: frozenset[str] = frozenset()
    incarnation: str = ""
    idempotent: bool = False  # the version may run twice: sent once more after its worker failed
    record_certificate: str = ""  # the worker record's proof (mcpcore.record_signing)
    record_signature: str = ""
    control_endpoint: str = ""  # the worker's gRPC address (signed with the record)
    record_local_signature: str = ""  # its signed offer of a same-host endpoint (record_signing.local_claim)

    # mcpcore.transport.link.LinkTarget
    @property
    def id(self) -> str:
        return self.worker_id

    @property
    def zmq(self) -> str:
        return self.endpoint

    @property
    def draining(self) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    version: str
    worker_id: str
    state: str  # LOADING, RUNNING, PAUSED, UNLOADING, ERROR ...
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    model: str
    versions: tuple[str, ...]
    replicas: tuple[ReplicaInfo, ...]
    breaker_level: int
    stable: str = ""
    canary: str = ""
    canary_percent: int = 0
    pending: str = ""  # what the scheduler is still doing for it, if anything

    def running(self, version: str | None = None) -> int:
        return sum(1 for r in self.replicas if r.state == "RUNNING" and version in (None, r.version))


@dataclass(slots=True)
class ClientStats:
    """What this client did (tests, benchmarks, and a user who wants to know where requests went)."""

    routed: int = 0  # answered through a router
    direct: int = 0  # answered by a worker directly
    fallbacks: int = 0  # direct requests that provably did not start at the worker, sent through a router
    resends: int = 0  # direct requests of idempotent versions sent again through a router after a failure
    route_calls: int = 0  # Route RPCs made (the cache's misses)
    failovers: int = 0  # calls moved to another router
    shared: int = 0  # direct requests whose tensors went by shared memory (a worker on this host)


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


@dataclass(frozen=True, slots=True)
class _Call:
    """One infer call's arguments, as every path needs them."""

    model: str
    arrays: Mapping[str, np.ndarray]
    version: str
    key: str
    priority: int
    deadline: float  # time.monotonic()
    outputs: tuple[str, ...]

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def select(self, result: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [n for n in self.outputs if n not in result]
        if missing:
            raise InvalidArgument(f"model {self.model} has no output(s) {missing}; it has {sorted(result)}")
        return {n: result[n] for n in self.outputs} if self.outputs else result


@dataclass(slots=True)
class _Router:
    address: str
    channel: grpc.aio.Channel
    inference: inference_pb2_grpc.InferenceStub = field(init=False)

    def __post_init__(self) -> None:
        self.inference = inference_pb2_grpc.InferenceStub(self.channel)


def _never_reached(err: grpc.RpcError) -> bool:
    """No connection to the server could be made, so the call never left this process."""
    details = (err.details() or "").lower() if hasattr(err, "details") else ""
    return err.code() == grpc.StatusCode.UNAVAILABLE and any(words in details for words in _UNREACHED)


def _broken(err: grpc.RpcError) -> bool:
    """The call reached a router and lost it on the way: its transport broke, or the server cancelled it."""
    details = (err.details() or "").lower() if hasattr(err, "details") else ""
    if err.code() == grpc.StatusCode.CANCELLED:
        return True
    return err.code() == grpc.StatusCode.UNAVAILABLE and any(words in details for words in _BROKEN)


def _checked_call(
    model: Any,
    inputs: Any,
    *,
    version: Any,
    key: Any,
    priority: Any,
    timeout: Any,
    outputs: Any,
    default_s: float,
) -> _Call:
    """The arguments of ``infer`` as a ``_Call``, or ``InvalidArgument`` naming the bad one."""
    for name, value in (("model", model), ("version", version), ("key", key)):
        if value is not None and not isinstance(value, str):
            raise InvalidArgument(f"{name} must be a string, got {type(value).__name__}")
    if not model:
        raise InvalidArgument("model must be a model name, e.g. 'demo-mlp'")
    if not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= MAX_PRIORITY:
        raise InvalidArgument(
            f"priority must be an integer 0 (the model's default) .. {MAX_PRIORITY}, got {priority!r}"
        )
    if timeout is not None and (not isinstance(timeout, int | float) or not timeout > 0):
        raise InvalidArgument(f"timeout must be a number of seconds > 0, got {timeout!r}")
    if not isinstance(inputs, Mapping) or not inputs:
        raise InvalidArgument("inputs must be a non-empty mapping of tensor name to array")
    arrays = {}
    for name, value in inputs.items():
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"tensor names must be non-empty strings, got {name!r}")
        arr = np.asarray(value)
        if arr.dtype.kind in "OUSV":
            raise InvalidArgument(
                f"input {name}: dtype {arr.dtype} is not a tensor type (use a numeric array)"
            )
        arrays[name] = arr
    if isinstance(outputs, str) or not all(isinstance(o, str) for o in outputs or ()):
        raise InvalidArgument(f"outputs must be a list of output names, got {outputs!r}")
    return _Call(
        model, arrays, version or "", key or "", priority, time.monotonic() + (timeout or default_s),
        tuple(outputs or ()),
    )  # fmt: skip


def _tensor(name: str, array: Any) -> inference_pb2.Tensor:
    arr = np.asarray(array)
    dtype = dtypes.from_numpy(arr.dtype)
    return inference_pb2.Tensor(
        name=name, dtype=dtypes.wire_value(dtype), shape=arr.shape, data=bytes(dtypes.to_bytes(arr))
    )


def _array(t: inference_pb2.Tensor) -> np.ndarray:
    return dtypes.from_bytes(dtypes.name_of(t.dtype), t.data, tuple(t.shape), f"output {t.name}")


def _route(model: str, r: inference_pb2.RouteResponse) -> Route:
    return Route(
        model, r.version, r.worker_id, r.data_endpoint, r.breaker_level, r.header_flags, r.curve_public_key,
        tuple(r.features_off), frozenset(r.zmq_features), r.incarnation, r.idempotent,
        r.record_certificate, r.record_signature, r.control_endpoint, r.record_local_signature,
    )  # fmt: skip


def _model_info(m: model_pb2.ModelStatus) -> ModelInfo:
    replicas = tuple(
        ReplicaInfo(r.version, r.worker_id, model_pb2.ModelState.Name(r.state), r.reason) for r in m.replicas
    )
    versions = tuple(dict.fromkeys([*m.spec.versions, *(r.version for r in replicas)]))
    return ModelInfo(
        m.model, versions, replicas, m.breaker.level, m.traffic.stable, m.traffic.canary,
        m.traffic.canary_percent, m.pending,
    )  # fmt: skip


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
        self._addresses = addresses
        self._tls = tls
        # given the CA, a worker's signed record is checked before tensors go to it (mcpcore.record_signing)
        self._verifier = RecordVerifier(tls.ca_file) if tls is not None and tls.ca_file else None
        self._verified: dict[Route, Route] = {}  # a route checked -> the one to use (module docstring)
        self._idempotent: dict[tuple[str, str], bool] = {}  # (model, version asked) -> may run twice
        self._curve = load_curve_keypair(curve_secret_key_file) if curve_secret_key_file else None
        self._scheduler_address = scheduler or client_environment().scheduler or DEFAULT_SCHEDULER
        self.timeout = timeout
        self._ttl = route_ttl_s
        self._max_in_flight = max_in_flight
        self._routers: list[_Router] = []
        self._current = 0  # the router that answered last
        self._control: control_pb2_grpc.ModelControlStub | None = None
        self._control_channel: grpc.aio.Channel | None = None
        self._fwd: Forwarder | None = None
        self._routes: OrderedDict[tuple[str, str, str], _Cached] = OrderedDict()
        self._asking: dict[tuple[str, str, str], asyncio.Future[tuple[Route, ...]]] = {}
        self._forgotten: dict[str, int] = {}  # model -> how often its routes were dropped (stale answers)
        self._targets: dict[str, Route] = {}  # worker -> the route its link was opened for
        self._budget = RetryBudget()
        self._unreachable: dict[str, float] = {}  # worker -> until when its link is not waited for
        self._shared_memory = shared_memory
        self.stats = ClientStats()

    @property
    def in_flight(self) -> int:
        """Direct requests sent and not yet answered (those through a router are the router's)."""
        return 0 if self._fwd is None else sum(self._fwd.loads.values())

    async def __aenter__(self) -> AsyncMeshClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._fwd is not None:
            await self._fwd.close()
            self._fwd = None
        for router in self._routers:
            await router.channel.close()
        self._routers = []
        if self._control_channel is not None:
            await self._control_channel.close()
            self._control_channel = self._control = None

    # -- inference -------------------------------------------------------------------------------------
    async def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        version: str | None = None,
        key: str | None = None,
        priority: int = 0,
        timeout: float | None = None,
        direct: bool = False,
        outputs: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run one request; the outputs by name (all of them, or those named in ``outputs``)."""
        call = _checked_call(
            model, inputs, version=version, key=key, priority=priority, timeout=timeout, outputs=outputs,
            default_s=self.timeout,
        )  # fmt: skip
        if direct:
            self._budget.earn()
            result = await self._infer_direct(call)
            if result is not None:
                self.stats.direct += 1
                return call.select(result)
        return await self._infer_routed(call)

    async def _infer_routed(self, call: _Call) -> dict[str, np.ndarray]:
        request = inference_pb2.InferRequest(
            model=call.model, version=call.version, routing_key=call.key, priority=call.priority,
            inputs=[_tensor(name, arr) for name, arr in call.arrays.items()], outputs=call.outputs,
        )  # fmt: skip
        resend = lambda: self._is_idempotent(call)  # noqa: E731  (asked only if a router is lost mid-call)
        reply = await self._on_routers("Infer", request, call.deadline, idempotent=False, resend_if=resend)
        self.stats.routed += 1
        return {t.name: _array(t) for t in reply.outputs}

    async def _infer_direct(self, call: _Call) -> dict[str, np.ndarray] | None:
        """The worker's answer, or None for "send it through a router" (the delivery rules above)."""
        model = call.model
        route = await self._cached_route(call)
        if self._unreachable.get(route.worker_id, 0.0) > time.monotonic():  # its link would not come up
            return self._fall_back(call)
        if self._verifier is not None:
            route = self._verified.get(route) or self._verify(route)
        fwd = self._link(route)
        if not await fwd.wait_connected(route.worker_id, min(call.left(), _CONNECT_WAIT_S)):
            self._forget(model)
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
            self._forget(model)
            return self._fall_back(call)
        except MayHaveStarted as err:
            self._forget(model)
            if route.idempotent and call.left() > 0:  # as the router: once more, elsewhere
                self.stats.resends += 1
                return None
            why = f"model {model}/{route.version} is not idempotent"
            why = "no time was left" if route.idempotent else why
            raise Unavailable(
                f"{err.message}; it may have started, so it was not sent again ({why}): retry only if "
                "running it twice is safe"
            ) from None
        h = reply.header
        if not h.status_code:
            self.stats.shared += reply.shared
            return reply.named()
        if h.flags & (wire.FLAG_RETRYABLE | wire.FLAG_DRAINING):  # not started there
            self._forget(model)  # the route is stale, or the worker is leaving
            if call.left() > 0 and (h.flags & wire.FLAG_DRAINING or self._budget.spend()):
                return self._fall_back(call)
        wire.raise_for_status(h)
        raise AssertionError("raise_for_status raised")  # unreachable: the status was not OK

    def _fall_back(self, call: _Call) -> None:
        """The request goes through a router (it provably did not start at the worker)."""
        if call.left() <= 0:
            raise DeadlineExceeded(
                f"request to {call.model} ran out of time (it did not start at the worker)"
            )
        self.stats.fallbacks += 1

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
        if len(self._verified) > 4096:
            self._verified.clear()
        self._verified[route] = use
        return use

    def _link(self, route: Route) -> Forwarder:
        if self._fwd is None:
            self._fwd = Forwarder(
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
            fwd, held = (
                self._fwd,
                {r.worker_id for c in self._routes.values() for r in c.routes} | {route.worker_id},
            )
            # a link closes only when no route names it and nothing is in flight on it
            self._targets = {w: r for w, r in self._targets.items() if w in held or fwd.in_flight(w)}
            fwd.sync(self._targets)
        return self._fwd

    # -- routes ----------------------------------------------------------------------------------------
    async def route(
        self, model: str, key: str | None = None, *, version: str | None = None, priority: int = 0
    ) -> Route:
        """Where a request would go now (asks a router; never cached)."""
        deadline = time.monotonic() + self.timeout
        return (await self._ask_route(model, version or "", key or "", priority, deadline))[0]

    async def _cached_route(self, call: _Call) -> Route:
        model, cache_key = call.model, (call.model, call.version, call.key)
        cached = self._routes.get(cache_key)
        if cached is not None and cached.expires > time.monotonic():
            self._routes.move_to_end(cache_key)
            return cached.pick(self._in_flight_at)
        asking = self._asking.get(cache_key)
        if asking is None:  # one Route call per key at a time, on the client's deadline, not a caller's
            ask = self._ask_routes(call, time.monotonic() + self.timeout)
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
        return cached.pick(self._in_flight_at) if cached is not None else routes[0]

    def _in_flight_at(self, worker: str) -> int:
        return 0 if self._fwd is None else self._fwd.in_flight(worker)

    async def _ask_routes(self, call: _Call, deadline: float) -> tuple[Route, ...]:
        """The route for a keyed request; for a keyless one also the other copies of its version that
        may take it now (``RouteRequest.candidates``), so a client's keyless traffic spreads over the
        replicas as a router's does (each request to the copy with the fewest of this client's in flight)."""
        return await self._ask_route(
            call.model, call.version, call.key, call.priority, deadline, candidates=1 if call.key else _SPREAD
        )

    def _asked(
        self, cache_key: tuple[str, str, str], generation: int, done: asyncio.Future[tuple[Route, ...]]
    ) -> None:
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

    async def _ask_route(
        self, model: str, version: str, key: str, priority: int, deadline: float, *, candidates: int = 1
    ) -> tuple[Route, ...]:
        request = inference_pb2.RouteRequest(
            model=model, version=version, routing_key=key, priority=priority, candidates=candidates
        )
        r = await self._on_routers("Route", request, deadline, idempotent=True)
        self.stats.route_calls += 1
        self._idempotent[(model, r.version)] = r.idempotent
        if not version:
            self._idempotent[(model, "")] = r.idempotent
        return tuple(_route(model, answer) for answer in (r, *r.alternatives))

    async def _is_idempotent(self, call: _Call) -> bool:
        """Whether ``call``'s model version may run twice (a Route answer says; asked if not known yet)."""
        known = self._idempotent.get((call.model, call.version))
        if known is None:
            try:
                await self._ask_route(call.model, call.version, call.key, call.priority, call.deadline)
            except MCPError:
                return False  # not known: the safe answer
            known = self._idempotent.get((call.model, call.version), False)
        return known

    def _forget(self, model: str) -> None:
        self._forgotten[model] = self._forgotten.get(model, 0) + 1
        for cache_key in [k for k in self._routes if k[0] == model]:
            del self._routes[cache_key]

    # -- routers ---------------------------------------------------------------------------------------
    def _router_list(self) -> list[_Router]:
        if not self._routers:
            options = [
                ("grpc.max_send_message_length", _MAX_MESSAGE),
                ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ]
            self._routers = [_Router(a, aio_channel(a, self._tls, options)) for a in self._addresses]
        return self._routers

    async def _on_routers(
        self,
        method: str,
        request: Any,
        deadline: float,
        *,
        idempotent: bool,
        resend_if: Callable[[], Coroutine[Any, Any, bool]] | None = None,
    ) -> Any:
        """Call ``method`` on the router that answered last, moving on to the next only when the call
        provably did not start there; an ``idempotent`` call also on any ``UNAVAILABLE`` and, since each
        try gets its share of the time left, on a router that does not answer in it (frozen). A call
        whose router went away holding it moves on only if ``resend_if()`` says it may run twice; else it
        fails "may have started"."""
        routers = self._router_list()
        tried: list[str] = []
        first = self._current  # the order is fixed here: a nested call (resend_if's Route) moves _current
        for step in range(len(routers)):
            index = (first + step) % len(routers)
            router, last = routers[index], step == len(routers) - 1
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeadlineExceeded(f"{method} ran out of time (tried {', '.join(tried) or 'no router'})")
            share = left if last or not idempotent else left / (len(routers) - step)
            try:
                reply = await getattr(router.inference, method)(request, timeout=share)
            except grpc.RpcError as rpc_error:
                error = from_rpc_error(rpc_error)
                reached = not _never_reached(rpc_error)
                if reached:
                    self._current = index  # it answered: the next call starts there
                else:
                    not_started(error)
                movable = (
                    not reached
                    or error.not_started
                    or (idempotent and isinstance(error, Unavailable | DeadlineExceeded))
                )
                if reached and not movable and resend_if is not None and _broken(rpc_error):
                    movable = not last and await resend_if()
                    if not movable:
                        error = Unavailable(
                            f"{method}: router {router.address} went away holding the request "
                            f"({error.message}); it may have started, so it was not sent again"
                        )
                if not movable or last:
                    if tried and not reached:
                        where = ", ".join([*tried, router.address])
                        unreached = Unavailable(f"no router could be reached ({where}): {error.message}")
                        raise not_started(unreached) from None
                    raise error from None
                tried.append(router.address)
                self.stats.failovers += 1
                continue
            self._current = index
            return reply
        raise Unavailable("no router configured")  # unreachable: the loop returns or raises

    # -- control ---------------------------------------------------------------------------------------
    def _scheduler(self) -> control_pb2_grpc.ModelControlStub:
        if self._control is None:
            self._control_channel = aio_channel(self._scheduler_address, self._tls)
            self._control = control_pb2_grpc.ModelControlStub(self._control_channel)
        return self._control

    async def _control_call(self, method: str, request: Any, timeout: float | None) -> Any:
        try:
            return await getattr(self._scheduler(), method)(request, timeout=timeout or self.timeout)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    async def load(
        self,
        model: str,
        versions: Sequence[str] = ("1",),
        replicas: int = 1,
        *,
        max_replicas: int = 0,
        fallback_version: str = "",
        priority: int = 0,
        timeout: float | None = None,
    ) -> ModelInfo:
        """Load ``model`` (its ``versions``, ``replicas`` copies each) and wait until they run."""
        if isinstance(versions, str):
            versions = (versions,)
        spec = model_pb2.ModelSpec(
            model=model, versions=list(versions), replicas=replicas, max_replicas=max_replicas,
            fallback_version=fallback_version, priority=priority,
        )  # fmt: skip
        reply = await self._control_call("LoadModel", control_pb2.LoadModelRequest(spec=spec), timeout)
        return _model_info(reply.status)

    async def unload(self, model: str, version: str | None = None, *, timeout: float | None = None) -> None:
        request = control_pb2.UnloadModelRequest(model=model, version=version or "")
        await self._control_call("UnloadModel", request, timeout)
        self._forget(model)

    async def status(self, model: str | None = None, *, timeout: float | None = None) -> list[ModelInfo]:
        """Every model the scheduler knows (or one): versions, replicas and their states, breaker, split."""
        if model:
            reply = await self._control_call(
                "GetModelStatus", control_pb2.GetModelStatusRequest(model=model), timeout
            )
            return [_model_info(reply.status)]
        reply = await self._control_call("ListModels", control_pb2.ListModelsRequest(), timeout)
        return [_model_info(m) for m in reply.models]


class MeshClient:
    """The blocking client: ``AsyncMeshClient``'s methods, run on a private event loop in a daemon thread
    (so it may be shared by threads). Use it as a context manager, or call ``close()``: calls still
    running then fail ``Unavailable`` "closed" (a direct one that was out may have run)."""

    def __init__(self, routers: str | Sequence[str] = DEFAULT_ROUTER, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcpclient", daemon=True)
        self._lock = threading.Lock()
        self._closed = False
        self._calls: set[concurrent.futures.Future[Any]] = set()
        self._thread.start()
        try:
            self._client: AsyncMeshClient = self._run(_create(routers, options))
        except BaseException:
            self._stop()
            raise

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            if self._closed:
                coro.close()
                raise Unavailable("this MeshClient is closed")
            future = asyncio.run_coroutine_threadsafe(coro, self._loop)
            self._calls.add(future)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise Unavailable("this MeshClient was closed while the call ran") from None
        except BaseException:  # KeyboardInterrupt, ...: the call stops too
            future.cancel()
            raise
        finally:
            with self._lock:
                self._calls.discard(future)

    def __enter__(self) -> MeshClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def stats(self) -> ClientStats:
        return self._client.stats

    @property
    def in_flight(self) -> int:
        return self._run(_in_flight(self._client))

    def infer(self, model: str, inputs: Mapping[str, Any], **kw: Any) -> dict[str, np.ndarray]:
        return self._run(self._client.infer(model, inputs, **kw))

    def route(self, model: str, key: str | None = None, **kw: Any) -> Route:
        return self._run(self._client.route(model, key, **kw))

    def load(self, model: str, versions: Sequence[str] = ("1",), replicas: int = 1, **kw: Any) -> ModelInfo:
        return self._run(self._client.load(model, versions, replicas, **kw))

    def unload(self, model: str, version: str | None = None, **kw: Any) -> None:
        self._run(self._client.unload(model, version, **kw))

    def status(self, model: str | None = None, **kw: Any) -> list[ModelInfo]:
        return self._run(self._client.status(model, **kw))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            running = list(self._calls)
        for future in running:  # their tasks are cancelled on the loop; their callers get Unavailable
            future.cancel()
        try:
            concurrent.futures.wait(running, timeout=5)
            asyncio.run_coroutine_threadsafe(self._client.close(), self._loop).result(timeout=10)
        finally:
            self._stop()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


async def _in_flight(client: AsyncMeshClient) -> int:
    return client.in_flight


async def _create(routers: str | Sequence[str], options: Mapping[str, Any]) -> AsyncMeshClient:
    return AsyncMeshClient(routers, **options)
