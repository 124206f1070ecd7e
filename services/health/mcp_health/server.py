"""The health process: one mirror of etcd, failure detection, breaker levels, alerts, ClusterHealth.

Several instances may run; each keeps its view current, only the leader (``/mcp/leader/health``) writes
and alerts. Periodic checks run every ``check_interval_s`` with jitter, so instances and restarts do not
fall into step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import Any

from prometheus_client import CollectorRegistry

from mcp_health.alerts import Alerter
from mcp_health.breaker_loop import BreakerLoop
from mcp_health.config import HealthConfig
from mcp_health.detector import Detector
from mcp_health.servicer_v2 import HealthV2
from mcpapi.v2 import health_pb2_grpc
from mcpcore.election import LeaderElection
from mcpcore.etcd_store import EtcdStore
from mcpcore.fencing import Fence
from mcpcore.keys import Keyspace
from mcpcore.lifecycle import ReplicaLifecycle
from mcpcore.looplag import LoopLagMonitor
from mcpcore.metrics import CommonMetrics, start_metrics_server
from mcpcore.mirror import PrefixMirror
from mcpcore.serving import GrpcService, advertised_host

__all__ = ["HealthServer"]

log = logging.getLogger(__name__)


class HealthMetrics(CommonMetrics):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.heartbeat_age = self.standard("mcp_heartbeat_age_seconds")
        self.breaker_level = self.standard("mcp_breaker_level")
        self.is_leader = self.gauge("mcp_health_leader_ratio", "1 while this health instance leads, else 0.")


class HealthServer:
    def __init__(self, config: HealthConfig) -> None:
        self.config = config
        self.metrics = HealthMetrics(CollectorRegistry())
        self._lag = LoopLagMonitor(self.metrics.loop_lag.observe)
        self.keys = Keyspace(config.etcd.prefix)
        self.store = EtcdStore(config.etcd.endpoints, timeout=config.etcd.timeout_s, auth=config.etcd.auth)
        self.election = LeaderElection(
            self.store, self.keys.leader("health"), config.health_id, ttl=config.leader_ttl_s,
            on_change=lambda leading: self.metrics.is_leader.set(1 if leading else 0),
            on_error=self.metrics.count_loop_error,
        )  # fmt: skip
        self.alerter = Alerter(webhook_url=config.alert_webhook, on_error=self.metrics.count_loop_error)
        self.mirror = PrefixMirror(
            self.store,
            self.keys.prefix + "/",
            on_change=self._changed,
            on_error=self.metrics.count_loop_error,
            on_applied=self.metrics.watch_apply.labels("health").observe,
            name="health",
        )
        self.detector = Detector(
            self.mirror, self.keys, ReplicaLifecycle(self.store, self.keys), self.alerter,
            report_timeout_s=config.report_timeout_s, sick_errors=config.sick_errors,
            worker_timeout_s=config.worker_timeout_s, fence=self._fence, tls=config.tls,
            on_heartbeat_age=lambda w, age: self.metrics.heartbeat_age.labels(w).set(age),
            on_error=self.metrics.count_loop_error,
        )  # fmt: skip
        self.breakers = BreakerLoop(
            self.mirror, self.store, self.keys, self.alerter, fence=self._fence,
            on_level=lambda m, level: self.metrics.breaker_level.labels(m).set(level),
            on_rejected=self.metrics.count_config_rejected, on_error=self.metrics.count_loop_error,
            instance=config.health_id,
        )  # fmt: skip
        self.grpc = GrpcService(["mcpapi.v2.Health"], tls=config.tls)
        self._task: asyncio.Task[None] | None = None
        self._metrics_server: Any = None
        self.endpoints: dict[str, str] = {}

    def _fence(self) -> Fence | None:
        """This instance's fencing token while it leads, else None (nothing is done)."""
        return self.election.fence() if self.election.is_leader else None

    def _changed(self, keys: set[str]) -> None:
        self.detector.on_change(keys)
        self.breakers.on_change(keys)

    async def start(self) -> dict[str, str]:
        self._lag.start()
        cfg = self.config
        self._metrics_server, metrics_port = start_metrics_server(
            cfg.metrics.port, cfg.metrics.host, registry=self.metrics.registry
        )
        servicer = HealthV2(self.mirror, self.keys, self.detector, self.breakers.operator_docs)
        self.grpc.add(health_pb2_grpc.add_HealthServicer_to_server, servicer)
        port = await self.grpc.start(cfg.grpc.host, cfg.grpc.port)
        await self.store.connect()
        await self.mirror.start()
        self.breakers.start()
        await self.election.start()
        self._task = asyncio.create_task(self._loop(), name="health-checks")
        await self.grpc.set_serving()
        self.endpoints = {
            "health_id": cfg.health_id,
            "grpc": f"{advertised_host(cfg.grpc.host, cfg.advertise.host)}:{port}",
            "metrics": f"{advertised_host(cfg.metrics.host, cfg.advertise.host)}:{metrics_port}",
        }
        return self.endpoints

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.check_interval_s * random.uniform(0.8, 1.2))
            try:
                self.detector.check()
                await self.breakers.check()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.metrics.count_loop_error("health_check")
                log.exception("health check failed; the next one runs on schedule")

    async def stop(self) -> None:
        await self._lag.stop()
        await self.grpc.stop()
        await self.breakers.stop()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.election.stop()
        await self.detector.close()
        await self.alerter.close()
        await self.mirror.stop()
        await self.store.close()
        if self._metrics_server is not None:
            self._metrics_server.stop()
