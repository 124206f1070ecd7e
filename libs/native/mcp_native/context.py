"""One call of the native gRPC server (``mcp_native.grpc_server``) as its handler sees it, and how the
handler's end becomes the call's status.

``Context`` implements ``mcpcore.call_context.CallContext`` and nothing more: a handler written against
that interface runs unchanged on grpc.aio and here. Where the two could differ (an exception's status
message, trailing metadata that is not tuples, metadata that is not UTF-8) this side answers as grpc.aio
does; the conformance suite (``tests/integration/test_native_grpc_*.py``) runs the same cases on both.

Invariants:
- A status set by the handler (``set_code``, ``abort``) is the call's status; an exception it raises is
  UNKNOWN with the exception's class and message unless it set a status first; a cancellation is
  CANCELLED (``Outcome``).
- A stream's writes wait while ``MAX_WRITES_QUEUED`` of them are queued in the transport; a request
  message is asked of the transport only when the handler reads the next one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any, NoReturn

import grpc
import grpc.aio

__all__ = ["END", "MAX_WRITES_QUEUED", "Context", "Outcome", "request_stream", "single_request"]

log = logging.getLogger(__name__)

MAX_WRITES_QUEUED = 2  # a stream's replies queued in the transport (each up to max_send bytes)
END = object()  # the end of a call's request messages


class Context:
    """One call of the native server; implements ``CallContext``."""

    __slots__ = (
        "_auth",
        "_deadline",
        "_door",
        "_metadata",
        "_queued",
        "_serialize",
        "_written",
        "cancelled",
        "id",
        "method",
        "requests",
        "status_code",
        "status_details",
        "task",
        "trailers",
    )

    def __init__(self, door: Any, call_id: int, method: str, remaining: float | None) -> None:
        self._door = door
        self.id = call_id
        self.method = method
        self._deadline = None if remaining is None else time.monotonic() + remaining
        self.status_code = grpc.StatusCode.OK
        self.status_details = ""
        self.trailers: tuple[tuple[str, Any], ...] = ()
        self._metadata: tuple[tuple[str, Any], ...] | None = None
        self._auth: dict[str, list[bytes]] | None = None
        self.cancelled = False  # the client went away or the deadline passed
        self._queued = 0
        self._written: asyncio.Event | None = None
        self.requests: asyncio.Queue[Any] | None = None  # a call whose request messages are read
        self._serialize: Any = None
        self.task: asyncio.Task[None] | None = None

    # -- CallContext ---------------------------------------------------------------------------------
    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        if self._metadata is None:
            self._metadata = self._door.metadata(self.id)
        return self._metadata

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def auth_context(self) -> dict[str, list[bytes]]:
        if self._auth is None:
            self._auth = self._door.auth(self.id)
        return self._auth

    def set_code(self, code: grpc.StatusCode) -> None:
        self.status_code = code

    def set_details(self, details: str) -> None:
        self.status_details = details

    def set_trailing_metadata(self, trailing_metadata: Sequence[tuple[str, Any]]) -> None:
        if not all(type(pair) is tuple for pair in trailing_metadata):  # grpc.aio refuses lists too
            raise TypeError(
                "Invalid trailing metadata type, expected Tuple[Tuple[str, Union[str, bytes]]...]: "
                f"{trailing_metadata}"
            )
        self.trailers = tuple(trailing_metadata)

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Sequence[tuple[str, Any]] = ()
    ) -> NoReturn:
        if code == grpc.StatusCode.OK:
            raise ValueError("abort() needs a status other than OK")
        self.status_code, self.status_details = code, details
        if trailing_metadata:
            self.set_trailing_metadata(trailing_metadata)
        raise grpc.aio.AbortError()

    # -- the server's side ---------------------------------------------------------------------------
    async def write(self, message: Any) -> None:
        """Send one reply of a stream (serialized with the method's serializer)."""
        if self.cancelled:
            raise asyncio.CancelledError
        self._queued += 1
        self._door.write(self.id, message if self._serialize is None else self._serialize(message))
        while self._queued >= MAX_WRITES_QUEUED and not self.cancelled:
            if self._written is None:
                self._written = asyncio.Event()
            self._written.clear()
            await self._written.wait()

    def wrote(self) -> None:
        """The transport sent one of this call's writes (or the call was cancelled)."""
        self._queued -= 1
        if self._written is not None:
            self._written.set()

    def serialize_with(self, serialize: Any) -> None:
        self._serialize = serialize

    async def read(self) -> Any:
        """The next request message, or ``END``."""
        assert self.requests is not None
        self._door.read(self.id)
        return await self.requests.get()


class Outcome:
    """How a call's handler ended, as its status: an abort keeps the status it set; a cancellation is
    CANCELLED; an exception is UNKNOWN with the exception, unless a status was set first (as grpc.aio,
    in grpc.aio's words)."""

    __slots__ = ("call",)

    def __init__(self, call: Context) -> None:
        self.call = call

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> bool:
        call = self.call
        if exc is None or isinstance(exc, grpc.aio.AbortError):
            return exc is not None
        if isinstance(exc, asyncio.CancelledError):
            call.status_code, call.status_details = grpc.StatusCode.CANCELLED, "Cancelled"
            return True
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: the process's, not the call's
            if call.status_code == grpc.StatusCode.OK:
                call.status_code, call.status_details = grpc.StatusCode.UNAVAILABLE, "the server is stopping"
            return False
        log.error("%s failed", call.method, exc_info=exc)
        if call.status_code == grpc.StatusCode.OK:
            call.status_code, call.status_details = grpc.StatusCode.UNKNOWN, unexpected(exc)
        return True


def unexpected(exc: BaseException) -> str:
    """The status message of a call ended by ``exc``, as grpc.aio words it."""
    return f"Unexpected {type(exc)}: {exc}"


async def single_request(call: Context, handler: grpc.RpcMethodHandler, message: bytes | None) -> Any:
    """The request of a method with one request message: the one the call began with, or (a method the
    transport was not told of at bind, found through a generic handler) the first one read."""
    if message is None:
        call.requests = asyncio.Queue()
        message = await call.read()
        if message is END:
            await call.abort(grpc.StatusCode.INTERNAL, "the call ended before its request arrived")
    return message if handler.request_deserializer is None else handler.request_deserializer(message)


async def request_stream(call: Context, handler: grpc.RpcMethodHandler) -> Any:
    """A streaming call's request messages, each read when the handler asks for it."""
    deserialize = handler.request_deserializer
    while True:
        message = await call.read()
        if message is END:
            return
        yield message if deserialize is None else deserialize(message)
