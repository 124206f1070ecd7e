"""The config sections every service shares, defined once and nested in each service's config class.

Each section is a frozen dataclass that a service's config nests; all but ``tls`` keep flat names
(``metadata=flat(...)``, ``mcpcore.config``), so the names operators, compose files and manifests use
stay what they were: ``etcd_endpoints`` / ``MCP_ROUTER_ETCD_ENDPOINTS`` / ``--etcd-endpoints`` set
``config.etcd.endpoints``. A service chooses its own default ports by its default instance::

    grpc: GrpcServing = field(default_factory=lambda: GrpcServing(port=8001), metadata=flat("grpc_"))

- ``EtcdSettings`` (``etcd_``): where etcd is, the key prefix, the call timeout, TLS and auth to it;
  ``MCP_ETCD_ENDPOINTS`` sets the endpoints of every service, below its own variable.
- ``GrpcServing`` (``grpc_``) and ``MetricsServing`` (``metrics_``): where the service's gRPC port and its
  Prometheus endpoint bind (port 0: a free one, published).
- ``Advertise`` (``advertise_``): the host others reach the service at, published in place of the bound one.
- ``TLSConfig`` (``tls``, nested: ``MCP_ROUTER_TLS__CA_FILE``): ``mcpcore.tls``.
- ``ProcessOptions`` (``flat("")``): the options of the service process rather than of the service:
  log format and level, tracing, and the ``tuning`` section (``mcpcore.tuning``). Besides their own
  prefixed names they keep the names every process reads: ``MCP_LOG_FORMAT``, ``MCP_LOG_LEVEL``,
  ``MCP_BATCH_HELPER_THREADS``, and OpenTelemetry's standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` and ``OTEL_TRACES_SAMPLER_ARG``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from mcpcore.config import shared_env
from mcpcore.etcd_store import EtcdAuth
from mcpcore.logs import FORMATS
from mcpcore.tuning import Tuning

__all__ = ["Advertise", "EtcdSettings", "GrpcServing", "MetricsServing", "ProcessOptions"]


@dataclass(frozen=True)
class EtcdSettings:
    #: etcd's client endpoints (``host:port``, comma separated).
    endpoints: tuple[str, ...] = field(default=("127.0.0.1:2379",), metadata=shared_env("MCP_ETCD_ENDPOINTS"))
    #: Every key the mesh writes is under this prefix (several meshes can share one etcd).
    prefix: str = "/mcp"
    #: Seconds an etcd call may take.
    timeout_s: float = 5.0
    #: TLS to etcd and etcd's user/password auth (env ``MCP_<SERVICE>_ETCD_AUTH__USER``, ...).
    auth: EtcdAuth = field(default_factory=EtcdAuth)

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ValueError("etcd_endpoints: name at least one etcd endpoint (host:port)")
        if self.timeout_s <= 0:
            raise ValueError(f"etcd_timeout_s: must be > 0, got {self.timeout_s}")


@dataclass(frozen=True)
class GrpcServing:
    #: The address the gRPC server binds (``0.0.0.0``: every interface; then set ``advertise_host``).
    host: str = "127.0.0.1"
    #: 0: a free port, published in etcd and in the "ready" line.
    port: int = 0


@dataclass(frozen=True)
class MetricsServing:
    """The Prometheus endpoint (``/metrics``)."""

    #: The address the Prometheus endpoint binds.
    host: str = "127.0.0.1"
    #: 0: a free port, published in the "ready" line.
    port: int = 0


@dataclass(frozen=True)
class Advertise:
    #: The host others reach this service at (a pod IP, a DNS name), published in place of the bound one;
    #: empty: the bound host, or this machine's host name when it binds a wildcard (``0.0.0.0``).
    host: str = ""


@dataclass(frozen=True)
class ProcessOptions:
    #: stderr lines: ``json`` (one object a line) or ``text`` (for people at a terminal; ``mcpcore.logs``).
    log_format: str = field(default="json", metadata=shared_env("MCP_LOG_FORMAT"))
    #: The lowest level logged: DEBUG, INFO, WARNING, ERROR or CRITICAL.
    log_level: str = field(default="INFO", metadata=shared_env("MCP_LOG_LEVEL"))
    #: Where trace spans go over OTLP/gRPC (e.g. ``http://127.0.0.1:4317``; a bare ``host:port`` is taken
    #: as plaintext http); empty: no tracing (``mcpcore.tracing``).
    otlp_endpoint: str = field(
        default="", metadata=shared_env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
    )
    #: The share of new traces sampled, 0 to 1 (a request with a sampled parent is always traced).
    trace_sample_ratio: float = field(default=1.0, metadata=shared_env("OTEL_TRACES_SAMPLER_ARG"))
    tuning: Tuning = field(default_factory=Tuning.for_this_process)

    def __post_init__(self) -> None:
        log_format = self.log_format.strip().lower()
        if log_format not in FORMATS:
            raise ValueError(f"log_format: use one of {', '.join(FORMATS)}, got {self.log_format!r}")
        object.__setattr__(self, "log_format", log_format)
        level = self.log_level.strip().upper()
        if not isinstance(logging.getLevelName(level), int):
            raise ValueError(
                f"log_level: use DEBUG, INFO, WARNING, ERROR or CRITICAL, got {self.log_level!r}"
            )
        object.__setattr__(self, "log_level", level)
        endpoint = self.otlp_endpoint.strip()
        if endpoint and "://" not in endpoint:
            endpoint = "http://" + endpoint  # a collector beside the process speaks plaintext
        object.__setattr__(self, "otlp_endpoint", endpoint)
        if not 0.0 <= self.trace_sample_ratio <= 1.0:
            raise ValueError(
                f"trace_sample_ratio: give the share of traces to sample, 0 to 1 (1: all), "
                f"got {self.trace_sample_ratio}"
            )
