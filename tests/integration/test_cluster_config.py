"""Settings a cluster needs, through real service processes: Kubernetes' injected variables under a
service's prefix are ignored with one warning, ``MCP_ETCD_ENDPOINTS`` is read by every service, and a
service bound to a wildcard publishes the host others dial (``advertise_host``), not ``0.0.0.0``."""

from __future__ import annotations

import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from harness import HealthProcess, RouterProcess, SchedulerProcess, WorkerProcess, etcd_get, wait_for

from mcpcore.keys import Keyspace

WILDCARD = "0.0.0.0"
#: what Kubernetes injects into every pod for a Service named mcp-router (and the like for the others)
KUBERNETES = {
    "MCP_ROUTER_PORT": "tcp://10.96.0.7:8001", "MCP_ROUTER_PORT_8001_TCP": "tcp://10.96.0.7:8001",
    "MCP_ROUTER_SERVICE_HOST": "10.96.0.7", "MCP_ROUTER_SERVICE_PORT_GRPC": "8001",
    "MCP_SCHEDULER_SERVICE_HOST": "10.96.0.8", "MCP_HEALTH_SERVICE_HOST": "10.96.0.9",
    "MCP_WORKER_SERVICE_HOST": "10.96.0.10",
}  # fmt: skip


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("kind", [RouterProcess, SchedulerProcess, HealthProcess, WorkerProcess])
def test_a_service_starts_in_a_pod_environment_and_publishes_its_advertised_host(
    kind, tmp_path, etcd_endpoint
):  # type: ignore[no-untyped-def]
    prefix = f"/t{uuid.uuid4().hex[:8]}"
    flags = {"grpc_host": WILDCARD, "metrics_host": WILDCARD, "advertise_host": "127.0.0.1"}
    if kind is RouterProcess:
        flags["rest_host"] = WILDCARD
    (tmp_path / "models").mkdir()
    args = (
        (tmp_path, etcd_endpoint, tmp_path / "models") if kind is WorkerProcess else (tmp_path, etcd_endpoint)
    )
    service = kind(*args, prefix=prefix, **flags)
    svc = service.module.removeprefix("mcp_").upper()
    del service.env[f"MCP_{svc}_ETCD_ENDPOINTS"]  # only the shared variable names etcd
    service.env.update({**KUBERNETES, "MCP_ETCD_ENDPOINTS": etcd_endpoint})
    service.start()
    try:
        host, _, port = service.endpoints["grpc"].rpartition(":")
        assert host == "127.0.0.1" and service.endpoints["metrics"].startswith("127.0.0.1:"), (
            service.endpoints
        )
        assert _serving(f"127.0.0.1:{port}")
        log = service.log.read_text()
        assert log.count("ignoring environment variables that name no setting") == 1, log[-2000:]
        assert f"MCP_{svc}_SERVICE_HOST" in log
        if kind is RouterProcess:  # what the SDK and mcpctl read: the advertised addresses
            record = wait_for(lambda: etcd_get(etcd_endpoint, Keyspace(prefix).router(service.router_id)), 10)
            assert record["grpc"] == service.endpoints["grpc"] and record["rest"].startswith("127.0.0.1:")
        if kind is WorkerProcess:
            record = wait_for(lambda: etcd_get(etcd_endpoint, Keyspace(prefix).worker(service.worker_id)), 10)
            assert record["grpc"] == service.endpoints["grpc"], record
    finally:
        service.stop()
