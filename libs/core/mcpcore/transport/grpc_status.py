"""``mcpcore.errors.Code`` on gRPC: the status both ways, and the client table.

Invariants:
- ``Code`` and ``grpc.StatusCode`` name the same 17 statuses by the same names and numbers, so the two
  tables here are total, both ways; an ``MCPError``'s status reaches a gRPC client unchanged.
- ``from_rpc_error`` is the one client table: a failed call becomes the ``MCPError`` its status names,
  marked ``not_started`` when the server's trailing metadata says so (``NOT_STARTED_METADATA``, which the
  guarded server sets).
"""

from __future__ import annotations

import grpc

from mcpcore.errors import Code, MCPError, error_for_code, not_started

__all__ = ["NOT_STARTED_METADATA", "error_for_status", "from_grpc", "from_rpc_error", "to_grpc"]

#: Trailing metadata on a failed call whose request provably did not start: safe to send again.
NOT_STARTED_METADATA = ("mcp-not-started", "true")

_TO_GRPC: dict[Code, grpc.StatusCode] = {code: grpc.StatusCode[code.name] for code in Code}
_FROM_GRPC: dict[grpc.StatusCode, Code] = {status: code for code, status in _TO_GRPC.items()}


def to_grpc(code: Code) -> grpc.StatusCode:
    """The gRPC status for ``code``."""
    return _TO_GRPC[code]


def from_grpc(status: grpc.StatusCode) -> Code:
    """The ``Code`` for a gRPC status (``UNKNOWN`` for what is not one, as a call with no code)."""
    return _FROM_GRPC.get(status, Code.UNKNOWN)


def error_for_status(status: grpc.StatusCode, message: str) -> MCPError:
    """The exception for a gRPC status (``errors.error_for_code`` for a ``Code``)."""
    return error_for_code(from_grpc(status), message)


def from_rpc_error(err: grpc.RpcError) -> MCPError:
    """The client table: a failed call's status back to its exception, marked ``not_started`` when the
    server said so (``NOT_STARTED_METADATA``)."""
    code = from_grpc(err.code()) if hasattr(err, "code") else Code.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    error = error_for_code(code, details or code.name)
    trailing = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    if trailing and any(tuple(item) == NOT_STARTED_METADATA for item in trailing):
        not_started(error)
    return error
