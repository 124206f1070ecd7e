"""mcpclient: the Python SDK (``MeshClient``, ``AsyncMeshClient``) and the mcpctl operator CLI.

    with MeshClient("127.0.0.1:8001") as mesh:
        out = mesh.infer("demo-mlp", {"INPUT0": x})              # through the router
        out = mesh.infer("demo-mlp", {"INPUT0": x}, direct=True)  # tensors straight to the worker

The SDK's modules, by job: ``sync_client`` (``MeshClient``, blocking, over) ``async_client``
(``AsyncMeshClient``), which hands each call to ``routers`` (the router list and its failover rule),
``direct`` (straight to workers over ZeroMQ, on ``routes``, the route cache) or ``control`` (the
scheduler's load, unload, status); ``convert`` checks arguments and converts messages into ``values``.
The rest of the package is ``mcpctl`` (``mcpctl``, ``ctlkit`` and the ``*_cmds`` modules).

Errors are the ``mcpcore.errors`` family, re-exported here: catch ``MCPError`` for all of them.
"""

from mcpclient.async_client import AsyncMeshClient
from mcpclient.sync_client import MeshClient
from mcpclient.values import ClientStats, ModelInfo, ReplicaInfo, Route
from mcpcore.errors import (
    Aborted,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    MCPError,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from mcpcore.tls import TLSConfig

__all__ = [
    "Aborted",
    "AsyncMeshClient",
    "ClientStats",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "MCPError",
    "MeshClient",
    "ModelInfo",
    "NotFound",
    "PermissionDenied",
    "ReplicaInfo",
    "ResourceExhausted",
    "Route",
    "TLSConfig",
    "Unavailable",
]
