"""One ZeroMQ link to one worker: where it connects, its socket and monitor, and its requests in flight.

Invariants:
- A link connects to the worker's same-host endpoint (``wire.local_endpoint``, an abstract Unix socket)
  when its record lists ``FEATURE_LOCAL``, publishes an address of this host, and that socket answers from
  here; else to its published endpoint (``link_address``). A worker published at another host's address is
  never looked for here, so a local process cannot stand in for it by binding its name.
- Bounded: the socket's high-water marks (``max_in_flight`` + 16 each way) bound what libzmq buffers, and
  ``IMMEDIATE`` queues only to a connected worker, so a send to none fails at once.
- A link is down from its opening until the ZMTP handshake succeeds, and again from a disconnect (a dead
  worker) or heartbeat timeout (a frozen one) until the next handshake (``watch``).
- The socket is a plain one (the forwarder watches its file descriptor); only the monitor, which carries
  rare events, is an asyncio socket, on a shadow of the same context.
- What a failed send means is typed (DESIGN.md 7, delivery): ``NotSent`` (provably did not start) or
  ``MayHaveStarted`` (the link failed while the request was out).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from mcpcore import wire
from mcpcore.errors import Unavailable
from mcpcore.transport import shm_lease

__all__ = [
    "Link",
    "LinkOptions",
    "LinkTarget",
    "MayHaveStarted",
    "NotSent",
    "Pending",
    "link_address",
    "offers_local",
]

_monitors = itertools.count(1)


class LinkTarget(Protocol):
    """What a link needs to know of a worker (the router's ``LinkTarget``, the SDK's route)."""

    @property
    def id(self) -> str: ...
    @property
    def zmq(self) -> str: ...
    @property
    def curve_public_key(self) -> str: ...
    @property
    def zmq_features(self) -> frozenset[str]: ...
    @property
    def incarnation(self) -> str: ...
    @property
    def draining(self) -> bool: ...


def link_address(endpoint: LinkTarget) -> str:
    """Where a link to ``endpoint`` connects: its same-host endpoint when the record offers one, publishes
    an address of this host and the name listens here (a connect to an abstract Unix socket answers at
    once either way), else its ``zmq``."""
    if offers_local(endpoint) and endpoint.incarnation and _this_host(endpoint.zmq):
        local = wire.local_endpoint(
            endpoint.id, endpoint.incarnation, endpoint.zmq, endpoint.curve_public_key
        )
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.setblocking(False)
            try:
                probe.connect("\0" + local.removeprefix("ipc://@"))
                return local
            except BlockingIOError:  # its backlog is full: it listens
                return local
            except OSError:  # nobody by that name in this network namespace
                pass
    return endpoint.zmq


def offers_local(endpoint: LinkTarget) -> bool:
    """Its record offers a same-host endpoint."""
    return wire.FEATURE_LOCAL in endpoint.zmq_features


def _this_host(zmq_endpoint: str) -> bool:
    """``tcp://HOST:PORT`` names an IP address of this network namespace (loopback, or one a socket can
    bind here). A host name is not resolved (no lookups on the loop): such a worker is reached by TCP."""
    host = zmq_endpoint.removeprefix("tcp://").rpartition(":")[0].strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if address.is_loopback:
        return True
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as udp:
        try:
            udp.bind((host, 0))  # only an address assigned here binds
        except OSError:
            return False
    return True


class NotSent(Unavailable):
    """The request never left this router for that worker: safe to send to another one."""


class MayHaveStarted(Unavailable):
    """The worker's link failed while the request was out: it may have run."""


@dataclass(eq=False, slots=True)
class Pending:
    """One request in flight on a link, from its send to its last reply (or its link's failure)."""

    future: asyncio.Future[wire.Message] | None  # None once the router gave up on it (abandoned)
    ring: tuple[str, str]  # (model, version)
    nbytes: int
    since: float
    on_partial: Callable[[wire.Message], None] | None = None
    answers: int = 0  # partial replies taken (the next one must say this many)
    shared: shm_lease.Lease | None = None  # the region this request lent the worker
    rid: str = ""  # this router's id of it
    timeout_s: float = 0.0  # what it was given
    slot: int = 0  # the deadline slot it is due in (``DeadlineSlots``)


@dataclass(frozen=True, slots=True)
class LinkOptions:
    """What every link of one forwarder is opened with."""

    max_in_flight: int
    limits: wire.Limits
    heartbeat_s: float
    heartbeat_timeout_s: float
    #: This sender's CURVE identity (public, secret); None: a fresh key pair per link.
    curve_keypair: tuple[bytes, bytes] | None


class Link:
    """The DEALER socket to one worker, its monitor, and the requests in flight on it."""

    def __init__(
        self, endpoint: LinkTarget, ctx: zmq.Context[Any], actx: zmq.asyncio.Context, options: LinkOptions
    ) -> None:
        self.endpoint = endpoint
        self.address = link_address(endpoint)  # what the socket connects to (the same-host one, or zmq)
        self.sock: zmq.Socket[Any] = ctx.socket(zmq.DEALER)
        try:
            self.monitor = self._configure(endpoint, actx, options)
        except BaseException:
            self.sock.close(linger=0)
            raise
        self.pending: dict[str, Pending] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.down = True  # until the handshake succeeds; again from a disconnect to the next handshake
        self.draining = False  # the worker answered "draining": send it nothing more
        self.up = asyncio.Event()  # set from a handshake to the next disconnect (``wait_connected``)
        self.look_scheduled = False
        self.outbox: dict[str, list[Any]] = {}  # request id -> its frames, until they leave (``Outboxes``)
        self.flush_scheduled = False

    def _configure(
        self, endpoint: LinkTarget, actx: zmq.asyncio.Context, options: LinkOptions
    ) -> zmq.asyncio.Socket:
        limits = options.limits
        for option, value in (
            (zmq.LINGER, 0),
            (zmq.IMMEDIATE, 1),  # queue only to a connected worker: a send to none fails at once
            (zmq.SNDHWM, options.max_in_flight + 16),
            (zmq.RCVHWM, options.max_in_flight + 16),
            (zmq.MAXMSGSIZE, limits.max_message_bytes + limits.max_header_bytes),
            (zmq.HEARTBEAT_IVL, int(options.heartbeat_s * 1000)),
            (zmq.HEARTBEAT_TIMEOUT, int(options.heartbeat_timeout_s * 1000)),
            (zmq.HEARTBEAT_TTL, int(options.heartbeat_timeout_s * 1000)),
        ):
            self.sock.setsockopt(option, value)
        if endpoint.curve_public_key:
            public, secret = options.curve_keypair or zmq.curve_keypair()
            self.sock.curve_serverkey = endpoint.curve_public_key.encode()
            self.sock.curve_publickey, self.sock.curve_secretkey = public, secret
        address = f"inproc://link-monitor-{next(_monitors)}"
        self.sock.monitor(address, zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
        monitor = actx.socket(zmq.PAIR)
        monitor.connect(address)
        try:
            self.sock.connect(self.address)
        except BaseException:
            monitor.close(linger=0)
            raise
        return monitor

    async def watch(self, on_disconnect: Callable[[bool], None]) -> None:
        """Follow the monitor until it closes: up at each handshake, down at each disconnect, when
        ``on_disconnect(was_up)`` runs."""
        while True:
            try:
                event = parse_monitor_message(await self.monitor.recv_multipart())
            except asyncio.CancelledError:
                raise
            except Exception:
                return  # the monitor closed with its link
            if event["event"] == zmq.EVENT_DISCONNECTED:
                was_up, self.down = not self.down, True
                self.up.clear()
                on_disconnect(was_up)
            elif event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.down, self.draining = False, False
                self.up.set()

    def close(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Stop watching and close the sockets; wakes ``wait_connected`` (it finds the link gone). What
        was in flight is the owner's to fail."""
        self.down = True
        self.up.set()
        if loop is not None:
            loop.remove_reader(self.sock.FD)
        for task in self.tasks:
            task.cancel()
        with contextlib.suppress(zmq.ZMQError):
            self.sock.disable_monitor()
        self.monitor.close(linger=0)
        self.sock.close(linger=0)
