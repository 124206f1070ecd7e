"""The worker process: wires the repository, backends, batching, ZeroMQ, gRPC control, etcd and metrics.

Start-up order is what makes the published record true: the data (ZeroMQ) and control (gRPC) endpoints are
bound first, so the worker record in etcd only ever names endpoints that answer. etcd being down at start
is not fatal: the heartbeat loop registers as soon as it can, and serving never waits for it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from mcp_worker import numa
from mcp_worker.batching import Dispatcher
from mcp_worker.breakers import BreakerWatch
from mcp_worker.buffers import BatchBuffers
from mcp_worker.config import WorkerConfig
from mcp_worker.memory import MemoryBudget
from mcp_worker.models import ModelManager
from mcp_worker.registration import Registration
from mcp_worker.repository import ModelRepository
from mcp_worker.servicer_v2 import WorkerControlServicer
from mcp_worker.zmq_server import TensorServer, load_curve_secret
from mcpapi.v2 import worker_pb2_grpc
from mcpcore import wire
from mcpcore.crypto import Keyring
from mcpcore.errors import MCPError, NotFound, error_class
from mcpcore.etcd_store import EtcdStore
from mcpcore.keys import Keyspace, ReplicaId
from mcpcore.lifecycle import ReplicaLifecycle, ReplicaState
from mcpcore.metrics import RequestMetrics, start_metrics_server
from mcpcore.serving import GrpcService

__all__ = ["Worker", "WorkerMetrics"]

log = logging.getLogger(__name__)
SERVICE_NAME = "mcpapi.v2.WorkerControl"


class WorkerMetrics(RequestMetrics):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.batch_size = self.standard("mcp_batch_size")
        self.batch_utilization = self.standard("mcp_batch_utilization_ratio")
        self.queue_depth = self.standard("mcp_queue_depth")
        self.queue_delay = self.standard("mcp_queue_delay_seconds")
        self.model_state = self.standard("mcp_model_state")
        self.gpu_memory = self.standard("mcp_gpu_memory_used_bytes")
        self.gpu_utilization = self.standard("mcp_gpu_utilization_ratio")
        self.load_failures = self.standard("mcp_model_load_failures_total")
        self.breaker_level = self.standard("mcp_breaker_level")


class Worker:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.metrics = WorkerMetrics(CollectorRegistry())
        self.keys = Keyspace(config.etcd_prefix)
        self.store = EtcdStore(config.etcd_endpoints, timeout=config.etcd_timeout_s)
        self._executor = ThreadPoolExecutor(config.exec_slots, thread_name_prefix="mcp-exec")
        self.buffers = BatchBuffers(blocks_per_class=2 * config.exec_slots)
        self.dispatcher = Dispatcher(
            slots=config.exec_slots, executor=self._executor, metrics=self.metrics, buffers=self.buffers
        )
        keyring = Keyring.load(config.keyring) if config.keyring else None
        self.manager = ModelManager(
            worker_id=config.worker_id,
            repository=ModelRepository(Path(config.repository), keyring),
            lifecycle=ReplicaLifecycle(self.store, self.keys),
            dispatcher=self.dispatcher,
            budget=MemoryBudget(config.memory_capacity_bytes, owner=f"worker {config.worker_id}"),
            checkpoint_dir=Path(config.checkpoint_dir),
            on_state=self._state_changed,
        )
        self._curve_public = b""
        curve_secret = None
        if config.zmq_curve_secret_key_file:
            self._curve_public, curve_secret = load_curve_secret(config.zmq_curve_secret_key_file)
        self.tensors = TensorServer(
            config.zmq_bind,
            self._handle,
            limits=wire.Limits(
                max_tensor_bytes=config.max_tensor_bytes, max_message_bytes=config.max_message_bytes
            ),
            curve_secret=curve_secret,
            on_error=self.metrics.count_loop_error,
            buffers=self.buffers,
        )
        self.grpc = GrpcService([SERVICE_NAME], options=[("grpc.max_receive_message_length", 16 << 20)])
        self.breakers = BreakerWatch(
            self.store,
            self.keys,
            on_level=self._breaker_level,
            on_rejected=self.metrics.count_config_rejected,
            on_error=self.metrics.count_loop_error,
        )
        self.registration: Registration | None = None
        self.endpoints: dict[str, str] = {}
        self._metrics_server: Any = None
        self._started = time.time()

    async def start(self) -> dict[str, str]:
        cfg = self.config
        if cfg.numa_pin:
            bus_id = cfg.gpu_pci_bus_id or numa.nvidia_smi_pci_bus_id(cfg.gpu_index)
            if bus_id:
                numa.pin_to_gpu_numa_node(bus_id)
            else:
                log.info("numa_pin: no GPU bus id (set gpu_pci_bus_id, or install nvidia-smi); not pinning")
        self._metrics_server, metrics_port = start_metrics_server(
            cfg.metrics_port, cfg.metrics_host, registry=self.metrics.registry
        )
        zmq_endpoint = await self.tensors.start()
        worker_pb2_grpc.add_WorkerControlServicer_to_server(
            WorkerControlServicer(self.manager), self.grpc.server
        )
        port = await self.grpc.start(cfg.grpc_host, cfg.grpc_port)
        host = cfg.advertise_host
        self.endpoints = {
            "worker_id": cfg.worker_id,
            "grpc": f"{host or cfg.grpc_host}:{port}",
            "zmq": _advertised(zmq_endpoint, host),
            "metrics": f"{host or cfg.metrics_host}:{metrics_port}",
        }
        self.manager.set_info({"zmq": zmq_endpoint, "grpc": self.endpoints["grpc"]})
        await self.store.connect()
        self.registration = Registration(
            self.store,
            self.keys,
            cfg.worker_id,
            record=self._record,
            report=self._report,
            resync=self.manager.resync,
            ttl=cfg.lease_ttl,
            interval_s=cfg.heartbeat_interval_s,
            on_error=self.metrics.count_loop_error,
        )
        try:
            await self.registration.register()
        except MCPError as exc:
            log.warning("etcd is not reachable yet (%s); serving, and registering when it is", exc)
        self.registration.start()
        self.breakers.start()  # list-then-watch in the background: serving never waits for etcd
        await self.grpc.set_serving()
        return self.endpoints

    async def stop(self) -> None:
        await self.grpc.stop()
        if self.registration is not None:
            await self.registration.stop()
        await self.breakers.stop()
        await self.tensors.stop()
        await self.manager.close()
        await self.dispatcher.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.buffers.close()
        await self.store.close()
        if self._metrics_server is not None:
            self._metrics_server.stop()

    # -- callbacks -------------------------------------------------------------------------------------
    async def _handle(self, msg: wire.Message) -> tuple[str, dict[str, Any]]:
        h = msg.header
        started = time.perf_counter()
        model, version = "_unknown", h.version or "_latest"  # no unbounded labels from untrusted names
        try:
            replica, outputs = await self.manager.infer(
                h.model,
                h.version,
                h.request_id,
                msg.named(),
                priority=h.priority or None,
                timeout_s=h.timeout_us / 1e6 if h.timeout_us else None,
            )
        except MCPError as err:
            if not isinstance(err, NotFound):
                model = h.model
            self.metrics.observe_request(
                model, version, "zmq", err.code.name, seconds=time.perf_counter() - started,
                error_class=error_class(err),
            )  # fmt: skip
            raise
        self.metrics.observe_request(
            replica.rid.model, replica.rid.version, "zmq", "OK", seconds=time.perf_counter() - started
        )
        return replica.rid.version, outputs

    def _state_changed(self, rid: ReplicaId, state: ReplicaState | None) -> None:
        for s in ReplicaState:
            self.metrics.model_state.labels(rid.model, rid.version, rid.worker, s.value).set(
                1 if s is state else 0
            )
        if state is ReplicaState.ERROR:
            self.metrics.load_failures.labels(rid.model, rid.version).inc()

    def _breaker_level(self, model: str, level: int) -> None:
        """Breaker level 1 and up: the model's max batch size halves on this worker (DESIGN.md 7)."""
        self.manager.set_batch_ratio(model, 0.5 if level >= 1 else 1.0)
        self.metrics.breaker_level.labels(model).set(level)

    def _record(self) -> dict[str, Any]:
        cfg = self.config
        return {
            **self.endpoints,
            "labels": cfg.label_map,
            "memory_capacity_bytes": cfg.memory_capacity_bytes,
            "devices": [],
            "started_at": self._started,
            "curve_public_key": self._curve_public.decode(),
        }

    def _gpu_metrics(self) -> None:
        """Device memory held by cuda replicas, and the GPU's utilization (nvidia-smi), on each heartbeat."""
        cuda = [r for r in self.manager.replicas() if r.config.backend == "cuda"]
        if not cuda:
            return
        device = str(self.config.gpu_index)
        self.metrics.gpu_memory.labels(device).set(sum(r.backend.memory_bytes for r in cuda))
        utilization = numa.nvidia_smi_query(self.config.gpu_index, "utilization.gpu")
        if utilization is not None:
            with contextlib.suppress(ValueError):
                self.metrics.gpu_utilization.labels(device).set(float(utilization) / 100)

    def _report(self) -> dict[str, Any]:
        self._gpu_metrics()
        models = {}
        depth = in_flight = errors = 0
        utils, execs = [], []
        for replica in self.manager.replicas():
            q = replica.queue.stats()
            depth += q.queue_depth
            in_flight += q.in_flight
            errors += q.errors_total
            if q.batches_total:
                utils.append(q.batch_utilization)
                execs.append(q.mean_exec_s)
            models[replica.key] = {
                "state": replica.state.value,
                "queue_depth": q.queue_depth,
                "batch_utilization": q.batch_utilization,
                "memory_bytes": replica.memory_bytes,
                "mean_exec_s": q.mean_exec_s,
                "max_batch_size": replica.max_batch_size,
                "breaker_level": self.breakers.level(replica.rid.model),
            }
        return {
            "worker_id": self.config.worker_id,
            "queue_depth": depth,
            "in_flight": in_flight,
            "batch_utilization": sum(utils) / len(utils) if utils else 0.0,
            "mean_exec_s": sum(execs) / len(execs) if execs else 0.0,
            "memory_used_bytes": self.manager.budget.used,
            "memory_capacity_bytes": self.manager.budget.capacity,
            "last_active": self.dispatcher.last_active,
            "stopped": self.manager.stopped or "",
            # requests the models failed (backend faults): the health service stops a worker that keeps
            # failing; a device fault flag comes with the cuda backend
            "exec_errors_total": errors,
            "buffer_pool_hits": self.buffers.pool_hits,
            "device_error": "",
            "models": models,
        }


def _advertised(endpoint: str, host: str) -> str:
    """``tcp://0.0.0.0:5561`` as others must dial it (``tcp://worker-1:5561``); ipc:// stays as it is."""
    if not host or not endpoint.startswith("tcp://"):
        return endpoint
    return f"tcp://{host}:{endpoint.rsplit(':', 1)[1]}"
