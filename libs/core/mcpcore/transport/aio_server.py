"""``AioServer``: a ``grpc.aio`` server as an ``RpcServer`` (``mcpcore.call_context``), what every service
runs unless it names another ``server_factory`` (the router's grpc++ front door), and that outlives
grpc.aio's own serving loop.

grpc.aio (1.85) decodes each request's method path as UTF-8 in its serving loop, before any handler runs,
and a path that is not UTF-8 ends that loop: the server stops taking calls and closes its ports for good
(its shutdown then fails before it cancels the calls still running), while the process and its etcd
records live on. One request from anyone who can reach the port would do it.

Invariants:
- The server keeps what it was given (handlers, ports; a port asked as 0 is kept as the one it got).
- When grpc's serving loop ends on its own, a new server takes the same ports at once, and alone (no
  ``SO_REUSEPORT`` beside the ended one's listener, unless the port is shared by design): grpc logs the
  failure (the filter below turns that record into a wake-up for every ``AioServer`` of the process, each
  of which asks its own server whether it ended), and a server that ends without a log line (a grpc that
  logs no more) is found when its shutdown completes. The one that ended finishes its running calls
  (``RETIRE_GRACE_S``, then they end CANCELLED).
- A bad request costs one WARNING line per 10 s (``OncePer``), not grpc's and asyncio's ERROR lines with
  tracebacks; a new server that cannot bind or start is an ERROR, and the process stops itself (SIGTERM:
  its graceful stop) so that its supervisor restarts it rather than keep records of a closed port.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc
import grpc.aio

from mcpcore.logs import OncePer
from mcpcore.tls import TLSConfig

__all__ = ["REBIND_S", "RETIRE_GRACE_S", "AioServer"]

log = logging.getLogger(__name__)

#: How long a server whose serving loop ended may finish the calls it still runs.
RETIRE_GRACE_S = 10.0
#: How long a new server tries to take the ports while the ended one's listener closes.
REBIND_S = 5.0
_FOREVER_S = 1e9  # a timeout that never fires: grpc shields its shutdown future only under a timeout
_PATH_NOT_UTF_8 = "a request's method path is not UTF-8"
_RESTARTS = OncePer(10.0)
_WAKE: set[Callable[[], None]] = set()  # each running AioServer's wake-up


def _path_crash(exc: object) -> bool:
    """``exc`` is grpc.aio's serving loop failing to decode a request's method path."""
    if not isinstance(exc, UnicodeDecodeError):
        return False
    tb = exc.__traceback__
    while tb is not None:
        if "aio/server.pyx" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


def _path_crash_filter(record: logging.LogRecord) -> bool:
    """On grpc's and asyncio's loggers: drops their ERROR lines for that failure (``AioServer`` says it
    once per period as a WARNING), and wakes the servers when grpc reports it."""
    crash = record.msg if isinstance(record.msg, BaseException) else record.exc_info and record.exc_info[1]
    if not _path_crash(crash):
        return True
    if record.name == "grpc._cython.cygrpc":  # logged as the serving loop ends: look now
        for wake in list(_WAKE):
            try:
                wake()
            except RuntimeError:  # its loop closed without stop(): forgotten, never the filter failing
                _WAKE.discard(wake)  # (grpc's own shutdown of the ended server runs after this record)
    return False


for _name in ("grpc._cython.cygrpc", "asyncio"):
    logging.getLogger(_name).addFilter(_path_crash_filter)


class AioServer:
    def __init__(
        self, *, options: Sequence[tuple[str, Any]] = (), maximum_concurrent_rpcs: int | None = None
    ) -> None:
        self._options = list(options)
        self._maximum_concurrent_rpcs = maximum_concurrent_rpcs
        self._generic: list[grpc.GenericRpcHandler] = []
        self._registered: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
        self._ports: list[tuple[str, TLSConfig | None]] = []
        self._watch: asyncio.Task[None] | None = None
        self._wake: Callable[[], None] | None = None
        self._woken = asyncio.Event()
        self._retiring: set[asyncio.Task[None]] = set()
        self._stopping = False
        self.restarts = 0
        self.server = self._new()

    def _new(self, options: list[tuple[str, Any]] | None = None) -> grpc.aio.Server:
        options = self._options if options is None else options
        return grpc.aio.server(options=options, maximum_concurrent_rpcs=self._maximum_concurrent_rpcs)

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._generic.extend(handlers)
        self.server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        self._registered[service] = dict(handlers)
        self.server.add_registered_method_handlers(service, dict(handlers))

    def bind(self, address: str, tls: TLSConfig | None) -> int:
        port = self._bind(self.server, address, tls)
        self._ports.append((f"{address.rsplit(':', 1)[0]}:{port}", tls))
        return port

    @staticmethod
    def _bind(server: grpc.aio.Server, address: str, tls: TLSConfig | None) -> int:
        try:
            if tls is None:
                return server.add_insecure_port(address)
            return server.add_secure_port(address, tls.server_credentials())
        except RuntimeError as exc:  # grpc.aio's word for it; the same error as the native server's
            why = "in use by another process, or not an address of this host"
            raise OSError(f"Failed to bind gRPC port {address}: {why}") from exc

    async def start(self) -> None:
        await self.server.start()
        loop = asyncio.get_running_loop()
        self._wake = lambda: loop.call_soon_threadsafe(self._woken.set)
        _WAKE.add(self._wake)
        self._watch = loop.create_task(self._keep_serving())

    async def _ended(self) -> str | None:
        """Why the current server ended, or None while it serves."""
        try:
            serving = await self.server.wait_for_termination(timeout=0)
        except Exception as exc:  # grpc re-raises what ended its serving loop
            return _PATH_NOT_UTF_8 if _path_crash(exc) else repr(exc)
        return None if serving else "it stopped"

    async def _keep_serving(self) -> None:
        while not self._stopping:
            self._woken.clear()
            ended = asyncio.ensure_future(self.server.wait_for_termination(timeout=_FOREVER_S))
            woken = asyncio.ensure_future(self._woken.wait())
            await asyncio.wait((ended, woken), return_when=asyncio.FIRST_COMPLETED)
            for waiter in (ended, woken):
                waiter.cancel()  # safe: grpc shields its shutdown future from a timed wait
            if self._stopping or (cause := await self._ended()) is None:
                continue
            try:
                await self._serve_again(cause)
            except Exception:
                where = self._addresses()
                log.exception("the gRPC server on %s ended (%s) and could not serve again; stopping "
                              "this process for its supervisor to start afresh", where, cause)  # fmt: skip
                os.kill(os.getpid(), signal.SIGTERM)
                return

    def _addresses(self) -> str:
        return ", ".join(address for address, _ in self._ports)

    async def _serve_again(self, cause: str) -> None:
        # Bound without SO_REUSEPORT (unless the port is shared with sibling processes by design): while
        # the ended server's listener still accepts, the bind fails and is tried again, so no connection
        # lands on a server that takes no calls.
        shared = ("grpc.so_reuseport", 1) in self._options
        options = [o for o in self._options if shared or o[0] != "grpc.so_reuseport"]
        options += [] if shared else [("grpc.so_reuseport", 0)]
        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + REBIND_S, 0.005
        while True:
            server = self._new(options)
            server.add_generic_rpc_handlers(self._generic)
            for service, handlers in self._registered.items():
                server.add_registered_method_handlers(service, handlers)
            try:
                for address, tls in self._ports:
                    self._bind(server, address, tls)
                break
            except OSError:
                if loop.time() > deadline:
                    raise
            await asyncio.sleep(pause)  # backing off: nothing signals when grpc's listener has closed
            pause = min(2 * pause, 0.2)
        await server.start()
        old, self.server = self.server, server
        retire = asyncio.ensure_future(old.stop(RETIRE_GRACE_S))  # its running calls finish there
        self._retiring.add(retire)
        retire.add_done_callback(self._retiring.discard)
        self.restarts += 1
        if (unsaid := _RESTARTS.allow(cause)) is not None:
            log.warning("the gRPC server on %s ended (%s); serving again on the same ports (%d more since "
                        "the last line)", self._addresses(), cause, unsaid)  # fmt: skip

    async def stop(self, grace: float | None) -> None:
        self._stopping = True
        if self._wake is not None:
            _WAKE.discard(self._wake)
        self._woken.set()
        if self._watch is not None:
            await self._watch  # ends at once: a new server it was starting is self.server by now
        await asyncio.gather(self.server.stop(grace), *self._retiring)
