"""The health service's configuration: one frozen dataclass, built once in ``__main__`` (flags > env > YAML).

Env vars are ``MCP_HEALTH_<FIELD>``; ports follow DESIGN.md section 13 (gRPC 50053, metrics 9103).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mcpcore.config import instance_id
from mcpcore.etcd_store import EtcdAuth
from mcpcore.tls import TLSConfig

__all__ = ["HealthConfig"]


@dataclass(frozen=True)
class HealthConfig:
    health_id: str = ""
    grpc_host: str = "127.0.0.1"
    grpc_port: int = 50053
    #: The host others reach this service at (a pod IP, a DNS name), published in place of the bound one;
    #: empty: the bound host, or this machine's host name when it binds a wildcard (``0.0.0.0``).
    advertise_host: str = ""
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9103
    etcd_endpoints: tuple[str, ...] = ("127.0.0.1:2379",)
    etcd_prefix: str = "/mcp"
    etcd_timeout_s: float = 5.0
    #: TLS to etcd and etcd's user/password auth (env MCP_HEALTH_ETCD_AUTH__USER, ...; README "Securing").
    etcd_auth: EtcdAuth = field(default_factory=EtcdAuth)
    #: TLS / mutual TLS: this service's gRPC server and its calls (env MCP_HEALTH_TLS__CA_FILE, ...).
    tls: TLSConfig = field(default_factory=TLSConfig)
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
