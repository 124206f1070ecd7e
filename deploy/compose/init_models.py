"""Compose's ``init`` service: wait for the workers, load the demo models as ``make up`` does, exit.

Waits until the health service sees ``MCP_INIT_WORKERS`` (default 2) workers alive, then sends each spec
of ``mcp_devcluster.demo.DEMO`` to the scheduler (``LoadModel`` returns once its replicas run; loading a
loaded model again changes nothing, so a rerun is harmless). Addresses: ``MCP_SCHEDULER`` and
``MCP_HEALTH`` (mcpctl's variables). Exit 0 when every model runs; 1, naming what failed, else.
"""

from __future__ import annotations

import os
import sys
import time

import grpc

from mcp_devcluster.demo import DEMO
from mcpapi.v2 import control_pb2, control_pb2_grpc, health_pb2, health_pb2_grpc

RETRY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def wait_for_workers(health: str, want: int, timeout_s: float) -> None:
    stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(health))
    deadline = time.monotonic() + timeout_s
    alive: list[str] = []
    while time.monotonic() < deadline:
        try:
            report = stub.ClusterHealth(health_pb2.ClusterHealthRequest(), timeout=5)
            alive = [w.worker_id for w in report.workers if w.alive]
            if len(alive) >= want:
                print(f"init: workers alive: {', '.join(alive)}", flush=True)
                return
        except grpc.RpcError as err:
            if err.code() not in RETRY:
                raise
        time.sleep(1)  # polling: the health service has no watch for "N workers alive"
    raise SystemExit(f"init: {len(alive)} of {want} workers alive after {timeout_s:.0f} s: {alive}")


def load(scheduler: str, timeout_s: float) -> None:
    stub = control_pb2_grpc.ModelControlStub(grpc.insecure_channel(scheduler))
    for spec in DEMO:
        for attempt in range(5):
            try:
                stub.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=timeout_s)
                break
            except grpc.RpcError as err:
                if err.code() not in RETRY or attempt == 4:
                    raise SystemExit(
                        f"init: loading {spec.model} failed: {err.code().name} {err.details()}"
                    ) from None
                time.sleep(2)
        print(f"init: loaded {spec.model} versions {list(spec.versions)} x{spec.replicas}", flush=True)


def main() -> int:
    scheduler = os.environ.get("MCP_SCHEDULER", "scheduler:50051")
    health = os.environ.get("MCP_HEALTH", "health:50053")
    timeout_s = float(os.environ.get("MCP_INIT_TIMEOUT_S", "180"))
    wait_for_workers(health, int(os.environ.get("MCP_INIT_WORKERS", "2")), timeout_s)
    load(scheduler, timeout_s)
    print("init: the demo models are loaded", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
