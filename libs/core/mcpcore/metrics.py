"""Prometheus metrics for every mcpmesh service: the standard names, and a ``/metrics`` server per process.

Invariants:
- Every metric lives on a ``CollectorRegistry`` the service object owns (never the global default), so a
  test can build as many services as it likes in one process.
- Names follow ``mcp_<what>_<unit>``: counters end in ``_total``, durations are ``_seconds``. Each standard
  name, with its help text and labels, is defined once, in ``STANDARD`` below; a service that exports one of
  them takes it from there, so the router and the health service never disagree on its labels.
- Background loops catch, log, count (``mcp_loop_errors_total{loop}``) and continue.

How a service defines its metrics (once, in one class)::

    class WorkerMetrics(RequestMetrics):
        def __init__(self, registry: CollectorRegistry) -> None:
            super().__init__(registry)                      # common + request metrics
            self.batch_size = self.standard("mcp_batch_size")
            self.queue_depth = self.standard("mcp_queue_depth")
            self.decrypt_seconds = self.histogram(          # service-specific: checked names
                "mcp_model_decrypt_seconds", "Time to decrypt a model's weights.", ("model",)
            )

    metrics = WorkerMetrics(CollectorRegistry())
    server, port = start_metrics_server(9110, registry=metrics.registry)
    ...
    server.stop()

A service may serve JSON documents beside ``/metrics`` (the router's ``/debug/snapshot``)::

    start_metrics_server(9101, registry=..., routes={"/debug/snapshot": lambda: {"models": ...}})

A route's callable runs on one of the HTTP server's threads, not on the service's event loop: it must only
read state that is swapped whole (an immutable snapshot) and copy mutable dicts before iterating them.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily

from mcpcore.records import UNKNOWN_FIELDS

__all__ = [
    "DURATION_BUCKETS",
    "LAG_BUCKETS",
    "STANDARD",
    "CommonMetrics",
    "JsonRoute",
    "MetricSpec",
    "Metrics",
    "MetricsServer",
    "RequestMetrics",
    "start_metrics_server",
]

#: Request latencies: 0.5 ms .. 10 s.
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Fast local work such as applying a watch event to a snapshot: 50 µs .. 1 s.
FAST_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0)
#: Event-loop lag (how late a timer fires): 0.25 ms .. 1 s, fine around the 10 ms target.
LAG_BUCKETS = (0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.05, 0.1, 0.25, 1.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
RATIO_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)

_NAME = re.compile(r"mcp_[a-z][a-z0-9_]*[a-z0-9]")

log = logging.getLogger(__name__)

#: A JSON route: called per GET, returns the document to serve (JSON-serialisable).
JsonRoute = Callable[[], Mapping[str, Any]]
GENERIC_ERROR = "internal error; the server log has the details"


@dataclass(frozen=True)
class MetricSpec:
    kind: type[Counter] | type[Gauge] | type[Histogram]
    doc: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None


_REQ = ("model", "version", "api_version", "outcome")
_MV = ("model", "version")

#: DESIGN §10's metrics (plus the ones the shipped alert rules need): name -> kind, help, labels.
STANDARD: dict[str, MetricSpec] = {
    "mcp_request_duration_seconds": MetricSpec(Histogram, "Request latency.", _REQ, DURATION_BUCKETS),
    "mcp_requests_total": MetricSpec(Counter, "Requests answered, by outcome.", _REQ),
    "mcp_request_errors_total": MetricSpec(Counter, "Failed requests by error class.", (*_MV, "class")),
    "mcp_batch_size": MetricSpec(Histogram, "Requests per executed batch.", _MV, BATCH_SIZE_BUCKETS),
    "mcp_batch_utilization_ratio": MetricSpec(
        Histogram, "Batch size over max_batch_size, per executed batch.", _MV, RATIO_BUCKETS
    ),
    "mcp_queue_depth": MetricSpec(Gauge, "Requests waiting in the batching queue.", _MV),
    "mcp_queue_delay_seconds": MetricSpec(
        Histogram, "Time a request waited in the queue before its batch ran.", _MV, DURATION_BUCKETS
    ),
    "mcp_gpu_utilization_ratio": MetricSpec(Gauge, "GPU utilization, 0..1.", ("device_id",)),
    "mcp_gpu_memory_used_bytes": MetricSpec(Gauge, "GPU memory in use.", ("device_id",)),
    "mcp_model_cache_hits_total": MetricSpec(Counter, "Loads answered from models already held.", ("model",)),
    "mcp_model_state": MetricSpec(
        Gauge, "1 for a replica's current lifecycle state, 0 otherwise.", (*_MV, "worker", "state")
    ),
    "mcp_model_load_failures_total": MetricSpec(Counter, "Model loads that ended in ERROR.", _MV),
    "mcp_breaker_level": MetricSpec(Gauge, "Circuit breaker level in force, 0 (closed) .. 3.", ("model",)),
    "mcp_heartbeat_age_seconds": MetricSpec(Gauge, "Age of a worker's last load report.", ("worker",)),
    "mcp_config_rejected_total": MetricSpec(
        Counter, "Invalid operator-written values ignored (the last good value stays).", ("key",)
    ),
    "mcp_watch_apply_seconds": MetricSpec(
        Histogram, "Time to apply a watch event to the local snapshot.", ("watch",), FAST_BUCKETS
    ),
    "mcp_loop_errors_total": MetricSpec(
        Counter, "Errors caught by a background loop that went on.", ("loop",)
    ),
    "mcp_event_loop_lag_seconds": MetricSpec(
        Histogram, "How late the event loop ran a timer (time it was blocked or busy).", (), LAG_BUCKETS
    ),
}


class Metrics:
    """Base of a service's metrics: creates checked metrics on the service's own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()

    def standard(self, name: str) -> Any:
        """One of the ``STANDARD`` metrics, with its defined help and labels."""
        spec = STANDARD[name]
        extra = {"buckets": spec.buckets} if spec.buckets is not None else {}
        return self._make(spec.kind, name, spec.doc, spec.labels, **extra)

    def counter(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        return self._make(Counter, name, doc, labels)

    def gauge(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        return self._make(Gauge, name, doc, labels)

    def histogram(
        self, name: str, doc: str, labels: tuple[str, ...] = (), buckets: tuple[float, ...] = DURATION_BUCKETS
    ) -> Histogram:
        return self._make(Histogram, name, doc, labels, buckets=buckets)

    def _make(self, kind: type[Any], name: str, doc: str, labels: tuple[str, ...], **kw: Any) -> Any:
        if not _NAME.fullmatch(name):
            raise ValueError(f"metric name {name!r}: must look like mcp_<what>_<unit> (lower case)")
        if (kind is Counter) != name.endswith("_total"):
            raise ValueError(f"metric name {name!r}: counters, and only counters, end in _total")
        if name in STANDARD and (STANDARD[name].kind is not kind or STANDARD[name].labels != tuple(labels)):
            raise ValueError(f"metric {name!r} is a standard metric: use standard({name!r})")
        return kind(name, doc, labelnames=labels, registry=self.registry, **kw)


class CommonMetrics(Metrics):
    """What every service exports: rejected config values, watch apply times, background loop errors, and
    the event loop's lag (``mcpcore.looplag``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        self.config_rejected = self.standard("mcp_config_rejected_total")
        self.watch_apply = self.standard("mcp_watch_apply_seconds")
        self.loop_errors = self.standard("mcp_loop_errors_total")
        self.loop_lag = self.standard("mcp_event_loop_lag_seconds")
        self.registry.register(_UnknownFields())

    def count_loop_error(self, loop: str) -> None:
        self.loop_errors.labels(loop=loop).inc()

    def count_config_rejected(self, key: str) -> None:
        self.config_rejected.labels(key=key).inc()


class _UnknownFields:
    """``mcp_record_unknown_fields_total{kind}``: fields of process-written etcd documents this process did
    not know and ignored (``mcpcore.records.UNKNOWN_FIELDS``: a newer writer is about)."""

    def collect(self) -> Iterable[CounterMetricFamily]:
        family = CounterMetricFamily(
            "mcp_record_unknown_fields",
            "Unknown fields ignored in process-written etcd documents.",
            labels=["kind"],
        )
        for kind, count in sorted(UNKNOWN_FIELDS.items()):
            family.add_metric([kind], count)
        yield family


class RequestMetrics(CommonMetrics):
    """Common metrics plus the request path's (router, worker)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        self.request_duration = self.standard("mcp_request_duration_seconds")
        self.requests = self.standard("mcp_requests_total")
        self.request_errors = self.standard("mcp_request_errors_total")
        self._children: dict[tuple[str, str, str, str, str | None], tuple[Any, Any, Any]] = {}

    def observe_request(
        self,
        model: str,
        version: str,
        api_version: str,
        outcome: str,
        *,
        seconds: float,
        error_class: str | None = None,
    ) -> None:
        """Record one answered request; ``outcome`` is e.g. ``ok`` or a status name, ``error_class`` (for
        failures) what the breaker counts by, e.g. ``timeout``, ``resource``, ``client``. The labelled
        children are looked up once per label set (callers pass only bounded label values)."""
        key = (model, version, api_version, outcome, error_class)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                self.request_duration.labels(model, version, api_version, outcome),
                self.requests.labels(model, version, api_version, outcome),
                None if error_class is None else self.request_errors.labels(model, version, error_class),
            )
        duration, count, errors = children
        duration.observe(seconds)
        count.inc()
        if errors is not None:
            errors.inc()


class MetricsServer:
    """A running ``/metrics`` HTTP server (prometheus_client's WSGI server in a daemon thread)."""

    def __init__(self, httpd: Any, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread
        self.host: str = httpd.server_address[0]
        self.port: int = httpd.server_port
        self._stopped = False

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and close the listening socket; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_metrics_server(
    port: int,
    host: str = "127.0.0.1",
    registry: CollectorRegistry | None = None,
    *,
    routes: Mapping[str, JsonRoute] | None = None,
) -> tuple[MetricsServer, int]:
    """Serve ``registry`` (default: prometheus_client's global one) on ``http://host:port/metrics``, and
    each of ``routes`` (path -> callable) as ``application/json``; every other path is the metrics, as
    prometheus_client serves them.

    Port 0 picks a free port; the second item is the port actually bound (DESIGN §13: router 9101,
    scheduler 9102, health 9103, workers 9110+). Call ``server.stop()`` to close it.
    """
    table = dict(routes or {})
    for path in table:
        if not path.startswith("/") or path == "/metrics":
            raise ValueError(f"metrics server route {path!r}: must start with '/' and not be /metrics")
    httpd, thread = start_http_server(
        port, addr=host, registry=registry if registry is not None else REGISTRY
    )
    if table:
        # The server thread already runs; it reads the app per request, so from here on every request
        # sees the routes. Only a request sent before this function returns (to a port the caller has
        # not even been told about yet, for port 0) could get the metrics at a route's path.
        httpd.set_app(_with_routes(httpd.get_app(), table))
    server = MetricsServer(httpd, thread)
    return server, server.port


def _with_routes(app: Callable[..., Iterable[bytes]], routes: Mapping[str, JsonRoute]) -> Any:
    """A WSGI app serving ``routes`` as JSON and handing every other path to ``app``."""

    def routed(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        route = routes.get(path)
        if route is None:
            return app(environ, start_response)
        if environ.get("REQUEST_METHOD") != "GET":
            return _json_reply(start_response, "405 Method Not Allowed", {"error": f"{path}: GET only"})
        try:
            body = json.dumps(dict(route())).encode()
        except Exception:  # a broken route must not take the metrics server down with it
            log.exception("metrics server: route %s failed", path)
            return _json_reply(start_response, "500 Internal Server Error", {"error": GENERIC_ERROR})
        return _json_reply(start_response, "200 OK", body)

    return routed


def _json_reply(start_response: Callable[..., Any], status: str, body: bytes | dict[str, str]) -> list[bytes]:
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
