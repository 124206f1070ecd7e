"""OpenTelemetry tracing of the request path: on only when an OTLP endpoint is configured.

- ``setup`` (``mcpcore.runner``, once per process, before the service object is made): given an OTLP
  endpoint and a sample ratio (the process's options, ``mcpcore.settings.ProcessOptions``: flags, or the
  standard ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`` and ``OTEL_TRACES_SAMPLER_ARG``), installs a
  TracerProvider with resource ``service.name`` (``mcp-router``, ``mcp-worker``, ...), parent-based
  sampling at that ratio for new traces, and a BatchSpanProcessor that sends OTLP over gRPC (the SDK reads
  its own ``OTEL_BSP_*`` and ``OTEL_EXPORTER_OTLP_*`` settings). Without an endpoint it installs nothing.
  ``shutdown`` exports what is still buffered, waiting a bounded time (process stop).
- ``tracer(name)``: a tracer, or None while tracing is off. Services resolve it once, when they make
  their objects, and the request path tests that attribute: with tracing off it makes no span object,
  reads no metadata and parses no header.
- W3C trace context: ``extract_metadata`` / ``extract_headers`` read ``traceparent`` and ``tracestate``
  from gRPC metadata or HTTP headers (a context to ``attach`` around the request, under which the router
  starts its server span); ``traceparent(span)`` writes the value of the ZeroMQ header parameter
  ``wire.PARAM_TRACEPARENT``, and ``from_traceparent`` reads it back on the worker.
- Work done for several requests at once (a worker's batch): ``start_batch`` makes its span a child of
  the first traced request and links it to every one (OpenTelemetry's pattern for batches); ``record``
  writes a span whose start and end are already known (a request's wait in a queue, the backend call
  measured on the executor thread), so nothing but the event loop touches a span.

Invariants: the process's tracing state is set here once (``setup``) and read everywhere else; nothing
here reads the environment; a request whose parent was not sampled costs the worker no span.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = [
    "HEADERS",
    "attach",
    "detach",
    "enabled",
    "end",
    "extract_headers",
    "extract_metadata",
    "from_traceparent",
    "record",
    "sampled_parent",
    "setup",
    "shutdown",
    "start_batch",
    "traceparent",
    "tracer",
]

log = logging.getLogger(__name__)

#: The W3C trace context headers, as gRPC metadata keys (lower case) and HTTP header names.
HEADERS = ("traceparent", "tracestate")
SHUTDOWN_TIMEOUT_S = 5.0  # a stop waits at most this for the last spans to go out
_PROPAGATOR = TraceContextTextMapPropagator()
_EMPTY = otel_context.Context()


class _State:
    provider: Any = None  # the SDK's TracerProvider once setup installed one


_state = _State()


def setup(
    service: str,
    otlp_endpoint: str,
    *,
    sample_ratio: float = 1.0,
    attributes: Mapping[str, str] | None = None,
) -> bool:
    """Trace this process when ``otlp_endpoint`` is set (see the module's docstring); returns whether
    tracing is on. ``sample_ratio``: the share of new traces sampled (0..1, checked by the config);
    ``attributes``: more resource attributes (the process's identity)."""
    if not otlp_endpoint:
        return False
    ratio = sample_ratio
    # the SDK and the exporter (grpc) are imported only by a process that traces
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter  # noqa: PLC0415
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased  # noqa: PLC0415

    resource = Resource.create({**(attributes or {}), "service.name": service})
    provider = TracerProvider(
        resource=resource, sampler=ParentBased(TraceIdRatioBased(ratio)), shutdown_on_exit=False
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
    trace.set_tracer_provider(provider)
    _state.provider = provider
    log.info("tracing on: OTLP spans to %s, new traces sampled at %g", otlp_endpoint, ratio)
    return True


def enabled() -> bool:
    return _state.provider is not None


def tracer(name: str) -> trace.Tracer | None:
    """A tracer for ``name`` (a module), or None while tracing is off: resolve it once, not per request."""
    provider = _state.provider
    return None if provider is None else provider.get_tracer(name)


def shutdown(timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
    """Export the spans still buffered and stop, waiting at most ``timeout_s`` (a collector that is down
    must not hold a stopping process)."""
    provider, _state.provider = _state.provider, None
    if provider is None:
        return
    done = threading.Thread(target=provider.shutdown, name="otel-shutdown", daemon=True)
    done.start()
    done.join(timeout_s)
    if done.is_alive():
        log.warning("tracing: the last spans were not exported within %.0f s of the stop; dropped", timeout_s)


# --- W3C trace context --------------------------------------------------------------------------------


def extract_metadata(metadata: Iterable[tuple[str, Any]] | None) -> otel_context.Context:
    """The caller's trace context from gRPC invocation metadata (an empty context when it sent none)."""
    carrier = {key: value for key, value in metadata or () if key in HEADERS and isinstance(value, str)}
    return _PROPAGATOR.extract(carrier, _EMPTY) if carrier else _EMPTY


def extract_headers(headers: Mapping[str, str]) -> otel_context.Context:
    """The caller's trace context from HTTP headers (case-insensitive ones, as aiohttp's are)."""
    carrier = {key: value for key in HEADERS if (value := headers.get(key)) is not None}
    return _PROPAGATOR.extract(carrier, _EMPTY) if carrier else _EMPTY


def attach(ctx: otel_context.Context) -> object:
    """Make ``ctx`` the current trace context until ``detach`` (the same task, the same context)."""
    return otel_context.attach(ctx)


def detach(token: object) -> None:
    otel_context.detach(token)  # type: ignore[arg-type]


def traceparent(span: trace.Span) -> str:
    """The W3C traceparent naming ``span`` as the parent ("" for an invalid span)."""
    sc = span.get_span_context()
    if not sc.is_valid:
        return ""
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"


def from_traceparent(value: str) -> otel_context.Context:
    """The context a ``traceparent`` value names as the parent (empty for "" or a malformed value)."""
    return _PROPAGATOR.extract({"traceparent": value}, _EMPTY) if value else _EMPTY


def sampled_parent() -> trace.SpanContext | None:
    """The current context's span, when it is a valid and sampled one to record children under."""
    sc = trace.get_current_span().get_span_context()
    return sc if sc.is_valid and sc.trace_flags.sampled else None


# --- spans of work already measured -------------------------------------------------------------------


def _context_of(parent: trace.SpanContext | trace.Span) -> otel_context.Context:
    span = parent if isinstance(parent, trace.Span) else trace.NonRecordingSpan(parent)
    return trace.set_span_in_context(span, _EMPTY)


def record(
    tracer: trace.Tracer,
    name: str,
    parent: trace.SpanContext | trace.Span,
    start_ns: int,
    end_ns: int,
    *,
    attributes: Mapping[str, Any] | None = None,
    links: Iterable[trace.SpanContext] = (),
    error: str = "",
) -> None:
    """A span from ``start_ns`` to ``end_ns`` (wall clock, ns) under ``parent``; ``error``: it failed so."""
    span = tracer.start_span(
        name,
        _context_of(parent),
        attributes=attributes,
        links=[trace.Link(sc) for sc in links],
        start_time=start_ns,
    )
    end(span, error, end_ns)


def start_batch(
    tracer: trace.Tracer,
    name: str,
    parents: list[trace.SpanContext],
    start_ns: int,
    *,
    attributes: Mapping[str, Any] | None = None,
) -> trace.Span:
    """The span of work done for several requests at once: a child of ``parents[0]``, linked to each."""
    return tracer.start_span(
        name,
        _context_of(parents[0]),
        attributes=attributes,
        links=[trace.Link(sc) for sc in parents],
        start_time=start_ns,
    )


def end(span: trace.Span, error: str = "", end_ns: int | None = None) -> None:
    """End ``span`` (now, or at ``end_ns``); ``error``: as failed, with that description."""
    if error:
        span.set_status(trace.Status(trace.StatusCode.ERROR, error))
    span.end(end_time=end_ns)
