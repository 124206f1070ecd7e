"""``mcpcore.errors.Code`` on HTTP: the status the REST front door answers for each error.

Invariant: Triton's HTTP server maps its own errors so (internal 500, not found 404, unavailable 503,
unsupported 501, everything else 400); the codes it never produces get the HTTP status that says the same.
Every ``Code`` has a row (a unit test holds it so).
"""

from __future__ import annotations

from mcpcore.errors import Code

__all__ = ["HTTP_STATUS", "http_status"]

HTTP_STATUS: dict[Code, int] = {
    Code.OK: 200,
    Code.INVALID_ARGUMENT: 400,
    Code.FAILED_PRECONDITION: 400,
    Code.OUT_OF_RANGE: 400,
    Code.ALREADY_EXISTS: 400,
    Code.CANCELLED: 400,
    Code.UNKNOWN: 400,
    Code.UNAUTHENTICATED: 401,
    Code.PERMISSION_DENIED: 403,
    Code.NOT_FOUND: 404,
    Code.ABORTED: 409,
    Code.RESOURCE_EXHAUSTED: 429,
    Code.INTERNAL: 500,
    Code.DATA_LOSS: 500,
    Code.UNIMPLEMENTED: 501,
    Code.UNAVAILABLE: 503,
    Code.DEADLINE_EXCEEDED: 504,
}


def http_status(code: Code) -> int:
    """The HTTP status the REST door answers an error of ``code`` with."""
    return HTTP_STATUS.get(code, 400)
