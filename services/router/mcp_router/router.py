"""``Router``: the DataPlane over the routing table and the forwarder (the one request path of all APIs).

Per request: pick the version (explicit, and declared, else NOT_FOUND; else breaker level 3 → fallback;
else the split in force through ``split.choose_version``, the canary sticky by routing key and dropped
while the breaker is above 0), pick the worker with the ring's bounded-load lookup (the one pick, over
virtual nodes weighted by capacity), forward over ZeroMQ under this router's own correlation id, and
decide what a failure allows (DESIGN.md 7, delivery):

- not sent (link down, draining or full) or answered "not started" by the worker: the next distinct ring
  node may take it, whatever the model; a "draining" answer also stops choosing that worker;
- the worker's link failed while it held the request ("may have started"): an idempotent model is sent
  once more elsewhere, any other model fails UNAVAILABLE "may have started" (never run twice);
- anything else the worker answered is the answer.

Sequences (Triton's sequence_id/start/end; ``mcp_router.sequences``): a sequence's requests go, one at
a time, to the worker and version its first request went to, with no retry elsewhere once it is placed;
when that worker is gone (left the table, restarted, link failed with a request in flight, draining) the
request fails ``ABORTED`` and so does every later one until a new start: its state was on that worker,
so it is never re-routed silently. A router that did not see a sequence's start adopts it where its
hash leads. A decoupled model's answers before its last go to ``on_partial``; once one went
out, the request is never sent again.

Retries after a start was possible, and after an overload refusal, draw from a budget (a fraction of
recent requests), so they cannot amplify an outage; every retry is counted by reason. Client errors
(unknown model or version, bad input, priority out of range) are ``NOT_FOUND``/``INVALID_ARGUMENT`` and
are never counted toward breakers; metric labels only ever name models this router knows. Nothing here
awaits etcd.

Observability: while a request runs, its log fields are bound (``mcpcore.logs``): ``client_request_id``
(the client's id), ``model``, ``request_id`` (this router's wire id, the one the worker logs), ``worker``
(the one tried last) and, traced, ``trace_id``. With tracing on (``mcpcore.tracing``), each request is
one server span ``router.infer``, a child of the current trace context (the caller's, which the front
door attached) or a new trace, with attributes ``mcp.model``, ``mcp.version``, ``mcp.worker``,
``mcp.status`` (the gRPC code's name; a fault of the mesh, not the client's, is an error span),
``mcp.request_id`` (the wire id), ``mcp.client_request_id``, and a ``retry`` event per retry; its
traceparent goes to the worker in the header (``wire.PARAM_TRACEPARENT``). Tracing off, the request path
tests one attribute and makes no span. The Triton-style ``Trace`` (TraceSetting's file) is apart from
this and unchanged.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from opentelemetry import trace as otel

from mcp_router import model_stats
from mcp_router.dataplane import (
    DataPlane,
    InferResult,
    ModelConfigInfo,
    ModelIndexEntry,
    ModelMetadata,
    ModelStats,
    RouteDecision,
    SequenceFlags,
)
from mcp_router.sequences import Pin, Sequences
from mcp_router.snapshot import ModelRoute, Snapshots
from mcp_router.split import SmoothWeightedRoundRobin, choose_version
from mcp_router.stats import UNKNOWN, RequestStats
from mcp_router.trace import Trace
from mcpapi.v2 import tensor_pb2
from mcpcore import logs, signature, tracing, wire
from mcpcore.errors import (
    DeadlineExceeded,
    InvalidArgument,
    MCPError,
    NotFound,
    Unavailable,
    error_class,
    error_for_code,
    not_started,
)
from mcpcore.forwarder import Forwarder, MayHaveStarted, NotSent
from mcpcore.retry import RetryBudget
from mcpcore.tls import TLSConfig

__all__ = ["Router"]

FLAG_SECONDARY_OFF = tensor_pb2.FLAG_SECONDARY_FEATURES_OFF
MAX_PRIORITY = (1 << 32) - 1  # TensorHeader.priority is a uint32


@dataclass(slots=True)
class _Attempts:
    """One request's tries: the workers tried, its one resend after "may have started", the last error."""

    deadline: float
    tried: set[str] = field(default_factory=set)
    resent: bool = False
    maybe_ran: bool = False  # a worker held it when its link failed: "not started" can no longer be said
    last: MCPError | None = None
    again: str = ""  # why the next send is a retry (mcp_router_retries_total{reason})
    streamed: bool = False  # a decoupled model's answer went out: never send it again

    def failed(self, worker: str, error: MCPError, again: str) -> None:
        self.tried.add(worker)
        self.last, self.again = error, again

    def final(self, fallback: MCPError) -> MCPError:
        """The error to answer with once nothing is left to try: the last worker's answer, never marked
        "not started" if an earlier try may have run."""
        error = self.last or fallback
        if self.maybe_ran:
            error.not_started = False
        return error


def _select(route: ModelRoute, result: InferResult, outputs: tuple[str, ...]) -> InferResult:
    """The outputs a client asked for. A secondary output breaker level 2 left out is left out of the
    answer too (the degraded answer, not an error that would feed the breaker); any other is the
    client's mistake."""
    off = route.secondary.get(result.version, frozenset())
    missing = [n for n in outputs if n not in result.outputs and n not in off]
    if missing:
        raise InvalidArgument(
            f"model {route.name} has no output(s) {missing}; it has {sorted(result.outputs)}"
        )
    chosen = {n: result.outputs[n] for n in outputs if n in result.outputs}
    return InferResult(result.model, result.version, result.worker_id, chosen)


@dataclass(slots=True)
class _Request:
    """What every try of one request sends, and where a sequence or a stream wants it."""

    model: str
    version: str
    key: str  # the ring key: the routing key, the sequence's id, or the request's own id
    rid: str  # this router's id on the wire
    inputs: Mapping[str, np.ndarray]
    priority: int
    flags: int
    features: tuple[str, ...]  # breaker level 2's features off
    nbytes: int
    parameters: Mapping[str, str]
    sequence: SequenceFlags | None
    pin: Pin | None
    on_partial: Callable[[InferResult], None] | None
    trace: Trace | None
    log: dict[str, str]  # its bound log fields: the worker tried goes in
    span: Any = None  # its OpenTelemetry span, when traced
    traceparent: str = ""  # the span's, for the worker

    def header(self, left_s: float) -> tensor_pb2.TensorHeader:
        header = tensor_pb2.TensorHeader(
            kind=tensor_pb2.KIND_REQUEST, request_id=self.rid, model=self.model, version=self.version,
            timeout_us=max(1, int(left_s * 1e6)), priority=self.priority, flags=self.flags,
        )  # fmt: skip
        header.parameters.update(self.parameters)
        if self.features:
            header.parameters[wire.PARAM_FEATURES_OFF] = ",".join(self.features)
        if self.traceparent:
            header.parameters[wire.PARAM_TRACEPARENT] = self.traceparent
        return header


def _end_span(span: Any, status: str, error: MCPError | None) -> None:
    """A request's span ends with its status; a fault of the mesh (not the client's, not a cancel) is an
    error span."""
    span.set_attribute("mcp.status", status)
    if error is not None and error_class(error) != "client":
        span.set_status(otel.Status(otel.StatusCode.ERROR, error.message))
    elif status == "INTERNAL":
        span.set_status(otel.Status(otel.StatusCode.ERROR, "internal error"))
    span.end()


def _not_loaded(model: str) -> NotFound:
    return NotFound(f"model {model} is not loaded; load it first (RepositoryModelLoad or LoadModel)")


def _no_worker(model: str, version: str) -> Unavailable:
    return not_started(Unavailable(f"no worker of model {model} version {version} could take the request"))


def _checked(
    route: ModelRoute | None, model: str, priority: int, parameters: Mapping[str, str] | None
) -> ModelRoute:
    """``route``, once the request's own fields are valid (else the error a client can act on)."""
    if route is None:
        raise _not_loaded(model)
    if not 0 <= priority <= MAX_PRIORITY:
        raise InvalidArgument(
            f"priority {priority} is out of range: use 0 (the model's default) .. {MAX_PRIORITY}"
        )
    bad = [k for k in parameters or () if k.startswith(wire.RESERVED_PREFIX)]
    if bad:
        raise InvalidArgument(
            f"request parameter(s) {bad}: names starting {wire.RESERVED_PREFIX!r} are the mesh's own"
        )
    return route


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
        tls: TLSConfig | None = None,
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
        self._tls = tls  # for the workers' Stats calls (ModelStatistics)
        self._sequences = Sequences()
        self._tracer = tracing.tracer(__name__)  # None: tracing is off (resolved once, not per request)
        #: Set as a graceful stop begins refusing calls: new ones are answered "not started" (the SDK and
        #: Triton's clients with retries move to another router) while those in flight finish.
        self.stopping = False

    # -- health and metadata ---------------------------------------------------------------------------
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return self._snap.synced.is_set()

    def _model(self, model: str) -> ModelRoute:
        route = self._snap.table.models.get(model)
        if route is None:
            raise _not_loaded(model)
        return route

    def model_ready(self, model: str, version: str = "") -> bool:
        route = self._snap.table.models.get(model)
        if route is None:
            return False
        return bool(route.rings.get(version)) if version else bool(route.rings)

    def _described(self, model: str, version: str) -> tuple[ModelRoute, str]:
        """The route and the version that metadata and config describe: the one asked for, else the
        one a request without a version goes to."""
        route = self._model(model)
        chosen = version or route.default_version()
        if chosen is None or chosen not in route.rings:
            if version and not route.knows(version):
                declared = sorted(route.declared | set(route.rings), key=int)
                raise NotFound(f"model {model} has no version {version}; it declares {declared}")
            raise NotFound(f"model {model}{'/' + version if version else ''} has no RUNNING replica")
        return route, chosen

    def model_metadata(self, model: str, version: str = "") -> ModelMetadata:
        route, chosen = self._described(model, version)
        meta = route.metadata.get(chosen)
        if meta is None:
            raise NotFound(f"model {model}/{chosen}: its replicas' records carry no metadata")
        return meta

    def model_config(self, model: str, version: str = "") -> ModelConfigInfo:
        route, chosen = self._described(model, version)
        config = route.configs.get(chosen)
        if config is None:
            raise Unavailable(
                f"model {model}/{chosen}: its replicas' records carry no configuration (workers of an "
                "older release); reload it on current workers"
            )
        return config

    async def model_statistics(self, model: str = "", version: str = "") -> list[ModelStats]:
        """The workers' own totals, summed per version (``model_stats``); versions in integer order."""
        table = self._snap.table
        if model:
            route = self._model(model)
            if version and version not in route.rings:
                self._described(model, version)  # raises the NotFound metadata would give
            routes = [route]
        else:
            routes = [r for _, r in sorted(table.models.items())]
        wanted = {
            (r.name, v): r.rings[v].nodes
            for r in routes
            for v in sorted(r.rings, key=int)
            if not version or v == version
        }
        addresses = {w: e.grpc for w, e in table.workers.items()}
        return await model_stats.collect(
            wanted, addresses, tls=self._tls, on_missing=self._stats.stats_missing
        )

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
            if not route.knows(version):
                declared = sorted(route.declared | set(route.rings), key=int)
                raise NotFound(f"model {route.name} has no version {version}; it declares {declared}")
            return version, level, flags
        if level >= 3 and route.fallback_version and route.fallback_version in route.rings:
            return route.fallback_version, level, flags
        split = route.routing
        if split is None:
            if route.load_on_demand:
                self._stats.demand(route.name)
                raise not_started(
                    Unavailable(f"model {route.name} is being loaded on demand; retry in a second")
                )
            raise not_started(Unavailable(f"model {route.name} has no version in service yet; retry shortly"))
        canary = split.canary if level == 0 else None  # any breaker level drops the canary
        rr = None
        if canary and 0 < split.canary_percent < 100 and not key:
            rr = self._rr.get(route.name)
            weights = {split.stable: 100 - split.canary_percent, canary: split.canary_percent}
            if rr is None or rr.weights != weights:
                rr = self._rr[route.name] = SmoothWeightedRoundRobin.for_canary(
                    split.stable, canary, split.canary_percent
                )
        return choose_version(split.stable, canary, split.canary_percent, key, rr), level, flags

    def _pick(self, route: ModelRoute, version: str, key: str, tried: set[str]) -> str:
        """The worker for ``key`` on ``version``'s ring: bounded loads over the workers that may take it.

        Loads are this (model, version)'s requests in flight per worker, kept by the forwarder with their
        total, so a pick reads O(1) in the common case (the owner under its cap and usable)."""
        ring = route.rings.get(version)
        if not ring:
            raise not_started(
                Unavailable(f"model {route.name} version {version} has no RUNNING replica; retry shortly")
            )
        fwd, limit = self._fwd, route.max_ongoing.get(version, 0)
        load = fwd.ring_load(route.name, version)
        counts = load.per_worker

        def usable(node: str) -> bool:
            return fwd.usable(node) and not (limit and counts.get(node, 0) >= limit)

        node = ring.lookup_bounded(key, counts, self._c, total=load.total, exclude=tried, usable=usable)
        if node is not None:
            return node
        # nothing under its cap that may take it: the caps assumed every node usable, so take the least
        # loaded one that may (or say why none may)
        able = [n for n in ring.nodes if n not in tried and fwd.usable(n)]
        room = [n for n in able if not (limit and counts.get(n, 0) >= limit)]
        if not room:  # last resort: a worker handing its replicas over still serves them meanwhile
            room = [n for n in ring.nodes if n not in tried and fwd.serving(n)]
            room = [n for n in room if not (limit and counts.get(n, 0) >= limit)]
        if room:
            return min(room, key=lambda n: counts.get(n, 0))
        if able:
            self._stats.overflow(route.name)
            raise not_started(
                Unavailable(
                    f"exceeds maximum queue size: every replica of {route.name}/{version} that could take "
                    f"the request has {limit} in flight (max_ongoing_requests); retry later"
                )
            )
        raise _no_worker(route.name, version)

    def route(
        self, model: str, version: str = "", routing_key: str = "", candidates: int = 1
    ) -> RouteDecision:
        """Where a request would go; keyless with ``candidates`` > 1, also up to that many - 1 other
        workers of the same version that may take it now (usable, under ``max_ongoing_requests``)."""
        route = self._model(model)
        chosen, level, flags = self._version(route, version, routing_key, time.time())
        worker = self._pick(route, chosen, routing_key or self._fwd.new_id(), set())
        table = self._snap.table

        def decision(node: str) -> RouteDecision:
            endpoint = table.workers[node]
            return RouteDecision(
                model, chosen, node, endpoint.zmq, level, flags, endpoint.curve_public_key,
                tuple(table.features_off) if flags & FLAG_SECONDARY_OFF else (),
                tuple(sorted(endpoint.zmq_features)), endpoint.incarnation,
                route.idempotent.get(chosen, False), (),
                endpoint.record_certificate, endpoint.record_signature, endpoint.grpc,
                endpoint.record_local_signature,
            )  # fmt: skip

        if candidates <= 1 or routing_key:
            return decision(worker)
        ring, limit = route.rings[chosen], route.max_ongoing.get(chosen, 0)
        counts = self._fwd.ring_load(model, chosen).per_worker
        others = [
            n for n in ring.nodes
            if n != worker and n in table.workers and self._fwd.usable(n)
            and not (limit and counts.get(n, 0) >= limit)
        ][: candidates - 1]  # fmt: skip
        return dataclasses.replace(decision(worker), alternatives=tuple(decision(n) for n in others))

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
        sequence: SequenceFlags | None = None,
        on_partial: Callable[[InferResult], None] | None = None,
        trace: Trace | None = None,
    ) -> InferResult:
        """``request_id`` is the client's: only echoed by the front ends and logged, never put on the wire.
        Traced, the request's span is a child of the current trace context (the module's docstring)."""
        if self.stopping:
            raise not_started(Unavailable("this router is stopping: send the request to another router"))
        started = time.perf_counter()
        self._budget.earn()
        route = self._snap.table.models.get(model)
        label = model if route is not None else UNKNOWN  # only names of models that exist
        fields, token = logs.bind(client_request_id=request_id, model=model)
        span = None
        if self._tracer is not None:
            attributes = {"mcp.model": model, "mcp.client_request_id": request_id}
            span = self._tracer.start_span("router.infer", kind=otel.SpanKind.SERVER, attributes=attributes)
            fields["trace_id"] = format(span.get_span_context().trace_id, "032x")
        status, failure = "CANCELLED", None  # unless it is answered or fails
        try:
            route = _checked(route, model, priority, parameters)
            if on_partial is not None and outputs:
                shown = on_partial
                on_partial = lambda r: shown(_select(route, r, outputs))  # noqa: E731
            run = self._infer(
                route,
                version,
                inputs,
                routing_key=routing_key,
                priority=priority,
                timeout_s=timeout_s,
                outputs=outputs,
                parameters=parameters or {},
                sequence=sequence,
                on_partial=on_partial,
                trace=trace,
                log=fields,
                span=span,
            )
            if sequence is None:
                result = await run
            else:  # one request of a sequence at a time, in order
                async with self._sequences.turn(model, sequence):
                    result = await run
            if outputs and result.outputs:  # a decoupled model's last reply may hold none
                result = _select(route, result, outputs)
            status = "OK"
            if span is not None:
                span.set_attribute("mcp.version", result.version)  # the worker's answer names it
        except MCPError as err:
            status, failure = err.code.name, err
            shown = version if route is not None and route.knows(version) else (UNKNOWN if version else "")
            self._stats.record(label, shown, error_class(err), time.perf_counter() - started, err.code.name)
            raise
        except Exception:
            status = "INTERNAL"  # what the front door answers
            raise
        finally:
            logs.reset(token)
            if span is not None:
                _end_span(span, status, failure)
        self._stats.record(model, result.version, None, time.perf_counter() - started, "OK")
        return result

    async def _infer(
        self,
        route: ModelRoute,
        version: str,
        inputs: Mapping[str, np.ndarray],
        *,
        routing_key: str,
        priority: int,
        timeout_s: float | None,
        outputs: tuple[str, ...] = (),
        parameters: Mapping[str, str],
        sequence: SequenceFlags | None,
        on_partial: Callable[[InferResult], None] | None,
        trace: Trace | None,
        log: dict[str, str],
        span: Any,
    ) -> InferResult:
        model = route.name
        pin = None
        if sequence is not None:
            pin = self._sequences.placed(route, self._snap.table, sequence, version, self._fwd.serving)
        chosen, _level, flags = self._version(
            route, pin.version if pin else version, routing_key, time.time()
        )
        meta = route.metadata.get(chosen)
        config = route.configs.get(chosen)
        if meta is not None:  # the worker's own check, here before any hop (a client error costs no trip)
            where = f"model {model}/{chosen}"
            signature.check_inputs(where, meta.inputs, inputs, config.max_batch_size if config else None)
            signature.check_outputs(where, meta.outputs, outputs)
        if config is not None and config.decoupled and on_partial is None:
            raise InvalidArgument(
                f"model {model}/{chosen} is decoupled (it may answer a request several times): send its "
                "requests over a stream (ModelStreamInfer; tritonclient's start_stream)"
            )
        attempts = _Attempts(time.monotonic() + (timeout_s or self._timeout))
        rid = self._fwd.new_id()
        log["request_id"] = rid
        key = routing_key or rid
        nbytes = sum(a.nbytes for a in inputs.values())
        features = self._snap.table.features_off if flags & FLAG_SECONDARY_OFF else ()
        req = _Request(
            model, chosen, key, rid, inputs, priority=priority, flags=flags, features=features,
            nbytes=nbytes, parameters=parameters, sequence=sequence, pin=pin, on_partial=on_partial,
            trace=trace, log=log, span=span, traceparent="" if span is None else tracing.traceparent(span),
        )  # fmt: skip
        if span is not None:
            span.set_attributes({"mcp.version": chosen, "mcp.request_id": rid})
        try:
            return await self._attempt(route, req, attempts)
        finally:
            if sequence is not None and sequence.end:
                self._sequences.end(model, sequence)

    async def _attempt(self, route: ModelRoute, req: _Request, attempts: _Attempts) -> InferResult:
        """Send until answered, as the delivery rules allow (the module's docstring)."""
        model, chosen, pin, trace = route.name, req.version, req.pin, req.trace
        while True:
            route = self._snap.table.models.get(model, route)
            try:
                if pin is not None:  # a placed sequence goes nowhere else
                    if pin.worker in attempts.tried:
                        raise attempts.final(_no_worker(model, chosen))
                    worker = pin.worker
                else:
                    worker = self._pick(route, chosen, req.key, attempts.tried)
            except Unavailable as err:  # none left: the last worker's answer says the most
                raise attempts.final(err) from None
            left = attempts.deadline - time.monotonic()
            if left <= 0:
                raise attempts.final(DeadlineExceeded(f"request to {model}/{chosen} ran out of time"))
            if attempts.again:
                self._stats.retried(attempts.again)
            req.log["worker"] = worker
            if req.span is not None:
                req.span.set_attribute("mcp.worker", worker)
                if attempts.again:
                    req.span.add_event("retry", {"reason": attempts.again, "mcp.worker": worker})
            partial = None
            if req.on_partial is not None:
                partial = self._partial(model, chosen, worker, attempts, req.on_partial)
            if trace is not None:
                trace.attribute("worker", worker)
                trace.mark("FORWARD_START")
            try:
                reply = await self._fwd.send(
                    worker,
                    req.header(left),
                    req.inputs,
                    timeout_s=left,
                    nbytes=req.nbytes,
                    on_partial=partial,
                )
            except NotSent as err:  # never left this router: another worker may take it, no budget
                attempts.failed(worker, not_started(err), "not_sent")
                continue
            except MayHaveStarted as err:
                self._may_have_started(route, req, worker, attempts, err)
                continue
            if trace is not None:
                trace.mark("FORWARD_END")
            if req.sequence is not None and pin is None:  # placed where its first answer came from
                endpoint = self._snap.table.workers.get(worker)
                incarnation = endpoint.incarnation if endpoint is not None else ""
                self._sequences.place(model, req.sequence, chosen, worker, incarnation)
            if not reply.header.status_code:
                return InferResult(model, reply.header.version or chosen, worker, reply.named())
            if pin is not None and req.sequence is not None:
                if reply.header.flags & wire.FLAG_DRAINING:
                    raise self._sequences.lose(model, req.sequence, worker, "is draining")
                wire.raise_for_status(reply.header)  # not started there, or failed: never another worker
            self._refused(worker, reply.header, attempts)

    def _may_have_started(
        self, route: ModelRoute, req: _Request, worker: str, attempts: _Attempts, err: MayHaveStarted
    ) -> None:
        """The worker's link failed while it held the request: return to send it once more, or raise."""
        model = route.name
        if req.sequence is not None:
            raise self._sequences.lose(
                model, req.sequence, worker, "failed while the request was in flight"
            ) from None
        if not self._resend(route, req.version, worker, attempts):
            self._stats.may_have_started(model)
            raise Unavailable(
                f"{err.message}; it may have started, so it was not sent again (model {model} is not "
                "idempotent, or its one resend or the retry budget is spent): retry only if running it "
                "twice is safe"
            ) from None

    @staticmethod
    def _partial(
        model: str, version: str, worker: str, attempts: _Attempts, on_partial: Callable[[InferResult], None]
    ) -> Callable[[wire.Message], None]:
        def partial(msg: wire.Message) -> None:
            attempts.streamed = True
            on_partial(InferResult(model, msg.header.version or version, worker, msg.named()))

        return partial

    def _resend(self, route: ModelRoute, version: str, worker: str, attempts: _Attempts) -> bool:
        """After "may have started": whether the request goes out once more (idempotent models only).

        Not drawn from the retry budget: once per request bounds it (a worker that dies holding 100
        requests costs 100 resends, never more), and an idempotent model must lose nothing to a kill."""
        attempts.tried.add(worker)
        attempts.maybe_ran = True
        if (
            attempts.resent
            or attempts.streamed
            or not route.idempotent.get(version, False)
            or time.monotonic() >= attempts.deadline
        ):
            return False
        attempts.resent, attempts.again = True, "may_have_started"
        return True

    def _refused(self, worker: str, header: tensor_pb2.TensorHeader, attempts: _Attempts) -> None:
        """A worker's error reply: raise it, unless it says "not started" and another worker may try."""
        if not header.flags & wire.FLAG_RETRYABLE:
            wire.raise_for_status(header)
        error = not_started(error_for_code(header.status_code, header.status_message or "worker error"))
        if header.flags & wire.FLAG_DRAINING:  # leaving: choose it no more; resending costs it nothing
            self._fwd.mark_draining(worker)
            attempts.failed(worker, error, "draining")
            return
        if not self._may_retry(attempts.deadline):
            attempts.last = error
            raise attempts.final(error)
        attempts.failed(worker, error, "not_started")

    def _may_retry(self, deadline: float) -> bool:
        return time.monotonic() < deadline and self._budget.spend()
