"""The router process: snapshot watch, ZeroMQ forwarder, v1 + v2 + KServe V2 on one gRPC port, stats, metrics.

The gRPC port answers as soon as it is bound; ``ServerReady`` (and ``grpc.health.v1``) turn SERVING once
the first snapshot is synced from etcd. After that, etcd may come and go: requests route on the last table.

A graceful stop (SIGTERM) drains: ``grpc.health.v1`` says NOT_SERVING for ``shutdown_delay_s`` (clients
with several routers and balancers move away), then the server refuses new calls and gives in-flight ones
up to ``drain_timeout_s``; only then do the links to the workers close. No admitted request is cut off.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import grpc
import grpc.aio
from prometheus_client import CollectorRegistry

from mcp_router.config import RouterConfig
from mcp_router.debug import snapshot_doc
from mcp_router.frontends.kserve_grpc import KServeServicer
from mcp_router.frontends.kserve_rest import RestFrontEnd
from mcp_router.frontends.mesh_grpc import InferenceV1, InferenceV2
from mcp_router.frontends.shm_regions import SharedMemory
from mcp_router.router import Router
from mcp_router.routing.table import RoutingTable
from mcp_router.snapshot import Snapshots
from mcp_router.stats import RequestStats, RouterMetrics, stats_publisher
from mcp_router.trace import Tracer
from mcpapi.kserve import grpc_service_pb2_grpc as kserve_grpc
from mcpapi.v1 import inference_pb2_grpc as v1_grpc
from mcpapi.v2 import control_pb2, control_pb2_grpc, model_pb2
from mcpapi.v2 import inference_pb2_grpc as v2_grpc
from mcpcore import wire
from mcpcore.etcd_store import EtcdStore
from mcpcore.keys import Keyspace
from mcpcore.looplag import LoopLagMonitor
from mcpcore.metrics import start_metrics_server
from mcpcore.record_signing import RecordVerifier
from mcpcore.retry import RetryBudget
from mcpcore.serving import GrpcService, advertised_host
from mcpcore.tls import aio_channel, load_curve_keypair
from mcpcore.transport.forwarder import Forwarder
from mcpcore.transport.grpc_status import from_rpc_error

__all__ = ["RouterServer"]

log = logging.getLogger(__name__)
VERSION = "0.1.0"
MESSAGE_LIMIT = 64 << 20
SERVICES = ("mcpapi.v1.Inference", "mcpapi.v2.Inference", "inference.GRPCInferenceService")


def _native_server() -> Any:
    """The grpc++ server's class; imported only when asked for, so that ``grpc_server: aio`` never
    loads grpc++ (a host where it does not load can still run a router)."""
    from mcp_native.grpc_server import NativeServer  # noqa: PLC0415

    return NativeServer


class RouterServer:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.metrics = RouterMetrics(CollectorRegistry())
        self.keys = Keyspace(config.etcd.prefix)
        self.store = EtcdStore(config.etcd.endpoints, timeout=config.etcd.timeout_s, auth=config.etcd.auth)
        self.forwarder = Forwarder(
            max_in_flight=config.max_in_flight_per_worker,
            max_bytes=config.max_bytes_in_flight,
            limits=wire.Limits(
                max_tensor_bytes=config.max_tensor_bytes, max_message_bytes=config.max_message_bytes
            ),
            heartbeat_s=config.link_heartbeat_s,
            heartbeat_timeout_s=config.link_timeout_s,
            on_error=self.metrics.count_loop_error,
            on_link_down=self._link_down,
            on_late=self.metrics.late_replies.inc,
            shared_memory=config.shared_memory,
            flush_at=config.coalesce_flush_at,
            curve_keypair=(
                load_curve_keypair(config.zmq_curve_secret_key_file)
                if config.zmq_curve_secret_key_file
                else None
            ),
        )
        self.snapshots = Snapshots(
            self.store,
            self.keys,
            link_ok=self.forwarder.link_ok,
            grace_s=config.worker_grace_s,
            on_rejected=self.metrics.count_config_rejected,
            on_error=self.metrics.count_loop_error,
            on_applied=self.metrics.watch_apply.labels("router").observe,
            on_swap=self._swapped,
            verifier=RecordVerifier(config.tls.ca_file) if config.tls.ca_file else None,
            instance=config.router_id,
        )
        self.stats = RequestStats(self.metrics, window_s=config.stats_window_s)
        self.endpoints: dict[str, str] = {}
        self.publisher = stats_publisher(
            self.store,
            self.keys,
            config.router_id,
            self.stats,
            lambda: self.endpoints,
            ttl=config.stats_lease_ttl_s,
            interval_s=config.stats_interval_s,
            on_error=self.metrics.count_loop_error,
        )
        self._scheduler = None
        if config.scheduler:
            self._scheduler = control_pb2_grpc.ModelControlStub(aio_channel(config.scheduler, config.tls))
        self.router = Router(
            self.snapshots,
            self.forwarder,
            self.stats,
            load_factor=config.load_factor,
            default_timeout_s=config.default_timeout_s,
            retry_budget=RetryBudget(config.retry_budget_ratio),
            scheduler_load=self._load if self._scheduler else None,
            scheduler_unload=self._unload if self._scheduler else None,
            tls=config.tls,
        )
        self.grpc = GrpcService(
            SERVICES,
            server_factory=_native_server() if config.grpc_server == "native" else None,
            maximum_concurrent_rpcs=config.max_concurrent_rpcs,
            tls=config.tls,
            options=[
                ("grpc.max_receive_message_length", MESSAGE_LIMIT),
                ("grpc.max_send_message_length", MESSAGE_LIMIT),
                # only router processes of one --processes share a port; another router there is an error
                ("grpc.so_reuseport", 1 if config.reuse_port else 0),
            ],
        )
        self.shm = SharedMemory()  # system shared memory regions: one registry for both front doors
        self.tracer = Tracer()  # TraceSetting: one for both front doors and the request path
        if config.trace_file:
            self.tracer.update({"trace_file": [config.trace_file]})  # a bad path stops the start here
        self.rest = RestFrontEnd(
            self.router,
            version=VERSION,
            server_name=config.server_name,
            max_body_bytes=config.rest_max_body_bytes,
            idle_timeout_s=config.rest_idle_timeout_s,
            shm=self.shm,
            tracer=self.tracer,
            drain_timeout_s=config.drain_timeout_s,
            tls=config.tls,
            max_tensor_bytes=config.max_message_bytes,
        )
        self._metrics_server: Any = None
        self._lag = LoopLagMonitor(self.metrics.loop_lag.observe)

    async def start(self) -> dict[str, str]:
        cfg = self.config
        self._lag.start()
        self._metrics_server, metrics_port = start_metrics_server(
            cfg.metrics.port,
            cfg.metrics.host,
            registry=self.metrics.registry,
            # runs on the HTTP server's thread: reads the table swapped whole, and the forwarder's counters
            routes={
                "/debug/snapshot": lambda: snapshot_doc(self.snapshots.table, self.forwarder, cfg.router_id),
            },
        )
        self.grpc.add(v1_grpc.add_InferenceServicer_to_server, InferenceV1(self.router))
        self.grpc.add(v2_grpc.add_InferenceServicer_to_server, InferenceV2(self.router))
        self.grpc.add(
            kserve_grpc.add_GRPCInferenceServiceServicer_to_server,
            KServeServicer(
                self.router,
                version=VERSION,
                server_name=self.config.server_name,
                shm=self.shm,
                tracer=self.tracer,
                max_tensor_bytes=self.config.max_message_bytes,
            ),
        )
        port = await self.grpc.start(cfg.grpc.host, cfg.grpc.port)
        rest_port = None
        if cfg.rest_port >= 0:
            rest_port = await self.rest.start(cfg.rest_host, cfg.rest_port, reuse_port=cfg.reuse_port)
        await self.store.connect()
        await self.snapshots.start()
        self.publisher.start()
        await self.grpc.set_serving()
        self.endpoints = {
            "router_id": cfg.router_id,
            "pid": str(os.getpid()),
            "grpc": f"{advertised_host(cfg.grpc.host, cfg.advertise.host)}:{port}",
            "metrics": f"{advertised_host(cfg.metrics.host, cfg.advertise.host)}:{metrics_port}",
        }
        if rest_port is not None:
            self.endpoints["rest"] = f"{advertised_host(cfg.rest_host, cfg.advertise.host)}:{rest_port}"
        return self.endpoints

    async def stop(self) -> None:
        await self.grpc.set_not_serving()
        await asyncio.sleep(self.config.shutdown_delay_s)  # a notice period, not a synchronisation
        # Then new calls are refused "not started", so that clients that did not watch the notice move to
        # another router, rather than racing the server's stop (gRPC cancels calls that arrive as it
        # stops: the client cannot tell whether they ran)
        self.router.stopping = True
        await asyncio.sleep(min(0.5, self.config.shutdown_delay_s))  # the refusals' period, likewise
        await asyncio.gather(  # in-flight calls finish first, on both front doors
            self.grpc.stop(grace_s=self.config.drain_timeout_s),
            self.rest.stop(),
        )
        await self.publisher.stop()
        await self.snapshots.stop()
        await self.forwarder.close()
        self.shm.close()
        self.tracer.flush()
        await self.store.close()
        await self._lag.stop()
        if self._metrics_server is not None:
            self._metrics_server.stop()

    def _link_down(self, worker: str) -> None:
        self.snapshots.link_down(worker)

    def _swapped(self, old: RoutingTable, new: RoutingTable) -> None:
        if old.workers != new.workers:
            self.forwarder.sync(new.workers)
        for name, route in new.models.items():
            self.metrics.breaker_level.labels(name).set(route.breaker.level)

    async def _load(self, model: str, version: str) -> None:
        spec = model_pb2.ModelSpec(model=model, versions=[version or "1"], replicas=1)
        try:
            await self._scheduler.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=120)  # type: ignore[union-attr]
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err) from None

    async def _unload(self, model: str) -> None:
        try:
            await self._scheduler.UnloadModel(control_pb2.UnloadModelRequest(model=model), timeout=120)  # type: ignore[union-attr]
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err) from None
