"""mcpclient: the Python SDK (``MeshClient``, ``AsyncMeshClient``) and the mcpctl operator CLI.

Errors are the ``mcpcore.errors`` family, re-exported here: catch ``MCPError`` for all of them.
"""

from mcpclient.client import (
    AsyncMeshClient,
    ClientStats,
    MeshClient,
    ModelInfo,
    ReplicaInfo,
    Route,
    TLSConfig,
)
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
