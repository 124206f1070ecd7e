"""A gRPC server whose transport is grpc++ (``libs/native/src``) and whose methods are the same Python
handlers a ``grpc.aio`` server runs: the router's front door.

Why (docs/design/native-front-door.md): grpc.aio's own per-call work was most of the router's CPU. grpc++
runs HTTP/2, TLS and each call's state machine on its own threads without the GIL; the event loop here
sees calls in batches (one wake-up, one ``take()``) and answers each with one ``finish()`` (a unary
call's kept, and sent with the rest of its loop iteration's answers by one ``wake()``).

``NativeServer`` implements ``mcpcore.call_context.RpcServer``; each handler gets a
``mcp_native.context.Context``, which implements ``CallContext``.

Invariants:
- Every call the transport hands over is finished exactly once: by its task's end (a reply, a status,
  an error: UNKNOWN as grpc.aio answers it), or CANCELLED when the client goes away or the deadline
  passes (the task is cancelled). A call is forgotten here when it is finished.
- Streams have back-pressure both ways (``mcp_native.context``).
- Binding starts serving: the handlers must be registered first (``GrpcService`` does).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from mcp_native.context import (
    END,
    MAX_WRITES_QUEUED,
    Context,
    Outcome,
    request_stream,
    single_request,
    unexpected,
)
from mcpcore.serving import Parts

if TYPE_CHECKING:
    from mcpcore.tls import TLSConfig

__all__ = ["MAX_WRITES_QUEUED", "STOP_MARGIN_S", "NativeServer", "available"]

log = logging.getLogger(__name__)

#: After a stop's grace, handlers have this long to end on their cancellation; calls still open then
#: are finished CANCELLED whatever their handlers do.
STOP_MARGIN_S = 1.0
_START, _MESSAGE, _HALF_CLOSE, _CANCEL, _WRITTEN = range(5)

_INTERFACE = 2  # the _frontdoor events and methods this module speaks (its INTERFACE)

try:
    from mcp_native import _frontdoor
except ImportError as exc:  # not built: make native
    _frontdoor = None
    _WHY = (
        f"mcp_native._frontdoor is not built ({exc}): run make native, or set the router's grpc_server to aio"
    )
else:
    _WHY = ""
    if getattr(_frontdoor, "INTERFACE", 1) != _INTERFACE:  # built from older sources
        _frontdoor = None
        _WHY = "mcp_native._frontdoor was built from other sources than these: run make native"


def available() -> tuple[bool, str]:
    """(True, "") when the native server can run, else (False, why)."""
    return _frontdoor is not None, _WHY


class _Details(grpc.HandlerCallDetails):
    """What a generic handler is asked with (grpc's handler API)."""

    def __init__(self, method: str, metadata: Sequence[tuple[str, Any]]) -> None:
        self.method = method
        self.invocation_metadata = metadata


class NativeServer:
    """A gRPC server served by grpc++; implements ``RpcServer``. Takes the options ``GrpcService`` passes
    (the message size limits, ``grpc.so_reuseport``) and a limit on concurrent calls."""

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
        self._wake_scheduled = False

    # -- registration (what generated add_*Servicer_to_server functions call) ----------------------
    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        for name, handler in handlers.items():
            self._handlers[f"/{service}/{name}"] = handler

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        """Kept for methods registered only this way; named methods are found first."""
        self._generic.extend(handlers)

    # -- lifecycle ---------------------------------------------------------------------------------
    def bind(self, address: str, tls: TLSConfig | None) -> int:
        """Bind ``address`` (TLS when ``tls``) and start serving; returns the bound port. Raises OSError
        when the address cannot be bound."""
        self._loop = asyncio.get_running_loop()
        unary = [
            m for m, h in self._handlers.items() if h.unary_unary is not None or h.unary_stream is not None
        ]
        pems: dict[str, Any] = {}
        if tls is not None:
            if not (tls.cert_file and tls.key_file):  # never served in the clear instead
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
                if call.status_code == grpc.StatusCode.OK:
                    call.status_code, call.status_details = grpc.StatusCode.CANCELLED, "the server stopped"
                self._finish(call, None)
            door.wake()
            await shutdown
        if self._loop is not None:
            self._loop.remove_reader(door.fileno())
        self._events()  # the cancellations of the last calls
        self._door = None

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
                assert call.requests is not None
                call.requests.put_nowait(event[2])
            elif kind == _HALF_CLOSE:
                if call.requests is not None:
                    call.requests.put_nowait(END)
            elif kind == _WRITTEN:
                call.wrote()
            elif kind == _CANCEL:
                call.cancelled = True
                if call.requests is not None:
                    call.requests.put_nowait(END)
                if call.task is not None:
                    call.task.cancel()  # a task cancelled before it ran never reaches its own finish:
                    call.task.add_done_callback(lambda _, call=call: self._ended(call))  # it ends there

    def _begin(self, door: Any, event: tuple[Any, ...]) -> None:
        """(START, id, method, the request or None, seconds left or None): a call began."""
        _, call_id, method, message, left = event
        handler = self._handlers.get(method)
        call = Context(door, call_id, method, left)
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
            call.status_code, call.status_details = grpc.StatusCode.CANCELLED, "Cancelled"
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
            with Outcome(call):
                if message is None or handler.request_deserializer is None:
                    request = await single_request(call, handler, message)
                else:  # the request came with the call's start
                    request = handler.request_deserializer(message)
                response = handler.unary_unary(request, call)
                if inspect.isawaitable(response):
                    response = await response
                if call.status_code == grpc.StatusCode.OK:
                    if response is None:
                        call.status_code = grpc.StatusCode.UNKNOWN
                        call.status_details = "the method returned no response"
                    elif type(response) is Parts:
                        reply = response  # sent part by part, large parts from their own memory
                    elif handler.response_serializer is None:  # bytes-like, or a str as grpc.aio takes it
                        reply = response.encode() if type(response) is str else response
                    else:
                        reply = handler.response_serializer(response)
        finally:  # whatever ended it (SystemExit included): the call is answered
            self._finish(call, reply, later=True)

    async def _other(self, call: Context, handler: grpc.RpcMethodHandler, message: bytes | None) -> None:
        """Server, client and bidirectional streams."""
        call.serialize_with(handler.response_serializer)
        write = call.write
        try:
            with Outcome(call):
                if handler.unary_stream is not None:
                    request = await single_request(call, handler, message)
                    behaviour = handler.unary_stream
                else:
                    call.requests = asyncio.Queue()
                    request = request_stream(call, handler)
                    behaviour = handler.stream_unary or handler.stream_stream
                result = behaviour(request, call)
                if handler.stream_unary is not None:
                    response = await result if inspect.isawaitable(result) else result
                    if call.status_code == grpc.StatusCode.OK and response is not None:
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
            code = call.status_code
            number = code.value[0] if isinstance(code, grpc.StatusCode) else int(code)
            door.finish(call.id, number, str(call.status_details or ""), reply, call.trailers, later)
            if later:
                self._wake_later()
        except Exception as exc:  # a reply or trailers the transport cannot send: the call still ends
            log.exception("%s: its answer could not be sent", call.method)
            door.finish(call.id, grpc.StatusCode.UNKNOWN.value[0], unexpected(exc))

    def _wake_later(self) -> None:
        if not self._wake_scheduled and self._loop is not None:
            self._wake_scheduled = True
            self._loop.call_soon(self._send_finished)

    def _send_finished(self) -> None:
        """Send the unary calls finished in the last loop iteration, together, from this thread with the
        GIL released: one hand-over per iteration, and no thread to wake (faster than either the sending
        thread per call or per iteration: docs/design/reply-batching.md)."""
        self._wake_scheduled = False
        if self._door is not None:
            self._door.wake()


def _pem(path: str | None) -> str | None:
    if not path:
        return None
    with open(path, encoding="ascii") as f:
        return f.read()
