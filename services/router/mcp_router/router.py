"""``Router``: the DataPlane over the routing table, the version choice and delivery (the one request path
of every front door).

Per request: check it (unknown model ``NOT_FOUND``, bad priority or reserved parameter
``INVALID_ARGUMENT``: a client's error costs no hop and never feeds a breaker), choose the version
(``routing.versions``), check the inputs and outputs against the version's signature, and hand it to
``delivery``, which picks the worker (``routing.pick``) and sends until answered. A sequence's requests run
one at a time, in order (``routing.sequences``); a decoupled model needs a stream (``on_partial``).

Invariants:
- Nothing here awaits etcd: the table is the watch's last snapshot, swapped whole.
- Metric labels only ever name models this router knows; every request is recorded once, with its status.
- While a request runs its log fields are bound (``mcpcore.logs``): ``client_request_id``, ``model``,
  ``request_id`` (the wire id the worker logs), ``worker`` and, traced, ``trace_id``. With tracing on
  (``mcpcore.tracing``) each request is one server span ``router.infer``, a child of the current trace
  context, with attributes ``mcp.model``, ``mcp.version``, ``mcp.worker``, ``mcp.status`` (a fault of the
  mesh, not the client's, is an error span), ``mcp.request_id``, ``mcp.client_request_id`` and a ``retry``
  event per retry; its traceparent goes to the worker. Tracing off, no span is made.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
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
from mcp_router.delivery import Delivery, Outgoing
from mcp_router.routing.sequences import Sequences
from mcp_router.routing.table import ModelRoute
from mcp_router.routing.versions import FLAG_SECONDARY_OFF, VersionChoice, unknown_version
from mcp_router.snapshot import Snapshots
from mcp_router.stats import UNKNOWN, RequestStats
from mcp_router.trace import Trace
from mcpcore import logs, tensor_signature, tracing, wire
from mcpcore.errors import InvalidArgument, MCPError, NotFound, Unavailable, error_class, not_started
from mcpcore.retry import RetryBudget
from mcpcore.tls import TLSConfig
from mcpcore.transport.forwarder import Forwarder

__all__ = ["Router"]

MAX_PRIORITY = (1 << 32) - 1  # TensorHeader.priority is a uint32


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
        self._timeout = default_timeout_s
        self._budget = retry_budget or RetryBudget()  # earned per request here, spent by delivery
        self._versions = VersionChoice(on_demand=stats.demand)
        self._sequences = Sequences()
        self._delivery = Delivery(
            snapshots, forwarder, stats, self._sequences, load_factor=load_factor, retry_budget=self._budget
        )
        self._scheduler_load = scheduler_load
        self._scheduler_unload = scheduler_unload
        self._tls = tls  # for the workers' Stats calls (ModelStatistics)
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
                raise unknown_version(route, version)
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
    def route(
        self, model: str, version: str = "", routing_key: str = "", candidates: int = 1
    ) -> RouteDecision:
        """Where a request would go; keyless with ``candidates`` > 1, also up to that many - 1 other
        workers of the same version that may take it now (usable, under ``max_ongoing_requests``)."""
        route = self._model(model)
        chosen, level, flags = self._versions.choose(route, version, routing_key, time.time())
        worker = self._delivery.pick(route, chosen, routing_key or self._fwd.new_id(), set())
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
            request = (
                route, version, inputs, routing_key, priority, timeout_s, outputs, parameters or {},
                sequence, on_partial, trace, fields, span,
            )  # fmt: skip
            if sequence is None:
                result = await self._delivery.send(route, *self._outgoing(*request))
            else:  # one request of a sequence at a time, in order
                async with self._sequences.turn(model, sequence):
                    try:
                        result = await self._delivery.send(route, *self._outgoing(*request))
                    finally:
                        if sequence.end:
                            self._sequences.end(model, sequence)
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

    def _outgoing(  # noqa: PLR0917  (the tuple ``infer`` builds once, for either of its two calls)
        self,
        route: ModelRoute,
        version: str,
        inputs: Mapping[str, np.ndarray],
        routing_key: str,
        priority: int,
        timeout_s: float | None,
        outputs: tuple[str, ...],
        parameters: Mapping[str, str],
        sequence: SequenceFlags | None,
        on_partial: Callable[[InferResult], None] | None,
        trace: Trace | None,
        log: dict[str, str],
        span: Any,
    ) -> tuple[Outgoing, float]:
        """What delivery sends for one request (the version chosen, the inputs checked) and its deadline;
        a sequence's, once its turn has come."""
        model = route.name
        pin = None
        if sequence is not None:
            pin = self._sequences.placed(route, self._snap.table, sequence, version, self._fwd.serving)
        chosen, _level, flags = self._versions.choose(
            route, pin.version if pin else version, routing_key, time.time()
        )
        meta = route.metadata.get(chosen)
        config = route.configs.get(chosen)
        if meta is not None:  # the worker's own check, here before any hop (a client error costs no trip)
            where = f"model {model}/{chosen}"
            tensor_signature.check_inputs(
                where, meta.inputs, inputs, config.max_batch_size if config else None
            )
            if outputs:
                tensor_signature.check_outputs(where, meta.outputs, outputs)
        if config is not None and config.decoupled and on_partial is None:
            raise InvalidArgument(
                f"model {model}/{chosen} is decoupled (it may answer a request several times): send its "
                "requests over a stream (ModelStreamInfer; tritonclient's start_stream)"
            )
        deadline = time.monotonic() + (timeout_s or self._timeout)
        rid = self._fwd.new_id()
        log["request_id"] = rid
        nbytes = sum(a.nbytes for a in inputs.values())
        features = self._snap.table.features_off if flags & FLAG_SECONDARY_OFF else ()
        req = Outgoing(
            model, chosen, routing_key or rid, rid, inputs, priority=priority, flags=flags,
            features=features, nbytes=nbytes, parameters=parameters, sequence=sequence, pin=pin,
            on_partial=on_partial, trace=trace, log=log, span=span,
            traceparent="" if span is None else tracing.traceparent(span),
        )  # fmt: skip
        if span is not None:
            span.set_attributes({"mcp.version": chosen, "mcp.request_id": rid})
        return req, deadline
