"""The MCPError family: every error a person or a client can act on, each bound to one gRPC status.

Invariants:
- Each wire error is defined once, here; ``CODE_TO_ERROR`` is the one table from status codes back to
  exceptions (clients, ZeroMQ replies), and ``GuardedServer`` (every service registers through it) is the
  one place where exceptions become statuses.
- An exception that is not an ``MCPError`` never leaks its text to a client: it is logged with its traceback
  and answered ``INTERNAL`` with a generic message.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import grpc
import grpc.aio

__all__ = [
    "CODE_TO_ERROR",
    "HTTP_STATUS",
    "MAX_MESSAGE_CHARS",
    "NOT_STARTED_METADATA",
    "SERVER_SIDE_CLASSES",
    "Aborted",
    "AlreadyExists",
    "Check",
    "DataLoss",
    "DeadlineExceeded",
    "FailedPrecondition",
    "GuardedServer",
    "Internal",
    "InvalidArgument",
    "MCPError",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "Unavailable",
    "error_class",
    "error_for_code",
    "from_rpc_error",
    "http_status",
    "log_unexpected",
    "not_started",
]

log = logging.getLogger(__name__)

#: The longest message an error carries. A message quoting a client's hostile name (10 kB of it) keeps
#: its start and end, so it stays a line a person can read, and a reply stays small.
MAX_MESSAGE_CHARS = 2000


class MCPError(Exception):
    """Base of every error mcpmesh reports on purpose. ``message`` is shown to the caller as is."""

    code: ClassVar[grpc.StatusCode] = grpc.StatusCode.UNKNOWN
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
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(MCPError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(MCPError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(MCPError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class PermissionDenied(MCPError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(MCPError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceeded(MCPError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED
    retryable = True


class Unavailable(MCPError):
    code = grpc.StatusCode.UNAVAILABLE
    retryable = True


class Aborted(MCPError):
    """The work cannot go on where it was (a sequence's worker is gone with its state): start it again
    (gRPC's "retry at a higher level")."""

    code = grpc.StatusCode.ABORTED


class DataLoss(MCPError):
    code = grpc.StatusCode.DATA_LOSS


class Internal(MCPError):
    code = grpc.StatusCode.INTERNAL


CODE_TO_ERROR: dict[grpc.StatusCode, type[MCPError]] = {
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
_BY_VALUE: dict[int, grpc.StatusCode] = {c.value[0]: c for c in grpc.StatusCode}

GENERIC_INTERNAL = "internal error; the server log has the details"


#: Error classes the breaker counts by (DESIGN.md section 8): only server-side classes raise a breaker
#: level; ``client`` errors (bad input, unknown model) never do.
SERVER_SIDE_CLASSES = frozenset({"timeout", "resource", "backend", "unavailable"})
_CLASS_OF_CODE = {
    grpc.StatusCode.DEADLINE_EXCEEDED: "timeout",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "resource",
    grpc.StatusCode.UNAVAILABLE: "unavailable",
    grpc.StatusCode.ABORTED: "unavailable",
    grpc.StatusCode.INVALID_ARGUMENT: "client",
    grpc.StatusCode.NOT_FOUND: "client",
    grpc.StatusCode.ALREADY_EXISTS: "client",
    grpc.StatusCode.FAILED_PRECONDITION: "client",
    grpc.StatusCode.PERMISSION_DENIED: "client",
    grpc.StatusCode.CANCELLED: "client",
}


def error_class(err: BaseException) -> str:
    """The class an error is counted under: timeout, resource, unavailable, client or backend."""
    code = err.code if isinstance(err, MCPError) else grpc.StatusCode.INTERNAL
    return _CLASS_OF_CODE.get(code, "backend")


E = TypeVar("E", bound=MCPError)


def not_started(err: E) -> E:
    """Mark ``err`` as raised before its request began to execute (see ``MCPError.not_started``)."""
    err.not_started = True
    return err


def error_for_code(code: grpc.StatusCode | int | str, message: str) -> MCPError:
    """The exception for a status code: a ``grpc.StatusCode``, its integer (ZeroMQ headers) or its name
    (JSON documents in etcd)."""
    if isinstance(code, str):
        code = grpc.StatusCode.__members__.get(code, grpc.StatusCode.UNKNOWN)
    elif isinstance(code, int):
        code = _BY_VALUE.get(code, grpc.StatusCode.UNKNOWN)
    cls = CODE_TO_ERROR.get(code)
    if cls is None:
        err = MCPError(message)
        err.code = code  # type: ignore[misc]  # an instance attribute for codes we have no class for
        return err
    return cls(message)


def from_rpc_error(err: grpc.RpcError) -> MCPError:
    """The client table: a failed call's status back to its exception, marked ``not_started`` when the
    server said so (``NOT_STARTED_METADATA``)."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    error = error_for_code(code, details or code.name)
    trailing = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    if trailing and any(tuple(item) == NOT_STARTED_METADATA for item in trailing):
        not_started(error)
    return error


# --- server side -------------------------------------------------------------------------------------

#: Trailing metadata on a failed call whose request provably did not start: safe to send again.
NOT_STARTED_METADATA = ("mcp-not-started", "true")


def log_unexpected(exc: BaseException, where: str) -> MCPError:
    """An exception that is not an MCPError: logged with its traceback, answered with a generic
    ``Internal`` (its text never reaches a client)."""
    log.error("unexpected error in %s", where, exc_info=exc)
    return Internal(GENERIC_INTERNAL)


def _status_for(exc: BaseException, method: str) -> tuple[grpc.StatusCode, str]:
    err = exc if isinstance(exc, MCPError) else log_unexpected(exc, method)
    return err.code, err.message


#: gRPC status -> HTTP status for the REST front door. Triton's HTTP server maps its own errors so
#: (internal 500, not found 404, unavailable 503, unsupported 501, everything else 400); the codes it never
#: produces get the HTTP status that says the same.
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.ALREADY_EXISTS: 400,
    grpc.StatusCode.CANCELLED: 400,
    grpc.StatusCode.UNKNOWN: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


def http_status(code: grpc.StatusCode) -> int:
    return HTTP_STATUS.get(code, 400)


def _guard_unary(behavior: Any, method: str, check: Check | None) -> Any:
    awaited = inspect.iscoroutinefunction(behavior)

    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            if type(request) is _Undecodable:
                raise request.error
            if check is not None:
                check(context)
            if awaited:
                return await behavior(request, context)
            result = behavior(request, context)
            return await result if inspect.isawaitable(result) else result
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            # the status set and nothing returned, which costs a refusal under overload less than
            # abort()'s exception (measured: ~20% more refusals per second)
            if getattr(exc, "not_started", False):
                context.set_trailing_metadata((NOT_STARTED_METADATA,))
            code, message = _status_for(exc, method)
            context.set_code(code)
            context.set_details(message)
            return None

    return call


def _guard_stream(behavior: Any, method: str, check: Check | None) -> Any:
    async def agen(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            if type(request) is _Undecodable:
                raise request.error
            if check is not None:
                check(context)
            if inspect.isasyncgenfunction(behavior):
                async for item in behavior(request, context):
                    yield item
            else:
                for item in behavior(request, context):
                    yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            if getattr(exc, "not_started", False):
                context.set_trailing_metadata((NOT_STARTED_METADATA,))
            await context.abort(*_status_for(exc, method))

    return agen


#: Run before a method's behaviour with its context (an authorization); raises an MCPError to refuse.
Check = Callable[[Any], None]

#: A method's own (request deserializer, response serializer), in place of the generated ones; None:
#: the bytes as they are (the method takes raw bytes, or returns its reply serialized).
Codec = tuple[Callable[[bytes], Any] | None, Callable[[Any], bytes] | None]


def _guard(
    handler: grpc.RpcMethodHandler, method: str, codec: Codec | None = None, check: Check | None = None
) -> grpc.RpcMethodHandler:
    """``handler`` with the MCPError mapping around its behaviour (decided once, not per call), and
    ``check`` (an authorization) run first: what it raises is answered like the behaviour's errors."""
    deserialize, serialize = codec or (handler.request_deserializer, handler.response_serializer)
    deserialize = _tolerant(deserialize, method)
    if handler.stream_unary is not None:
        handler = handler._replace(stream_unary=_checking(handler.stream_unary))
    if handler.stream_stream is not None:
        handler = handler._replace(stream_stream=_checking(handler.stream_stream))
    options = {"request_deserializer": deserialize, "response_serializer": serialize}
    if handler.unary_unary is not None:
        behavior = _guard_unary(handler.unary_unary, method, check)
        return grpc.unary_unary_rpc_method_handler(behavior, **options)
    if handler.stream_unary is not None:
        behavior = _guard_unary(handler.stream_unary, method, check)
        return grpc.stream_unary_rpc_method_handler(behavior, **options)
    if handler.unary_stream is not None:
        behavior = _guard_stream(handler.unary_stream, method, check)
        return grpc.unary_stream_rpc_method_handler(behavior, **options)
    behavior = _guard_stream(handler.stream_stream, method, check)
    return grpc.stream_stream_rpc_method_handler(behavior, **options)


class _Undecodable:
    """A request whose bytes did not parse, handed to the guarded behaviour so that it is answered
    INVALID_ARGUMENT: grpc answers a deserializer's exception UNKNOWN, with the exception's class."""

    __slots__ = ("error",)

    def __init__(self, error: InvalidArgument) -> None:
        self.error = error


def _tolerant(deserialize: Callable[[bytes], Any] | None, method: str) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # protobuf's DecodeError, or a method codec's own
            return _Undecodable(InvalidArgument(f"{method}: the request does not parse ({exc})"))

    return parse


async def _checked(requests: Any) -> Any:
    async for request in requests:
        if type(request) is _Undecodable:
            raise request.error
        yield request


def _checking(behavior: Any) -> Any:
    """A stream-request behaviour whose requests stop with the INVALID_ARGUMENT of the first that did
    not parse (else the guard sees protobuf's DecodeError: INTERNAL)."""
    if inspect.isasyncgenfunction(behavior):

        async def stream(requests: Any, context: Any) -> Any:
            async for item in behavior(_checked(requests), context):
                yield item

        return stream

    async def call(requests: Any, context: Any) -> Any:
        result = behavior(_checked(requests), context)
        return await result if inspect.isawaitable(result) else result

    return call


def _codec(handler: grpc.RpcMethodHandler, name: str) -> Codec | None:
    """The servicer's own codec for method ``name``, from its ``grpc_codecs`` mapping if it has one."""
    behaviour = handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
    codecs = getattr(getattr(behaviour, "__self__", None), "grpc_codecs", None) or {}
    return codecs.get(name)


class GuardedServer:
    """What a generated ``add_*Servicer_to_server(servicer, ...)`` is given in place of a ``grpc.aio``
    server: it registers each of the service's methods with the MCPError mapping wrapped around it, once,
    at registration (an interceptor did it on every call: an awaited continuation and a new handler per
    call). The generated code registers each service twice, as a generic handler and by method
    name; both are built here from the named methods, so ``add_generic_rpc_handlers`` is a no-op."""

    def __init__(self, server: grpc.aio.Server, checks: Callable[[str], Check | None] | None = None) -> None:
        self._server = server
        self._checks = checks or (lambda method: None)

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        del handlers  # the same methods arrive by name in add_registered_method_handlers

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        guarded = {
            name: _guard(h, f"/{service}/{name}", _codec(h, name), self._checks(f"/{service}/{name}"))
            for name, h in handlers.items()
        }
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, guarded),))
        self._server.add_registered_method_handlers(service, guarded)
