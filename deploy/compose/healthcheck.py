"""Compose's healthcheck for an mcpmesh service: ``healthcheck.py worker|scheduler|router|health``.

Asks the service's ``grpc.health.v1`` on its gRPC port (``MCP_<SERVICE>_GRPC_PORT``, else the default of
its config.py) at ``MCP_BIND_HOST`` (127.0.0.1 when that is a wildcard); exit 0 only for SERVING. A service
reports SERVING once it is ready and NOT_SERVING from the moment it begins to stop.
"""

from __future__ import annotations

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

DEFAULT_PORTS = {"scheduler": 50051, "router": 8001, "health": 50053}


def main(argv: list[str]) -> int:
    service = argv[1] if len(argv) > 1 else ""
    if service not in (*DEFAULT_PORTS, "worker"):
        print(f"usage: healthcheck.py worker|scheduler|router|health (got {service!r})", file=sys.stderr)
        return 2
    port = os.environ.get(f"MCP_{service.upper()}_GRPC_PORT") or str(DEFAULT_PORTS.get(service, ""))
    if not port or port == "0":
        print(f"{service}: set MCP_{service.upper()}_GRPC_PORT (a fixed port) to check it", file=sys.stderr)
        return 1
    host = os.environ.get("MCP_BIND_HOST", "")
    host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host  # noqa: S104 - a wildcard bind is asked on loopback
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
        except grpc.RpcError as err:
            print(f"{service} at {host}:{port}: {err.code().name}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{service} at {host}:{port}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
