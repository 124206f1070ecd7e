"""A gRPC server whose transport is grpc++ (``libs/native/src/frontdoor.cc``) and whose methods are the
same Python handlers a ``grpc.aio`` server runs: the router's front door.

Why: under load, grpc.aio's own per-call work was most of the router's CPU (about 0.3 ms a call, one
core at 100% near 1,700 requests per second). grpc++ runs HTTP/2, TLS and each call's state machine on
its own threads without the GIL; the event loop here sees calls in batches (one wake-up, one ``take()``)
and answers each with one ``finish()`` (a unary call's kept, and sent with the rest of its loop
iteration's answers by one ``wake()``).

It offers the part of ``grpc.aio.Server`` that ``mcpcore.serving.GrpcService`` uses
(``add_registered_method_handlers``, ``add_generic_rpc_handlers``, ``bind``, ``start``, ``stop``), and
hands each handler a context with the part of ``grpc.aio.ServicerContext`` the services use
(``invocation_metadata``, ``time_remaining``, ``peer``, ``auth_context``, ``set_code``,
``set_details``, ``set_trailing_metadata``, ``abort``, ``write``, ``cancelled``).

Invariants:
- Every call the transport hands over is finished exactly once: by its task's end (a reply, a status,
  an error: UNKNOWN as grpc.aio answers it), or CANCELLED when the client goes away or the deadline
  passes (the task is cancelled). A call is forgotten here when it is finished.
- Streams have back-pressure both ways: a request message is read only when the handler asks for the
  next one, and a handler's writes wait while ``MAX_WRITES_QUEUED`` are queued in the transport.
- Binding starts serving: the handlers must be registered first (``GrpcService`` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio

from mcpcore.serving import Parts

__all__ = ["MAX_WRITES_QUEUED", "STOP_MARGIN_S", "NativeServer", "available"]

log = logging.getLogger(__name__)

MAX_WRITES_QUEUED = 2  # a stream's replies queued in the transport (each up to max_send bytes)
#: After a stop's grace, handlers have this long to end on their cancellation; calls still open then
#: are finished CANCELLED whatever their handlers do.
STOP_MARGIN_S = 1.0
_START, _MESSAGE, _HALF_CLOSE, _CANCEL, _WRITTEN = range(5)
_END = object()  # the end of a call's request messages

try:
    from mcp_native import _frontdoor
except ImportError as exc:  # not built: make native
    _frontdoor = None
    _WHY = (
        f"mcp_native._frontdoor is not built ({exc}): run make native, or set the router's grpc_server to aio"
    )
else:
    _WHY = ""


def available() -> tuple[bool, str]:
    """(True, "") when the native server can run, else (False, why)."""
    return _frontdoor is not None, _WHY


class _Details(grpc.HandlerCallDetails):
    def __init__(self, method: str, metadata: Sequence[tuple[str, Any]]) -> None:
        self.method = method
        self.invocation_metadata = metadata


class Context:
    """One call, as its handler sees it (``grpc.aio.ServicerContext``'s surface the services use)."""

    __slots__ = (
        "_auth",
        "_cancelled",
        "_code",
        "_deadline",
        "_details",
        "_door",
        "_metadata",
        "_queued",
        "_requests",
        "_serialize",
        "_written",
        "id",
        "method",
        "peer_address",
        "task",
        "trailers",
    )

    def __init__(self, door: Any, call_id: int, method: str, remaining: float | None, peer: str) -> None:
        self._door = door
        self.id = call_id
        self.method = method
        self.peer_address = peer
        self._deadline = None if remaining is None else time.monotonic() + remaining
        self._code = grpc.StatusCode.OK
        self._details = ""
        self.trailers: tuple[tuple[str, Any], ...] = ()
        self._metadata: tuple[tuple[str, Any], ...] | None = None
        self._auth: dict[str, list[bytes]] | None = None
        self._cancelled = False
        self._queued = 0
        self._written: asyncio.Event | None = None
        self._requests: asyncio.Queue[Any] | None = None
        self._serialize: Any = None
        self.task: asyncio.Task[None] | None = None

    # -- grpc.aio.ServicerContext ------------------------------------------------------------------
    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        if self._metadata is None:
            self._metadata = self._door.metadata(self.id)
        return self._metadata

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def peer(self) -> str:
        return self.peer_address

    def auth_context(self) -> dict[str, list[bytes]]:
        if self._auth is None:
            self._auth = self._door.auth(self.id)
        return self._auth

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def set_details(self, details: str) -> None:
        self._details = details

    def details(self) -> str:
        return self._details

    def set_trailing_metadata(self, metadata: Sequence[tuple[str, Any]]) -> None:
        self.trailers = tuple((key, value) for key, value in metadata)

    def cancelled(self) -> bool:
        return self._cancelled

    def done(self) -> bool:
        return self.task is None or self.task.done()

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Sequence[tuple[str, Any]] = ()
    ) -> None:
        if code == grpc.StatusCode.OK:
            raise ValueError("abort() needs a status other than OK")
        self._code, self._details = code, details
        if trailing_metadata:
            self.set_trailing_metadata(trailing_metadata)
        raise grpc.aio.AbortError()

    async def write(self, message: Any) -> None:
        """Send one reply of a stream."""
        await self._send(message if self._serialize is None else self._serialize(message))

    # -- the transport's side ----------------------------------------------------------------------
    async def _send(self, data: bytes) -> None:
        if self._cancelled:
            raise asyncio.CancelledError
        self._queued += 1
        self._door.write(self.id, data)
        while self._queued >= MAX_WRITES_QUEUED and not self._cancelled:
            if self._written is None:
                self._written = asyncio.Event()
            self._written.clear()
            await self._written.wait()

    def _wrote(self) -> None:
        self._queued -= 1
        if self._written is not None:
            self._written.set()

    async def _read(self) -> Any:
        assert self._requests is not None
        self._door.read(self.id)
        return await self._requests.get()


class NativeServer:
    """``grpc.aio.server(options, maximum_concurrent_rpcs)``'s stand-in, served by grpc++."""

    def __init__(
        self, *, options: Sequence[tuple[str, Any]] = (), maximum_concurrent_rpcs: int | None = None
    ) -> None:
        ok, why = available()
        if not ok:
            raise RuntimeError(why)
        values = dict(options)
        self._max_receive = int(values.get("grpc.max_receive_message_length", 4 << 20))
        self._max_send = int(values.get("grpc.max_send_message_length", 4 << 20))
        self._reuse_port = bool(values.get("grpc.so_reuseport", 0))
        self._max_calls = maximum_concurrent_rpcs or 0
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self._generic: list[grpc.GenericRpcHandler] = []
        self._calls: dict[int, Context] = {}
        self._door: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = asyncio.Event()
        self._wake_scheduled = False

    # -- registration (what generated add_*Servicer_to_server functions call) ----------------------
    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        for name, handler in handlers.items():
            self._handlers[f"/{service}/{name}"] = handler

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        """Kept for methods registered only this way; named methods are found first."""
        self._generic.extend(handlers)

    # -- lifecycle ---------------------------------------------------------------------------------
    def bind(self, address: str, tls: Any = None) -> int:
        """Bind ``address`` (TLS when ``tls``, an enabled ``mcpcore.tls.TLSConfig``) and start serving;
        returns the bound port. Raises OSError when the address cannot be bound."""
        self._loop = asyncio.get_running_loop()
        unary = [
            m for m, h in self._handlers.items() if h.unary_unary is not None or h.unary_stream is not None
        ]
        pems: dict[str, Any] = {}
        if tls is not None:
            if not (tls.cert_file and tls.key_file):
                raise ValueError("tls: a server needs cert_file and key_file")
            pems = {
                "cert_chain": _pem(tls.cert_file),
                "private_key": _pem(tls.key_file),
                "root_certs": _pem(tls.ca_file),
                "require_client_cert": bool(tls.ca_file),
            }
        assert _frontdoor is not None
        self._door = _frontdoor.Door(
            address,
            unary,
            max_calls=self._max_calls,
            max_receive=self._max_receive,
            max_send=self._max_send,
            reuse_port=self._reuse_port,
            **pems,
        )
        self._loop.add_reader(self._door.fileno(), self._events)
        return int(self._door.port)

    async def start(self) -> None:
        """Serving began at ``bind``."""

    async def stop(self, grace: float | None) -> None:
        """Refuse new calls, give open ones ``grace`` seconds, then cancel them."""
        door = self._door
        if door is None:
            return
        grace = grace or 0.0
        shutdown = asyncio.ensure_future(asyncio.to_thread(door.shutdown, grace))
        await asyncio.wait({shutdown}, timeout=grace + STOP_MARGIN_S)
        if not shutdown.done():  # a handler that does not end on its cancellation: its call ends anyway
            for call in list(self._calls.values()):
                if call._code == grpc.StatusCode.OK:
                    call._code, call._details = grpc.StatusCode.CANCELLED, "the server stopped"
                self._finish(call, None)
            door.wake()
            await shutdown
        if self._loop is not None:
            self._loop.remove_reader(door.fileno())
        self._events()  # the cancellations of the last calls
        self._door = None
        self._stopped.set()

    async def wait_for_termination(self) -> None:
        await self._stopped.wait()

    def stats(self) -> dict[str, int]:
        return self._door.stats() if self._door is not None else {"active": 0, "refused": 0}

    # -- calls -------------------------------------------------------------------------------------
    def _events(self) -> None:
        door = self._door
        if door is None:
            return
        calls = self._calls
        for event in door.take():
            kind = event[0]
            if kind == _START:
                try:
                    self._begin(door, event)
                except Exception:  # never: each call is answered, and the others in the batch go on
                    log.exception("starting a call failed")
                    if self._calls.pop(event[1], None) is None:
                        door.finish(event[1], grpc.StatusCode.INTERNAL.value[0], "the call could not start")
                continue
            call = calls.get(event[1])
            if call is None:
                continue
            if kind == _MESSAGE:
                assert call._requests is not None
                call._requests.put_nowait(event[2])
            elif kind == _HALF_CLOSE:
                if call._requests is not None:
                    call._requests.put_nowait(_END)
            elif kind == _WRITTEN:
                call._wrote()
            elif kind == _CANCEL:
                call._cancelled = True
                if call._requests is not None:
                    call._requests.put_nowait(_END)
                if call.task is not None:
                    call.task.cancel()  # a task cancelled before it ran never reaches its own finish:
                    call.task.add_done_callback(lambda _, call=call: self._ended(call))  # it ends there

    def _begin(self, door: Any, event: tuple[Any, ...]) -> None:
        """(START, id, method, the request or None, seconds left or None, peer): a call began."""
        _, call_id, method, message, left, peer = event
        handler = self._handlers.get(method)
        call = Context(door, call_id, method, left, peer)
        if handler is None:
            handler = self._generic_handler(call)
        if handler is None:
            door.finish(call_id, grpc.StatusCode.UNIMPLEMENTED.value[0], "Method not found!")
            return
        self._calls[call_id] = call
        loop = self._loop or asyncio.get_running_loop()
        if handler.unary_unary is not None:
            call.task = loop.create_task(self._unary(call, handler, message))
        else:
            call.task = loop.create_task(self._other(call, handler, message))

    def _ended(self, call: Context) -> None:
        """A cancelled call's task is done: if it never ran (so never reached its own finish), the call
        ends here."""
        if call.id in self._calls:
            call._code, call._details = grpc.StatusCode.CANCELLED, "Cancelled"
            self._finish(call, None)

    def _generic_handler(self, call: Context) -> grpc.RpcMethodHandler | None:
        details = _Details(call.method, call.invocation_metadata())
        for generic in self._generic:
            found = generic.service(details)
            if found is not None:
                return found
        return None

    async def _unary(self, call: Context, handler: grpc.RpcMethodHandler, message: bytes | None) -> None:
        reply = None
        try:
            with _Outcome(call):
                if message is None or handler.request_deserializer is None:
                    request = await _single_request(call, handler, message)
                else:  # the request came with the call's start
                    request = handler.request_deserializer(message)
                response = handler.unary_unary(request, call)
                if inspect.isawaitable(response):
                    response = await response
                if call._code == grpc.StatusCode.OK:
                    if response is None:
                        call._code, call._details = grpc.StatusCode.UNKNOWN, "the method returned no response"
                    elif type(response) is Parts or handler.response_serializer is None:
                        reply = response  # sent part by part, large parts from their own memory
                    else:
                        reply = handler.response_serializer(response)
        finally:  # whatever ended it (SystemExit included): the call is answered
            self._finish(call, reply, later=True)

    async def _other(self, call: Context, handler: grpc.RpcMethodHandler, message: bytes | None) -> None:
        """Server, client and bidirectional streams."""
        call._serialize = handler.response_serializer
        write = call.write
        try:
            with _Outcome(call):
                if handler.unary_stream is not None:
                    request = await _single_request(call, handler, message)
                    behaviour = handler.unary_stream
                else:
                    call._requests = asyncio.Queue()
                    request = _requests(call, handler)
                    behaviour = handler.stream_unary or handler.stream_stream
                result = behaviour(request, call)
                if handler.stream_unary is not None:
                    response = await result if inspect.isawaitable(result) else result
                    if call._code == grpc.StatusCode.OK and response is not None:
                        await write(response)
                elif inspect.isasyncgen(result):
                    async for response in result:
                        await write(response)
                elif inspect.isawaitable(result):
                    await result  # it writes with context.write
                else:
                    for response in result:
                        await write(response)
        finally:  # whatever ended it (SystemExit included): the call is answered
            self._finish(call, None)

    def _finish(self, call: Context, reply: Any, *, later: bool = False) -> None:
        """End the call; ``later`` (a unary call, which has no writes to keep in order with): with the rest
        of this loop iteration's answers (``_send_finished``)."""
        self._calls.pop(call.id, None)
        door = self._door
        if door is None:
            return
        try:
            code = call._code.value[0] if isinstance(call._code, grpc.StatusCode) else int(call._code)
            door.finish(call.id, code, str(call._details or ""), reply, call.trailers, later)
            if later:
                self._wake_later()
        except Exception as exc:  # a reply or trailers the transport cannot send: the call still ends
            log.exception("%s: its answer could not be sent", call.method)
            why = f"the answer could not be sent ({type(exc).__name__}: {exc})"
            door.finish(call.id, grpc.StatusCode.INTERNAL.value[0], why)

    def _wake_later(self) -> None:
        if not self._wake_scheduled and self._loop is not None:
            self._wake_scheduled = True
            self._loop.call_soon(self._send_finished)

    def _send_finished(self) -> None:
        """Send the unary calls finished in the last loop iteration, together, from this thread with the
        GIL released. Measured at c = 64 over one connection, alternating runs of 3 x 2 x 8 s: handing
        them to the sending thread once per iteration instead of waking it for each, 3,088 against 2,752
        req/s (the router's CPU per request 0.248 against 0.291 ms, the load generator's 0.120 against
        0.143: its replies arrive together too); sending them here instead of waking that thread at all,
        4,121 against 3,603 req/s, mesh CPU per request over the load generator's 3.20-3.27 against
        3.34-3.38."""
        self._wake_scheduled = False
        if self._door is not None:
            self._door.wake()


class _Outcome:
    """How a call's handler ended, as its status: an abort keeps the status it set; a cancellation is
    CANCELLED; an exception is UNKNOWN with the exception, unless a status was set first (as grpc.aio)."""

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
            call._code, call._details = grpc.StatusCode.CANCELLED, "Cancelled"
            return True
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: the process's, not the call's
            if call._code == grpc.StatusCode.OK:
                call._code, call._details = grpc.StatusCode.UNAVAILABLE, "the server is stopping"
            return False
        log.error("%s failed", call.method, exc_info=exc)
        if call._code == grpc.StatusCode.OK:
            call._code, call._details = grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}"
        return True


async def _single_request(call: Context, handler: grpc.RpcMethodHandler, message: bytes | None) -> Any:
    """The request of a method with one request message: the one the call began with, or (a method the
    transport was not told of at bind, found through a generic handler) the first one read."""
    if message is None:
        call._requests = asyncio.Queue()
        message = await call._read()
        if message is _END:
            await call.abort(grpc.StatusCode.INTERNAL, "the call ended before its request arrived")
    return message if handler.request_deserializer is None else handler.request_deserializer(message)


async def _requests(call: Context, handler: grpc.RpcMethodHandler) -> Any:
    deserialize = handler.request_deserializer
    while True:
        message = await call._read()
        if message is _END:
            return
        yield message if deserialize is None else deserialize(message)


def _pem(path: str | None) -> str | None:
    if not path:
        return None
    with open(path, encoding="ascii") as f:
        return f.read()


with contextlib.suppress(Exception):  # the type checkers' view: Context is a ServicerContext
    grpc.aio.ServicerContext.register(Context)  # type: ignore[attr-defined]
