"""The MCPError family: every error a person or a client can act on, each bound to one status ``Code``.

Invariants:
- This module is pure: no transport is imported. A status is a ``Code``, our own enum with gRPC's
  canonical names and numbers, so the same value names the error in a gRPC status, a ZeroMQ reply
  header (its number), an etcd document (its name) and a metric label (its name). The mappings to a
  transport live beside it: ``mcpcore.transport.grpc_status`` (``grpc.StatusCode`` both ways, the client
  table for a failed call), ``mcpcore.transport.http_status`` (the REST door's table) and
  ``mcpcore.transport.guarded`` (``GuardedServer``, the one place where exceptions become statuses).
- Each wire error is defined once, here; ``CODE_TO_ERROR`` is the one table from codes back to
  exceptions.
- An exception that is not an ``MCPError`` never leaks its text to a client: ``log_unexpected`` logs it
  with its traceback and answers ``Internal`` with a generic message.
- An error that has been answered keeps no frames (``forget_frames``): nothing of a failed request stays
  reachable through it.
"""

from __future__ import annotations

import enum
import logging
from typing import ClassVar, TypeVar

__all__ = [
    "CODE_TO_ERROR",
    "GENERIC_INTERNAL",
    "MAX_MESSAGE_CHARS",
    "SERVER_SIDE_CLASSES",
    "Aborted",
    "AlreadyExists",
    "Code",
    "DataLoss",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "MCPError",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "Unavailable",
    "error_class",
    "error_for_code",
    "forget_frames",
    "log_unexpected",
    "not_started",
]

log = logging.getLogger(__name__)

#: The longest message an error carries. A message quoting a client's hostile name (10 kB of it) keeps
#: its start and end, so it stays a line a person can read, and a reply stays small.
MAX_MESSAGE_CHARS = 2000


class Code(enum.IntEnum):
    """A status: gRPC's canonical codes (``google.rpc.Code``), by the same names and numbers.

    An ``IntEnum`` because the number is what a ZeroMQ reply header carries (``int(code)``) and the name
    is what documents, logs and metric labels carry (``code.name``); it is never equal to a
    ``grpc.StatusCode`` (map it with ``mcpcore.transport.grpc_status``)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class MCPError(Exception):
    """Base of every error mcpmesh reports on purpose. ``message`` is shown to the caller as is."""

    code: ClassVar[Code] = Code.UNKNOWN
    #: Whether an idempotent call may be retried (STYLE.md: only UNAVAILABLE and DEADLINE_EXCEEDED).
    retryable: ClassVar[bool] = False
    #: Set (``not_started(err)``) on an error raised before the request began to execute: refused at
    #: admission, or answered while still queued. Such a request may go to another worker whatever the
    #: model (DESIGN.md section 7, delivery); anything else may have run.
    not_started: bool = False

    def __init__(self, message: str) -> None:
        if len(message) > MAX_MESSAGE_CHARS:
            keep = MAX_MESSAGE_CHARS // 2
            message = f"{message[:keep]} ... ({len(message) - 2 * keep} characters cut) ... {message[-keep:]}"
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


class InvalidArgument(MCPError):
    """The request itself is wrong (a bad name, shape, dtype or value): fix it and send again."""

    code = Code.INVALID_ARGUMENT


class NotFound(MCPError):
    """The model, version, region or key named does not exist (or is not loaded)."""

    code = Code.NOT_FOUND


class AlreadyExists(MCPError):
    """The thing to create exists already (a region name, a model being registered twice)."""

    code = Code.ALREADY_EXISTS


class FailedPrecondition(MCPError):
    """The request is valid but the system is not in a state to do it (an illegal state transition, a leader
    that no longer leads)."""

    code = Code.FAILED_PRECONDITION


class PermissionDenied(MCPError):
    """The caller's identity may not do this (mTLS allow-lists, etcd auth)."""

    code = Code.PERMISSION_DENIED


class ResourceExhausted(MCPError):
    """A limit was reached (queue size, bytes in flight, memory, message size): back off, or send less."""

    code = Code.RESOURCE_EXHAUSTED


class DeadlineExceeded(MCPError):
    """The deadline passed before the answer; an idempotent call may be retried."""

    code = Code.DEADLINE_EXCEEDED
    retryable = True


class Unavailable(MCPError):
    """No copy could take the request now (starting, draining, breaker, link down); an idempotent call may be
    retried."""

    code = Code.UNAVAILABLE
    retryable = True


class Aborted(MCPError):
    """The work cannot go on where it was (a sequence's worker is gone with its state): start it again
    (gRPC's "retry at a higher level")."""

    code = Code.ABORTED


class DataLoss(MCPError):
    """Stored or received bytes are corrupt (a tampered model file, an unreadable record)."""

    code = Code.DATA_LOSS


class Internal(MCPError):
    """A fault of ours; the message says where, the server log has the details."""

    code = Code.INTERNAL


CODE_TO_ERROR: dict[Code, type[MCPError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        FailedPrecondition,
        PermissionDenied,
        ResourceExhausted,
        DeadlineExceeded,
        Unavailable,
        Aborted,
        DataLoss,
        Internal,
    )
}

_BY_NUMBER: dict[int, Code] = {int(c): c for c in Code}

GENERIC_INTERNAL = "internal error; the server log has the details"


#: Error classes the breaker counts by (DESIGN.md section 8): only server-side classes raise a breaker
#: level; ``client`` errors (bad input, unknown model) never do.
SERVER_SIDE_CLASSES = frozenset({"timeout", "resource", "backend", "unavailable"})
_CLASS_OF_CODE = {
    Code.DEADLINE_EXCEEDED: "timeout",
    Code.RESOURCE_EXHAUSTED: "resource",
    Code.UNAVAILABLE: "unavailable",
    Code.ABORTED: "unavailable",
    Code.INVALID_ARGUMENT: "client",
    Code.NOT_FOUND: "client",
    Code.ALREADY_EXISTS: "client",
    Code.FAILED_PRECONDITION: "client",
    Code.PERMISSION_DENIED: "client",
    Code.CANCELLED: "client",
}


def error_class(err: BaseException) -> str:
    """The class an error is counted under: timeout, resource, unavailable, client or backend."""
    code = err.code if isinstance(err, MCPError) else Code.INTERNAL
    return _CLASS_OF_CODE.get(code, "backend")


E = TypeVar("E", bound=MCPError)


def not_started(err: E) -> E:
    """Mark ``err`` as raised before its request began to execute (see ``MCPError.not_started``)."""
    err.not_started = True
    return err


def error_for_code(code: Code | int | str, message: str) -> MCPError:
    """The exception for a status: a ``Code``, its number (ZeroMQ headers) or its name (JSON documents in
    etcd). A number or name we do not know is ``UNKNOWN``."""
    if isinstance(code, str):
        code = Code.__members__.get(code, Code.UNKNOWN)
    elif isinstance(code, int):
        code = _BY_NUMBER.get(code, Code.UNKNOWN)
    else:  # a transport's own status (a grpc.StatusCode) would silently be UNKNOWN here: map it first
        raise TypeError(f"a status is a Code, its number or its name, not {code!r}")
    cls = CODE_TO_ERROR.get(code)
    if cls is None:
        err = MCPError(message)
        err.code = code  # type: ignore[misc]  # an instance attribute for codes we have no class for
        return err
    return cls(message)


def log_unexpected(exc: BaseException, where: str) -> MCPError:
    """An exception that is not an MCPError: logged with its traceback, answered with a generic
    ``Internal`` (its text never reaches a client)."""
    log.error("unexpected error in %s", where, exc_info=exc)
    return Internal(GENERIC_INTERNAL)


def forget_frames(exc: BaseException | None) -> None:
    """Drop the tracebacks of an error that has been answered, and of the errors it chains (``__cause__``,
    ``__context__``). A traceback holds the frames it passed through, and so a request's tensors; a
    frame that also holds the error (``failure = err``) makes a cycle that only the cyclic collector
    frees, which the services run rarely: without this, failed requests' bytes outlive their answers."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        todo += [e.__cause__, e.__context__]
