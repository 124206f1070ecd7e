"""The scheduler's configuration: one frozen dataclass, built once in ``__main__`` (flags > env > YAML).

Env vars are ``MCP_SCHEDULER_<FIELD>``; names and defaults of ports follow DESIGN.md section 13.
The sections every service shares (gRPC and metrics serving, advertise, etcd, TLS, the process's options
and tuning) are ``mcpcore.settings``' and keep their flat names: ``grpc_port``, ``etcd_endpoints``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mcpcore.config import flat, instance_id
from mcpcore.settings import Advertise, EtcdSettings, GrpcServing, MetricsServing, ProcessOptions
from mcpcore.tls import TLSConfig

__all__ = ["SchedulerConfig"]


@dataclass(frozen=True)
class SchedulerConfig:
    #: This instance's id in leader election (several schedulers may run; one leads).
    scheduler_id: str = ""
    grpc: GrpcServing = field(default_factory=lambda: GrpcServing(port=50051), metadata=flat("grpc_"))
    advertise: Advertise = field(default_factory=Advertise, metadata=flat("advertise_"))
    metrics: MetricsServing = field(
        default_factory=lambda: MetricsServing(port=9102), metadata=flat("metrics_")
    )
    etcd: EtcdSettings = field(default_factory=EtcdSettings, metadata=flat("etcd_"))
    #: TLS / mutual TLS: this service's gRPC server and its calls (env MCP_SCHEDULER_TLS__CA_FILE, ...).
    tls: TLSConfig = field(default_factory=TLSConfig)
    #: Leader lease: a standby takes over within about this long after the leader dies.
    leader_ttl_s: int = 5
    #: Models are reconciled as they change; this often, what time alone changes is looked at (backoffs
    #: ending, hot copies going quiet, forced breaker levels expiring).
    reconcile_interval_s: float = 2.0
    #: A full pass over every model, whether it changed or not (the safety net under the change feed).
    resync_interval_s: float = 30.0
    #: Models planned at once: the event loop is held for one batch (a few milliseconds), then yielded.
    batch_size: int = 100
    #: Calls to workers (a Load waits for the model to load and warm up).
    worker_timeout_s: float = 60.0
    #: After a failed action on a replica, wait this long (doubling up to the max) before trying again.
    retry_backoff_s: float = 0.5
    retry_backoff_max_s: float = 30.0
    #: Extra copies of a hot model go away after this long without overflow.
    hot_quiet_period_s: float = 60.0
    #: Actions executed at once.
    max_parallel_actions: int = 16

    #: The process's own options: logging, tracing, tuning (``mcpcore.settings``, ``mcpcore.tuning``).
    process: ProcessOptions = field(default_factory=ProcessOptions, metadata=flat(""))

    def __post_init__(self) -> None:
        object.__setattr__(self, "scheduler_id", instance_id(self.scheduler_id, "scheduler_id"))
        if self.leader_ttl_s < 1:
            raise ValueError(f"leader_ttl_s: must be >= 1, got {self.leader_ttl_s}")
        if self.reconcile_interval_s <= 0:
            raise ValueError(f"reconcile_interval_s: must be > 0, got {self.reconcile_interval_s}")
        if not 0 < self.retry_backoff_s <= self.retry_backoff_max_s:
            raise ValueError("retry_backoff_s: must be > 0 and <= retry_backoff_max_s")
        if self.resync_interval_s <= 0:
            raise ValueError(f"resync_interval_s: must be > 0, got {self.resync_interval_s}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {self.batch_size}")
        if self.max_parallel_actions < 1:
            raise ValueError(f"max_parallel_actions: must be >= 1, got {self.max_parallel_actions}")
