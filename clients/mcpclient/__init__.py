"""mcpclient: the Python SDK (``MeshClient``, ``AsyncMeshClient``) and the mcpctl operator CLI.

Errors are the ``mcpcore.errors`` family, re-exported here: catch ``MCPError`` for all of them.
"""

from mcpclient.client import AsyncMeshClient, ClientStats, MeshClient, ModelInfo, ReplicaInfo, Route
from mcpcore.errors import (
    Aborted,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    MCPError,
    NotFound,
    ResourceExhausted,
    Unavailable,
)

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
    "ReplicaInfo",
    "ResourceExhausted",
    "Route",
    "Unavailable",
]
