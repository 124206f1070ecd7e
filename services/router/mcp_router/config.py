"""The router's configuration: one frozen dataclass, built once in ``__main__`` (flags > env > YAML).

Env vars are ``MCP_ROUTER_<FIELD>``; the default ports are DESIGN.md section 13's (gRPC 8001 like Triton,
metrics 9101).
"""

from __future__ import annotations

from dataclasses import dataclass

from mcpcore.config import instance_id

__all__ = ["RouterConfig"]


@dataclass(frozen=True)
class RouterConfig:
    router_id: str = ""
    grpc_host: str = "127.0.0.1"
    grpc_port: int = 8001
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9101
    etcd_endpoints: tuple[str, ...] = ("127.0.0.1:2379",)
    etcd_prefix: str = "/mcp"
    etcd_timeout_s: float = 5.0
    #: Where RepositoryModelLoad/Unload go (the scheduler's gRPC address); empty = not offered.
    scheduler: str = "127.0.0.1:50051"
    #: Bounded loads: a worker takes a request while its in-flight count is below c x the mean.
    load_factor: float = 1.25
    #: Backpressure: requests in flight to one worker before RESOURCE_EXHAUSTED.
    max_in_flight_per_worker: int = 512
    #: Retries may add at most this fraction of the request rate.
    retry_budget_ratio: float = 0.2
    #: Deadline for a request that brings none.
    default_timeout_s: float = 30.0
    #: Windowed counts for the health service and demand reports for the scheduler.
    stats_window_s: float = 30.0
    stats_interval_s: float = 1.0
    stats_lease_ttl_s: int = 10
    #: gRPC server threads are not used (grpc.aio); this bounds concurrent RPCs.
    max_concurrent_rpcs: int = 4096

    def __post_init__(self) -> None:
        object.__setattr__(self, "router_id", instance_id(self.router_id, "router_id"))
        if self.load_factor < 1.0:
            raise ValueError(f"load_factor: must be >= 1.0, got {self.load_factor}")
        if not 0 <= self.retry_budget_ratio <= 1:
            raise ValueError(f"retry_budget_ratio: must be within 0..1, got {self.retry_budget_ratio}")
        if self.max_in_flight_per_worker < 1:
            raise ValueError("max_in_flight_per_worker: must be >= 1")
        if self.stats_lease_ttl_s <= self.stats_interval_s:
            raise ValueError("stats_lease_ttl_s: must be longer than stats_interval_s")
