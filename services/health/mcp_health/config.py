"""The health service's configuration: one frozen dataclass, built once in ``__main__`` (flags > env > YAML).

Env vars are ``MCP_HEALTH_<FIELD>``; ports follow DESIGN.md section 13 (gRPC 50053, metrics 9103).
The sections every service shares (gRPC and metrics serving, advertise, etcd, TLS, the process's options
and tuning) are ``mcpcore.settings``' and keep their flat names: ``grpc_port``, ``etcd_endpoints``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mcpcore.config import flat, instance_id
from mcpcore.settings import Advertise, EtcdSettings, GrpcServing, MetricsServing, ProcessOptions
from mcpcore.tls import TLSConfig

__all__ = ["HealthConfig"]


@dataclass(frozen=True)
class HealthConfig:
    #: This instance's id in leader election (several may run; one leads); empty: host name and pid.
    health_id: str = ""
    grpc: GrpcServing = field(default_factory=lambda: GrpcServing(port=50053), metadata=flat("grpc_"))
    advertise: Advertise = field(default_factory=Advertise, metadata=flat("advertise_"))
    metrics: MetricsServing = field(
        default_factory=lambda: MetricsServing(port=9103), metadata=flat("metrics_")
    )
    etcd: EtcdSettings = field(default_factory=EtcdSettings, metadata=flat("etcd_"))
    #: TLS / mutual TLS: this service's gRPC server and its calls (env MCP_HEALTH_TLS__CA_FILE, ...).
    tls: TLSConfig = field(default_factory=TLSConfig)
    #: The leader's lease TTL: a dead leader is replaced within about this long.
    leader_ttl_s: int = 5
    #: Periodic checks (report ages, error rates) run about this often, with +-20% jitter.
    check_interval_s: float = 0.5
    #: A worker whose load report is older than this is dead even if its lease still holds.
    report_timeout_s: float = 10.0
    #: Requests failed by a worker's models between two checks that make it sick (EmergencyStop).
    sick_errors: int = 20
    #: Alertmanager-compatible webhook (POST /api/v2/alerts); empty = alerts are log lines only.
    alert_webhook: str = ""
    #: Calls to workers' control API (EmergencyStop).
    worker_timeout_s: float = 10.0

    #: The process's own options: logging, tracing, tuning (``mcpcore.settings``, ``mcpcore.tuning``).
    process: ProcessOptions = field(default_factory=ProcessOptions, metadata=flat(""))

    def __post_init__(self) -> None:
        object.__setattr__(self, "health_id", instance_id(self.health_id, "health_id"))
        if self.check_interval_s <= 0:
            raise ValueError(f"check_interval_s: must be > 0, got {self.check_interval_s}")
        if self.report_timeout_s <= self.check_interval_s:
            raise ValueError("report_timeout_s: must be longer than check_interval_s")
        if self.alert_webhook and not self.alert_webhook.startswith(("http://", "https://")):
            raise ValueError(f"alert_webhook: must be an http:// or https:// URL, got {self.alert_webhook!r}")
        if self.sick_errors < 1:
            raise ValueError(f"sick_errors: must be >= 1, got {self.sick_errors}")
