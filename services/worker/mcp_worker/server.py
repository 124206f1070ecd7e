"""The worker process: wires the repository, backends, batching, ZeroMQ, gRPC control, etcd and metrics.

Start-up order is what makes the published record true: the data (ZeroMQ) and control (gRPC) endpoints are
bound first, so the worker record in etcd only ever names endpoints that answer. etcd being down at start
is not fatal: the heartbeat loop registers as soon as it can, and serving never waits for it.

Each process start has its own incarnation id, in the worker record and in every replica record it
writes, so a record left by an earlier process under the same worker id can be told apart.

A graceful stop (SIGTERM) drains (DESIGN.md 7): the record says ``draining``, so the scheduler places its
replicas elsewhere and routers choose it only where no other copy can serve; it keeps serving until every
RUNNING replica it holds runs on another worker too (a handover, bounded by ``drain_timeout_s``; skipped
when etcd cannot say). Then every new request is answered "not started, draining", admitted work
finishes, whatever is still queued is answered "not started", the lease is revoked and the sockets close.
Routers retry only what provably did not start, so a drained worker fails no request and runs none twice.

GPU figures come from an NVML sampler thread; nothing on the event loop waits on a subprocess.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from mcp_worker import numa
from mcp_worker.backends import cuda_device, numpy_backend
from mcp_worker.batching import Dispatcher
from mcp_worker.batching.buffers import BatchBuffers
from mcp_worker.breakers import BreakerWatch
from mcp_worker.config import WorkerConfig, device_environment
from mcp_worker.drain import Drain
from mcp_worker.executions import Executions
from mcp_worker.memory import MemoryBudget
from mcp_worker.metrics import WorkerMetrics
from mcp_worker.models import ModelManager
from mcp_worker.nvml import GpuSampler, Reading
from mcp_worker.registration import Registration
from mcp_worker.replica import Replica
from mcp_worker.repository import ModelRepository
from mcp_worker.servicer_v2 import WorkerControlServicer
from mcp_worker.tensor_server.admission import Admission
from mcp_worker.tensor_server.server import Done, Partial, TensorServer
from mcpapi.v2 import tensor_pb2, worker_pb2_grpc
from mcpcore import wire
from mcpcore.errors import Internal, MCPError, error_class
from mcpcore.etcd_store import EtcdStore
from mcpcore.fencing import FenceCheck
from mcpcore.keyring import Keyring
from mcpcore.keys import Keyspace, ReplicaId
from mcpcore.lifecycle import ReplicaLifecycle, ReplicaState
from mcpcore.looplag import LoopLagMonitor
from mcpcore.metrics import start_metrics_server
from mcpcore.record_signing import RecordSigner, local_claim, payload
from mcpcore.serving import GrpcService, advertised_host
from mcpcore.tls import load_curve_keypair
from mcpcore.windows import WindowPublisher, Windows

__all__ = ["Worker", "device_room_bytes"]

log = logging.getLogger(__name__)
SERVICE_NAME = "mcpapi.v2.WorkerControl"


class Worker:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.metrics = WorkerMetrics(CollectorRegistry())
        self.keys = Keyspace(config.etcd.prefix)
        self.store = EtcdStore(config.etcd.endpoints, timeout=config.etcd.timeout_s, auth=config.etcd.auth)
        # Requests clients sent here directly: counted for the breakers, as routers count theirs.
        self.direct = Windows(window_s=config.direct_stats_window_s)
        self._direct_publisher = WindowPublisher(
            self.store, self.direct, key_of=lambda model: self.keys.direct_stats(config.worker_id, model),
            source={"worker": config.worker_id}, ttl=config.lease_ttl,
            interval_s=config.direct_stats_interval_s, name="direct_stats",
            on_error=self.metrics.count_loop_error,
        )  # fmt: skip
        self.incarnation = uuid.uuid4().hex[:16]
        self._executor = ThreadPoolExecutor(config.exec_slots, thread_name_prefix="mcp-exec")
        self.buffers = BatchBuffers(blocks_per_class=2 * config.exec_slots)
        self.executions = Executions(
            window=config.dedup_window,
            journal=config.execution_log,
            on_execution=lambda model, n: self.metrics.executions.labels(model).inc(n),
            on_duplicate=lambda model: self.metrics.duplicate_executions.labels(model).inc(),
        )
        self.dispatcher = Dispatcher(
            slots=config.exec_slots,
            executor=self._executor,
            metrics=self.metrics,
            buffers=self.buffers,
            on_execute=lambda key, ids: self.executions.record(key.rpartition("/")[0], ids),
            inline_s=config.inline_batch_ms / 1e3,
        )
        keyring = Keyring.load(config.keyring) if config.keyring else None
        lifecycle = ReplicaLifecycle(self.store, self.keys)
        self.manager = ModelManager(
            worker_id=config.worker_id,
            repository=ModelRepository(
                config.repository,
                keyring,
                cache_dir=config.repository_cache,
                cache_bytes=config.repository_cache_bytes,
            ),
            lifecycle=lifecycle,
            dispatcher=self.dispatcher,
            budget=MemoryBudget(config.memory_capacity_bytes, owner=f"worker {config.worker_id}"),
            checkpoint_dir=Path(config.checkpoint_dir),
            device=config.gpu_index,
            on_state=self._state_changed,
            on_work=lambda model, macs: self.metrics.macs.labels(model).inc(macs),
        )
        # what a state means on this worker (DESIGN.md section 5), done as the transition is made
        lifecycle.on_enter(ReplicaState.READY, self.manager.warm_up)
        lifecycle.on_enter(ReplicaState.RUNNING, self.manager.admit)
        lifecycle.on_exit(ReplicaState.RUNNING, self.manager.withhold)
        lifecycle.on_enter(ReplicaState.IDLE, self.manager.release)
        self._single_messages = self.metrics.zmq_messages.labels("single")  # bound once: per request
        self._coalesced_messages = self.metrics.zmq_messages.labels("coalesced")
        self._curve_public = b""
        # with a TLS identity, the record's endpoint and CURVE key are signed (mcpcore.record_signing)
        self._signer = None
        if config.tls.cert_file:
            self._signer = RecordSigner(config.tls.cert_file, config.tls.key_file)
        curve_secret = None
        if config.zmq_curve_secret_key_file:
            self._curve_public, curve_secret = load_curve_keypair(config.zmq_curve_secret_key_file)
        self.tensors = TensorServer(
            config.zmq_bind,
            self._start,
            limits=wire.Limits(
                max_tensor_bytes=config.max_tensor_bytes, max_message_bytes=config.max_message_bytes
            ),
            curve_secret=curve_secret,
            curve_clients=config.zmq_curve_clients_dir,
            on_error=self.metrics.count_loop_error,
            admission=Admission(
                max_requests=config.max_in_flight_requests,
                max_bytes=config.max_in_flight_bytes,
                owner=f"worker {config.worker_id}",
                on_refused=self.metrics.admission_refused.inc,
            ),
            holds=self.manager.holds,
            on_not_held=lambda: self.metrics.observe_request(
                "_unknown", "_unknown", "zmq", "UNAVAILABLE", seconds=0.0, error_class="unavailable"
            ),
            on_message=self._count_message,
            on_cancelled=self._cancelled,
            on_shared=self._count_shared,
            heartbeat_s=config.zmq_heartbeat_s,
            heartbeat_timeout_s=config.zmq_heartbeat_timeout_s,
        )
        self.grpc = GrpcService(
            [SERVICE_NAME], options=[("grpc.max_receive_message_length", 16 << 20)], tls=config.tls
        )
        self.breakers = BreakerWatch(
            self.store,
            self.keys,
            on_level=self._breaker_level,
            on_rejected=self.metrics.count_config_rejected,
            on_error=self.metrics.count_loop_error,
            instance=config.worker_id,
        )
        self.fence = FenceCheck(
            self.store,
            self.keys,
            timeout_s=min(1.0, config.etcd.timeout_s),
            on_refused=lambda role: self.metrics.fenced_calls.labels(role).inc(),
        )
        self.registration: Registration | None = None
        self.endpoints: dict[str, str] = {}
        self._metrics_server: Any = None
        self._started = time.time()
        self.gpus = GpuSampler()
        self._nvml_index: int | None = None  # NVML's number for this worker's GPU (gpu_index is CUDA's)
        self._lag = LoopLagMonitor(self.metrics.loop_lag.observe)
        self.draining = ""  # the reason, once a graceful stop began
        self._drain = Drain(
            worker_id=config.worker_id,
            store=self.store,
            keys=self.keys,
            manager=self.manager,
            tensors=self.tensors,
            dispatcher=self.dispatcher,
            registration=lambda: self.registration,
            timeout_s=config.drain_timeout_s,
            etcd_timeout_s=config.etcd.timeout_s,
        )

    async def start(self) -> dict[str, str]:
        cfg = self.config
        self._lag.start()
        if not await asyncio.to_thread(self.gpus.start):  # NVML's first calls can take a while
            log.info("GPU metrics off: %s", self.gpus.reason)
        self._nvml_index = self.gpus.index_of(cfg.gpu_index)
        legacy = device_environment().device
        if legacy is not None and legacy.strip() != str(cfg.gpu_index):
            log.warning(
                "%s=%s is not used by a worker: its GPU models run on gpu_index %d (MCP_WORKER_GPU_INDEX)",
                cuda_device.DEVICE_ENV, legacy, cfg.gpu_index,
            )  # fmt: skip
        if cfg.numa_pin:
            bus_id = cfg.gpu_pci_bus_id or (
                self.gpus.pci_bus_id(self._nvml_index) if self._nvml_index is not None else None
            )
            if bus_id:
                numa.pin_to_gpu_numa_node(bus_id)
            else:
                log.info(
                    "numa_pin: no GPU bus id (set gpu_pci_bus_id; NVML: %s); not pinning", self.gpus.reason
                )
        blas = numpy_backend.limit_blas_threads(cfg.blas_threads)
        self.metrics.blas_threads.set(blas)
        log.info(
            "BLAS: %d thread(s) per matrix product (blas_threads %d; 0: its default)", blas, cfg.blas_threads
        )
        self._metrics_server, metrics_port = start_metrics_server(
            cfg.metrics.port, cfg.metrics.host, registry=self.metrics.registry
        )
        zmq_endpoint = await self.tensors.start()
        self.grpc.add(
            worker_pb2_grpc.add_WorkerControlServicer_to_server,
            WorkerControlServicer(self.manager, self.fence),
        )
        port = await self.grpc.start(cfg.grpc.host, cfg.grpc.port)
        host = cfg.advertise.host
        self.endpoints = {
            "worker_id": cfg.worker_id,
            "grpc": f"{advertised_host(cfg.grpc.host, host)}:{port}",
            "zmq": _advertised(zmq_endpoint, host),
            "metrics": f"{advertised_host(cfg.metrics.host, host)}:{metrics_port}",
        }
        if cfg.zmq_local:  # named from what the record publishes (wire.local_endpoint)
            curve = self._curve_public.decode()
            self.tensors.bind_local(
                wire.local_endpoint(cfg.worker_id, self.incarnation, self.endpoints["zmq"], curve)
            )
        self.manager.set_info(
            {"zmq": zmq_endpoint, "grpc": self.endpoints["grpc"], "incarnation": self.incarnation}
        )
        await self.store.connect()
        self.registration = Registration(
            self.store,
            self.keys,
            cfg.worker_id,
            record=self._record,
            report=self._report,
            resync_ops=self.manager.resync_ops,
            resynced=self.manager.resynced,
            ttl=cfg.lease_ttl,
            interval_s=cfg.heartbeat_interval_s,
            on_error=self.metrics.count_loop_error,
        )
        try:
            await self.registration.register()
        except MCPError as exc:
            log.warning("etcd is not reachable yet (%s); serving, and registering when it is", exc)
        self.registration.start()
        self._direct_publisher.start()
        self.breakers.start()  # list-then-watch in the background: serving never waits for etcd
        await self.grpc.set_serving()
        return self.endpoints

    async def stop(self) -> None:
        await self.drain("worker shutting down")
        await self.grpc.stop()
        if self.registration is not None:
            await self.registration.stop()  # revokes the lease: the record goes, routers drop the link
        await self._direct_publisher.stop()
        await self.breakers.stop()
        await self.tensors.stop()
        await self.manager.close()
        await self.dispatcher.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.buffers.close()
        self.executions.close()
        self.gpus.stop()
        await self._lag.stop()
        await self.store.close()
        if self._metrics_server is not None:
            self._metrics_server.stop()

    async def drain(self, reason: str) -> None:
        """The graceful stop's first half (``mcp_worker.drain``): hand over, take nothing new, finish."""
        if not self.draining:
            self.draining = reason
            await self._drain.run(reason)

    # -- callbacks -------------------------------------------------------------------------------------
    def _start(self, msg: wire.Message, partial: Partial, done: Done) -> Callable[[], None]:
        """Start one request from the tensor socket (its ``Starter``), observed in the metrics as it ends."""
        h = msg.header
        started = time.perf_counter()

        def finished(replica: Replica, result: dict[str, Any] | BaseException) -> None:
            if isinstance(result, BaseException):
                if not isinstance(result, MCPError):
                    result = Internal(f"model {replica.key} failed: {type(result).__name__}")
                self._observe_error(h, result, started)
                done(result)
                return
            self._observe_ok(h, replica, started)
            done((replica.rid.version, result))

        try:
            return self.manager.start(
                h.model, h.version, h.request_id, msg.named(), finished, partial=partial, **_request_args(h)
            )
        except MCPError as err:
            self._observe_error(h, err, started)
            raise

    def _count_shared(self, direction: str, nbytes: int) -> None:
        if direction == "refused":
            self.metrics.shared_memory_refused.inc()
        elif nbytes:
            self.metrics.shared_memory_bytes.labels(direction).inc(nbytes)

    def _count_message(self, coalesced: int) -> None:
        """One request message: a single one (0), or one coalescing that many requests."""
        if not coalesced:
            self._single_messages.inc()
        else:
            self._coalesced_messages.inc()
            self.metrics.coalesced_requests.inc(coalesced)

    def _observe_ok(self, h: tensor_pb2.TensorHeader, replica: Replica, started: float) -> None:
        rid = replica.rid
        seconds = time.perf_counter() - started
        self.metrics.observe_request(rid.model, rid.version, "zmq", "OK", seconds=seconds)
        if h.flags & wire.FLAG_DIRECT:  # done past its deadline: its client gave up, so a router counts it
            late = h.timeout_us and seconds * 1e6 > h.timeout_us
            self.direct.record(rid.model, "timeout" if late else None)

    def _cancelled(self, h: tensor_pb2.TensorHeader) -> None:
        """Its sender gave up before the answer (its deadline passed): a direct one is a timeout, as a
        router would count it."""
        model, _ = self.manager.labels(h.model, h.version)
        if h.flags & wire.FLAG_DIRECT and model != "_unknown":
            self.direct.record(model, "timeout")

    def _observe_error(self, h: tensor_pb2.TensorHeader, err: MCPError, started: float) -> None:
        model, version = self.manager.labels(h.model, h.version)  # no labels from untrusted names
        kind = error_class(err)
        self.metrics.observe_request(
            model, version, "zmq", err.code.name, seconds=time.perf_counter() - started, error_class=kind,
        )  # fmt: skip
        # Windows only for models held here. A refusal before the start is no outcome (the client sends
        # it through a router, which counts how it ends), except a deadline passed in the queue.
        if h.flags & wire.FLAG_DIRECT and model != "_unknown" and (not err.not_started or kind == "timeout"):
            self.direct.record(model, kind)

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
        record = {
            **self.endpoints,
            "labels": cfg.label_map,
            "memory_capacity_bytes": cfg.memory_capacity_bytes,
            "devices": [
                {"index": i, "memory_total_bytes": r.memory_total_bytes}
                for i, r in self.gpus.readings().items()
            ],
            "started_at": self._started,
            "curve_public_key": self._curve_public.decode(),
            "incarnation": self.incarnation,
            # it takes coalesced messages (tensor.proto); "local": senders on this host may use its
            # same-host endpoint, named from this record's fields (wire.local_endpoint)
            "zmq_features": [wire.FEATURE_BATCH]
            + [wire.FEATURE_LOCAL] * bool(self.tensors.local_endpoint)
            + [wire.FEATURE_SHM] * self.tensors.shared_memory,
            "capacity": cfg.capacity,
            "draining": self.draining,
        }
        if self._signer is not None:
            curve = self._curve_public.decode()
            zmq_endpoint, grpc_endpoint = self.endpoints["zmq"], self.endpoints["grpc"]
            signed = payload(cfg.worker_id, self.incarnation, zmq_endpoint, curve, grpc_endpoint)
            record.update(self._signer.fields(signed))
            if self.tensors.local_endpoint:  # the offer of the same-host endpoint, signed too
                record["record_local_signature"] = self._signer.sign(local_claim(signed))
        return record

    def _gpu_metrics(self) -> None:
        """The NVML sampler's latest readings per device, and device memory held by cuda replicas."""
        for index, reading in self.gpus.readings().items():
            self.metrics.gpu_utilization.labels(str(index)).set(reading.utilization)
            self.metrics.gpu_memory.labels(str(index)).set(reading.memory_used_bytes)
        cuda = [r for r in self.manager.replicas() if r.backend.device != "cpu"]
        if cuda and not self.gpus.readings():  # no NVML: what this worker's GPU replicas hold, at least
            device = str(self.config.gpu_index)
            self.metrics.gpu_memory.labels(device).set(sum(r.backend.memory_bytes for r in cuda))

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
        report: dict[str, Any] = {
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
        if self.config.place_by_gpu_memory and self._nvml_index is not None:
            own = sum(r.memory_bytes for r in self.manager.replicas() if r.backend.device != "cpu")
            room = device_room_bytes(self.gpus.readings(), self._nvml_index, own)
            if room is not None:  # absent: not measured: the scheduler goes by capacity alone
                report["device_room_bytes"] = room
        return report


def device_room_bytes(readings: Mapping[int, Reading], index: int, own: int) -> int | None:
    """The memory NVML device ``index`` has for this worker's models: its total less what other processes
    hold (used less ``own``, the bytes this worker's GPU replicas hold); None without a reading. It does
    not move when this worker loads or unloads, so a report a heartbeat old is still right about it."""
    reading = readings.get(index)
    if reading is None:
        return None
    others = max(0, reading.memory_used_bytes - own)
    return max(0, reading.memory_total_bytes - others)


def _request_args(h: tensor_pb2.TensorHeader) -> dict[str, Any]:
    """What a tensor header asks of the request besides its inputs (``ModelManager.start``'s keywords)."""
    features_off = None
    if h.flags & wire.FLAG_SECONDARY_FEATURES_OFF:  # breaker level 2, set by the router
        features_off = tuple(f for f in h.parameters.get(wire.PARAM_FEATURES_OFF, "").split(",") if f)
    return {
        "priority": h.priority or None,
        "timeout_s": h.timeout_us / 1e6 if h.timeout_us else None,
        "features_off": features_off,
        "parameters": wire.client_parameters(h),
    }


def _advertised(endpoint: str, host: str) -> str:
    """``tcp://0.0.0.0:5561`` as others must dial it (``tcp://worker-1:5561``); ipc:// stays as it is."""
    if not endpoint.startswith("tcp://"):
        return endpoint
    bound, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    return f"tcp://{advertised_host(bound, host)}:{port}"
