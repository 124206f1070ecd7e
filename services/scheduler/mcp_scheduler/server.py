"""The scheduler process: state mirror, leader election, reconcile loop, v1 + v2 API on one port, metrics.

Every instance mirrors etcd and serves the API; only the elected leader reconciles. Losing the lease stops
reconciling at once; the actions already running finish (they are idempotent, so the next leader may
repeat them safely).
"""

from __future__ import annotations

import gc
import logging
from typing import Any

from prometheus_client import CollectorRegistry

from mcp_scheduler.config import SchedulerConfig
from mcp_scheduler.reconciler import Reconciler
from mcp_scheduler.service import ControlService
from mcp_scheduler.servicer_v1 import ModelControlV1
from mcp_scheduler.servicer_v2 import ModelControlV2
from mcp_scheduler.state import ClusterState
from mcp_scheduler.worker_client import WorkerClients
from mcpapi.v1 import control_pb2_grpc as v1_grpc
from mcpapi.v2 import control_pb2_grpc as v2_grpc
from mcpcore.election import LeaderElection
from mcpcore.etcd_store import EtcdStore
from mcpcore.keys import Keyspace
from mcpcore.looplag import LoopLagMonitor
from mcpcore.metrics import CommonMetrics, start_metrics_server
from mcpcore.serving import GrpcService, advertised_host

__all__ = ["Scheduler"]

log = logging.getLogger(__name__)
SERVICES = ("mcpapi.v1.ModelControl", "mcpapi.v2.ModelControl")


class SchedulerMetrics(CommonMetrics):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.is_leader = self.gauge("mcp_scheduler_leader_ratio", "1 while this scheduler leads, else 0.")
        self.reconciled = self.counter(
            "mcp_scheduler_reconciles_total", "Models reconciled (planned) by this scheduler while leading."
        )
        self.batch = self.histogram(
            "mcp_scheduler_batch_seconds",
            "Time one batch of models was planned for, holding the event loop.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )
        self.actions = self.counter(
            "mcp_scheduler_actions_total",
            "Actions this scheduler carried out while leading, by kind (load, start, pause, unload, forget, "
            "routing, rollback).",
            ("kind",),
        )
        self.queue = self.gauge("mcp_scheduler_queue_depth", "Models waiting in the reconcile queue.")
        self.lag_max = self.gauge(
            "mcp_scheduler_loop_block_max_seconds",
            "The longest the event loop was held (timer lag) since this scheduler last won the election "
            "(or started): what leading costs the API and the watches.",
        )
        self.full_pass = self.gauge(
            "mcp_scheduler_full_pass_seconds",
            "How long the last full pass over every model took (after winning the election, a re-list "
            "of etcd, or the periodic resync).",
        )
        self.fenced = self.counter(
            "mcp_scheduler_fenced_writes_total",
            "Leader writes etcd rejected because another scheduler leads now (this one was deposed).",
            ("what",),
        )


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.metrics = SchedulerMetrics(CollectorRegistry())
        self._lag = LoopLagMonitor(self._observe_lag)
        self._lag_max = 0.0
        self.keys = Keyspace(config.etcd.prefix)
        self.store = EtcdStore(config.etcd.endpoints, timeout=config.etcd.timeout_s, auth=config.etcd.auth)
        self.state = ClusterState(
            self.store,
            self.keys,
            on_rejected=self.metrics.count_config_rejected,
            on_error=self.metrics.count_loop_error,
            on_applied=self.metrics.watch_apply.labels("scheduler").observe,
            instance=config.scheduler_id,
        )
        self.election = LeaderElection(
            self.store,
            self.keys.leader("scheduler"),
            config.scheduler_id,
            ttl=config.leader_ttl_s,
            on_change=self._leadership,
            on_error=self.metrics.count_loop_error,
        )
        self.clients = WorkerClients(timeout_s=config.worker_timeout_s, tls=config.tls)
        self.reconciler = Reconciler(
            self.state,
            self.store,
            self.keys,
            self.clients,
            config,
            is_leader=lambda: self.election.is_leader,
            fence=self.election.fence,
            on_error=self.metrics.count_loop_error,
            on_fenced=lambda what: self.metrics.fenced.labels(what).inc(),
            on_reconciled=self._reconciled,
            on_full_pass=self._full_pass,
            on_action=lambda kind: self.metrics.actions.labels(kind).inc(),
        )
        self.service = ControlService(self.state, self.store, self.keys)
        self.grpc = GrpcService(SERVICES, tls=config.tls)
        self._metrics_server: Any = None
        self.endpoints: dict[str, str] = {}

    async def start(self) -> dict[str, str]:
        self._lag.start()
        cfg = self.config
        self._metrics_server, metrics_port = start_metrics_server(
            cfg.metrics.port, cfg.metrics.host, registry=self.metrics.registry
        )
        await self.store.connect()
        await self.state.start()
        gc.freeze()  # the mirrored cluster lives long: keep it out of the collector's full passes
        self.grpc.add(v1_grpc.add_ModelControlServicer_to_server, ModelControlV1(self.service))
        self.grpc.add(
            v2_grpc.add_ModelControlServicer_to_server,
            ModelControlV2(self.service, self.state, self.keys),
        )
        port = await self.grpc.start(cfg.grpc.host, cfg.grpc.port)
        self.reconciler.start()
        await self.election.start()
        await self.grpc.set_serving()
        self.endpoints = {
            "scheduler_id": cfg.scheduler_id,
            "grpc": f"{advertised_host(cfg.grpc.host, cfg.advertise.host)}:{port}",
            "metrics": f"{advertised_host(cfg.metrics.host, cfg.advertise.host)}:{metrics_port}",
        }
        return self.endpoints

    async def stop(self) -> None:
        await self._lag.stop()
        await self.grpc.stop()
        await self.election.stop()
        await self.reconciler.stop()
        await self.state.stop()
        await self.clients.close()
        await self.store.close()
        if self._metrics_server is not None:
            self._metrics_server.stop()

    async def _leadership(self, leading: bool) -> None:
        self.metrics.is_leader.set(1 if leading else 0)
        log.info("scheduler %s %s", self.config.scheduler_id, "leads" if leading else "follows")
        if leading:
            self._lag_max = 0.0
            self.metrics.lag_max.set(0.0)
            self.reconciler.resync()  # a full pass at once: the last leader may have left work undone

    def _full_pass(self, seconds: float) -> None:
        self.metrics.full_pass.set(seconds)
        # What a full pass leaves is the cluster's long-lived state. A full collection walks every
        # tracked object, and at 10,000 models that alone held the loop for over 100 ms: frozen
        # objects are skipped (they are still freed by reference counting when dropped).
        gc.freeze()

    def _observe_lag(self, seconds: float) -> None:
        self.metrics.loop_lag.observe(seconds)
        if seconds > self._lag_max:
            self._lag_max = seconds
            self.metrics.lag_max.set(seconds)

    def _reconciled(self, models: int, seconds: float) -> None:
        self.metrics.reconciled.inc(models)
        self.metrics.batch.observe(seconds)
        self.metrics.queue.set(len(self.reconciler.queue))
