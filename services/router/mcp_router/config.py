"""The router's configuration: one frozen dataclass, built once in ``__main__`` (flags > env > YAML).

Env vars are ``MCP_ROUTER_<FIELD>``; the default ports are DESIGN.md section 13's (gRPC 8001 and REST 8000
like Triton, metrics 9101). The sections every service shares (gRPC and metrics serving, advertise, etcd,
TLS, the process's options and tuning) are ``mcpcore.settings``' and keep their flat names: ``grpc_port``,
``etcd_endpoints``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mcpcore.config import flat, instance_id
from mcpcore.settings import Advertise, EtcdSettings, GrpcServing, MetricsServing, ProcessOptions
from mcpcore.tls import TLSConfig

__all__ = ["GRPC_SERVERS", "RouterConfig"]

GRPC_SERVERS = ("native", "aio")


@dataclass(frozen=True)
class RouterConfig:
    #: This router's id in the mesh (its etcd keys); empty: host name and pid.
    router_id: str = ""
    grpc: GrpcServing = field(default_factory=lambda: GrpcServing(port=8001), metadata=flat("grpc_"))
    advertise: Advertise = field(default_factory=Advertise, metadata=flat("advertise_"))
    #: KServe V2 over HTTP (Triton's REST API); port -1 turns it off.
    rest_host: str = "127.0.0.1"
    rest_port: int = 8000
    #: Largest REST request body (JSON and binary tensors), in bytes; larger ones are refused 413.
    rest_max_body_bytes: int = 64 << 20
    #: A REST connection on which no whole request arrives this long after it opened or was last answered
    #: is closed: an idle keep-alive one, or one sending its headers a byte at a time; seconds.
    rest_idle_timeout_s: float = 60.0
    #: The name ServerMetadata answers on both KServe doors (Triton's clients print it; "triton" for
    #: tools that look for Triton's own name).
    server_name: str = "mcpmesh"
    metrics: MetricsServing = field(
        default_factory=lambda: MetricsServing(port=9101), metadata=flat("metrics_")
    )
    #: Router processes on this host behind the same gRPC and REST ports (SO_REUSEPORT), sharing nothing
    #: but etcd: process i is router ``<router_id>-<i>`` with metrics on ``metrics_port + i``.
    processes: int = 1
    #: Bind the gRPC and REST ports with SO_REUSEPORT (what ``processes`` sets for each of its routers).
    reuse_port: bool = False
    etcd: EtcdSettings = field(default_factory=EtcdSettings, metadata=flat("etcd_"))
    #: TLS / mutual TLS: this service's gRPC server and its calls (env MCP_ROUTER_TLS__CA_FILE, ...).
    tls: TLSConfig = field(default_factory=TLSConfig)
    #: This router's CURVE key pair (a zmq.auth ``.key_secret`` file) for links to CURVE workers; workers
    #: with an allow-list (zmq_curve_clients_dir) accept only known keys. Empty: a fresh key per link.
    zmq_curve_secret_key_file: str = ""
    #: Where RepositoryModelLoad/Unload go (the scheduler's gRPC address); empty = not offered.
    scheduler: str = "127.0.0.1:50051"
    #: Bounded loads: a worker takes a request while its in-flight count is below c x the mean.
    load_factor: float = 1.25
    #: Backpressure: requests in flight to one worker, and tensor bytes in flight in all, past which a
    #: request goes elsewhere or is refused UNAVAILABLE "exceeds maximum queue size".
    max_in_flight_per_worker: int = 512
    max_bytes_in_flight: int = 1 << 30
    #: Size limits of one ZeroMQ message (keep them at least the workers' own, which never send more;
    #: a frame over these makes ZeroMQ drop the link).
    max_tensor_bytes: int = 16 << 20
    max_message_bytes: int = 64 << 20
    #: Requests for one worker made in one event-loop iteration leave as one coalesced ZeroMQ message at
    #: the next iteration, or at once when this many are waiting, so the worker starts on them while the
    #: router goes on (0: only at the next iteration).
    coalesce_flush_at: int = 8
    #: A request of 256 KiB of tensors or more to a worker on this host (its same-host endpoint, "shm" in
    #: its record) lends it a region of this process's memory: one copy in, outputs read in place
    #: (docs/design/same-host-transport.md). A worker that cannot take it gets frames.
    shared_memory: bool = True
    #: Link health: ZMTP heartbeats to every worker; a worker silent for ``link_timeout_s`` (dead, frozen,
    #: cut off) is a link down: keep it below the workers' lease TTL.
    link_heartbeat_s: float = 0.5
    link_timeout_s: float = 2.0
    #: A worker whose lease vanished while its link is healthy (etcd frozen or away) keeps its routes this
    #: long, or until its link fails or it registers again.
    worker_grace_s: float = 30.0
    #: Graceful stop (SIGTERM): report NOT_SERVING this long first (clients and balancers move away),
    #: then refuse new calls and give in-flight ones up to ``drain_timeout_s`` to finish.
    shutdown_delay_s: float = 1.0
    drain_timeout_s: float = 30.0
    #: Retries may add at most this fraction of the request rate.
    retry_budget_ratio: float = 0.2
    #: Deadline for a request that brings none.
    default_timeout_s: float = 30.0
    #: Windowed counts for the health service and demand reports for the scheduler.
    stats_window_s: float = 30.0
    stats_interval_s: float = 1.0
    stats_lease_ttl_s: int = 10
    #: Where TraceSetting's traces go (Triton's JSON trace file); empty: tracing cannot be turned on.
    #: Only this configuration sets it: clients change the other trace settings.
    trace_file: str = ""
    #: Calls open at once on the gRPC port; more are refused RESOURCE_EXHAUSTED.
    max_concurrent_rpcs: int = 4096
    #: The gRPC port's server: "native" (grpc++, ``mcp_native.grpc_server``; built by ``make native``)
    #: or "aio" (grpc.aio, as every other service). The same methods either way; native costs less CPU
    #: per call and sends large replies without a copy.
    grpc_server: str = "native"

    #: The process's own options: logging, tracing, tuning (``mcpcore.settings``, ``mcpcore.tuning``).
    process: ProcessOptions = field(default_factory=ProcessOptions, metadata=flat(""))

    def __post_init__(self) -> None:
        object.__setattr__(self, "router_id", instance_id(self.router_id, "router_id"))
        if self.grpc_server not in GRPC_SERVERS:
            raise ValueError(
                f"grpc_server: must be one of {', '.join(GRPC_SERVERS)}, got {self.grpc_server!r}"
            )
        if not 1 <= self.processes <= 64:
            raise ValueError(f"processes: must be within 1..64, got {self.processes}")
        if self.load_factor < 1.0:
            raise ValueError(f"load_factor: must be >= 1.0, got {self.load_factor}")
        if not 0 <= self.retry_budget_ratio <= 1:
            raise ValueError(f"retry_budget_ratio: must be within 0..1, got {self.retry_budget_ratio}")
        if not (self.server_name.isprintable() and 0 < len(self.server_name) <= 256):
            raise ValueError(f"server_name: 1 to 256 printable characters, got {self.server_name!r}")
        if not self.rest_idle_timeout_s > 0:
            raise ValueError(f"rest_idle_timeout_s: must be > 0 s, got {self.rest_idle_timeout_s}")
        if self.max_in_flight_per_worker < 1:
            raise ValueError("max_in_flight_per_worker: must be >= 1")
        if self.max_bytes_in_flight < 1:
            raise ValueError("max_bytes_in_flight: must be >= 1")
        if self.coalesce_flush_at < 0:
            raise ValueError(
                "coalesce_flush_at: must be >= 0 (0: only at the next loop iteration), "
                f"got {self.coalesce_flush_at}"
            )
        if not 0 < self.link_heartbeat_s < self.link_timeout_s:
            raise ValueError("link_timeout_s: must be above link_heartbeat_s (both > 0)")
        if self.worker_grace_s < 0 or self.shutdown_delay_s < 0 or self.drain_timeout_s < 0:
            raise ValueError("worker_grace_s, shutdown_delay_s and drain_timeout_s: must be >= 0")
        if self.stats_lease_ttl_s <= self.stats_interval_s:
            raise ValueError("stats_lease_ttl_s: must be longer than stats_interval_s")
