"""The connection to etcd: endpoint resolution, the gRPC channel and its credentials, the etcd3aio facades
over it, the background tasks that live as long as it, and the one translation of its failures into
``MCPError`` (``EtcdStore``, ``etcd_leases`` and ``etcd_watch`` all call through it).

Invariants:
- No grpc or etcd3aio exception leaves a ``calling()`` block: unreachable etcd (refused, reset, deadline) is
  ``errors.Unavailable`` naming the endpoints; a missing or stale token is ``PermissionDenied`` (no user
  configured, or the password refused) or ``Unavailable`` while it is renewed; other statuses map through
  ``grpc_status.error_for_status``. A task being cancelled stays cancelled (never mapped to a retryable
  error).
- One endpoint goes to gRPC as is (it resolves, and re-resolves, a DNS name itself); several are spread
  round-robin over their IPv4 addresses, host names among them resolved once, here.
- Calls before ``open()`` or after ``close()`` fail ``FailedPrecondition``; ``close()`` cancels every
  background task the connection started (token renewal, lease keep-alives).
- Keys and values cross to etcd as bytes: ``encode``/``decode`` are the one conversion (UTF-8, with
  surrogate escapes so any bytes round-trip).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any

import grpc
import grpc.aio
from etcd3aio import EtcdError
from etcd3aio.kv import KVService
from etcd3aio.lease import LeaseService

from mcpcore import errors
from mcpcore.etcd_auth import EtcdAuth, EtcdToken, says_not_authenticated
from mcpcore.tls import aio_channel
from mcpcore.transport import grpc_status

__all__ = ["RETRY_MAX_S", "RETRY_MIN_S", "TRANSIENT", "TRIES", "EtcdConnection", "decode", "encode"]

TRIES = 3  # for idempotent calls only (reads, revoke): writes are sent once
RETRY_MIN_S, RETRY_MAX_S = 0.05, 1.0  # watch reconnect, keep-alive and token retry backoff
TRANSIENT = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN,
     grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED}
)  # fmt: skip
_CHANNEL_OPTIONS: list[tuple[str, int | str]] = [
    # Pings only while a stream (a watch) is open: etcd's default policy GOAWAYs idle pingers.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 0),
    # Reconnect within a second of etcd coming back (gRPC's default backoff grows to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


def encode(data: str | bytes) -> bytes:
    return data.encode("utf-8", "surrogateescape") if isinstance(data, str) else bytes(data)


def decode(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _target(endpoints: Sequence[str]) -> tuple[str, list[tuple[str, int | str]]]:
    """The gRPC target for the endpoints: one as is (a DNS name is resolved, and re-resolved, by gRPC: in
    Kubernetes one Service name), several round-robin over their IPv4 addresses. gRPC takes several
    addresses only as IP literals, so host names among several are resolved here, once; under TLS the first
    name is the one the certificate is checked against (give etcd one certificate for every member's name)
    unless ``tls.server_name`` says otherwise."""
    eps = [e.strip().removeprefix("http://").replace("localhost", "127.0.0.1") for e in endpoints]
    if not eps or not all(eps):
        raise errors.InvalidArgument(f"etcd endpoints {list(endpoints)!r}: need at least one host:port")
    if len(eps) == 1:
        return eps[0], _CHANNEL_OPTIONS
    addresses: list[str] = []
    names: list[str] = []
    for ep in eps:
        host, _, port = ep.rpartition(":")
        if not host or not port.isdigit():
            raise errors.InvalidArgument(f"etcd endpoint {ep!r}: expected host:port")
        try:
            ipaddress.IPv4Address(host)
            addresses.append(ep)
            continue
        except ValueError:
            names.append(host)
        try:
            found = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)
        except OSError as exc:
            raise errors.InvalidArgument(
                f"etcd endpoint {ep!r}: cannot resolve {host!r} ({exc}); several endpoints must be IPv4 "
                "addresses or names that resolve now (or give one name, which gRPC resolves itself)"
            ) from None
        addresses += [f"{a[4][0]}:{port}" for a in found if f"{a[4][0]}:{port}" not in addresses]
    options = [*_CHANNEL_OPTIONS, ("grpc.lb_policy_name", "round_robin")]
    if names:
        options.append(("grpc.ssl_target_name_override", names[0]))  # TLS: a name, not an IP, is checked
    return f"ipv4:{','.join(addresses)}", options


class EtcdConnection:
    """A channel to etcd, opened by ``open()`` and closed by ``close()``."""

    def __init__(self, endpoints: Sequence[str], *, timeout: float, auth: EtcdAuth | None) -> None:
        self.endpoints = ",".join(endpoints)
        self._target, self._options = _target(endpoints)
        self.timeout = timeout
        self._auth = auth if auth is not None and (auth.ca_file or auth.user) else None
        self._token = EtcdToken()
        self._channel: grpc.aio.Channel | None = None
        self._kv: KVService | None = None
        self._lease: LeaseService | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def open(self) -> None:
        """Open the channel. Does not wait for etcd (with a user, at most ``timeout`` for its first token):
        calls fail with ``Unavailable`` until it answers."""
        if self._channel is None:
            self._channel = self._open()
            self._kv = KVService(self._channel, max_attempts=1)
            self._lease = LeaseService(self._channel, max_attempts=1)
            if self._auth is not None and self._auth.user:
                self.spawn(
                    self._token.keep(
                        self._channel,
                        self._auth,
                        endpoints=self.endpoints,
                        deadline_s=self.timeout,
                        transient=TRANSIENT,
                        backoff_s=(RETRY_MIN_S, RETRY_MAX_S),
                    )
                )
                # the first calls carry a token when etcd answers in time (else they retry as unreachable)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._token.answered.wait(), self.timeout)

    def _open(self) -> grpc.aio.Channel:
        if self._auth is None:
            return aio_channel(self._target, None, self._options)
        tls = self._auth.tls
        credentials = tls.channel_credentials()
        if self._auth.user:
            token = grpc.metadata_call_credentials(self._token, name="etcd token")
            credentials = grpc.composite_channel_credentials(credentials, token)
        own = tls.channel_options()  # tls.server_name, when set, is the name checked
        options = [o for o in self._options if not (own and o[0] == "grpc.ssl_target_name_override")]
        return grpc.aio.secure_channel(self._target, credentials, options=[*options, *own])

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self._tasks.clear()
        channel, self._channel, self._kv, self._lease = self._channel, None, None, None
        if channel is not None:
            await channel.close()

    def spawn(self, coro: Coroutine[Any, Any, None], name: str | None = None) -> asyncio.Task[None]:
        """Run ``coro`` for as long as this connection is open (``close()`` cancels it)."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def services(self) -> tuple[KVService, LeaseService, grpc.aio.Channel]:
        if self._kv is None or self._lease is None or self._channel is None:
            raise errors.FailedPrecondition("EtcdStore is not connected: call connect() or use 'async with'")
        return self._kv, self._lease, self._channel

    # --- errors ------------------------------------------------------------------------------------

    def unavailable(self, detail: str) -> errors.Unavailable:
        return errors.Unavailable(
            f"etcd at {self.endpoints} is unreachable ({detail}); is it running? set MCP_ETCD_ENDPOINTS"
        )

    def _map(self, exc: BaseException) -> Exception:
        """The ``MCPError`` for a grpc/etcd3aio failure (the one place statuses are translated)."""
        rpc = exc if isinstance(exc, grpc.aio.AioRpcError) else exc.__cause__
        if isinstance(rpc, grpc.aio.AioRpcError):
            code, detail = rpc.code(), rpc.details() or ""
            if says_not_authenticated(detail):
                return self.not_authenticated(detail)
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return self.unavailable(f"{code.name}: {detail}")
            if code == grpc.StatusCode.UNAUTHENTICATED:
                code = grpc.StatusCode.PERMISSION_DENIED
            return grpc_status.error_for_status(code, f"etcd at {self.endpoints}: {detail or code.name}")
        if isinstance(exc, TimeoutError):
            return self.unavailable(f"no answer within the {self.timeout:g} s deadline")
        return errors.Internal(f"etcd at {self.endpoints}: {exc}")

    def not_authenticated(self, detail: str) -> errors.MCPError:
        if self._token.refused:
            return errors.PermissionDenied(self._token.refused)
        if self._auth is None or not self._auth.user:
            return errors.PermissionDenied(
                f"etcd at {self.endpoints} requires authentication ({detail}): set this service's "
                "etcd_auth.user, etcd_auth.password_file and etcd_auth.ca_file"
            )
        self._token.invalid()  # an expired or not yet issued token: renew it, and the caller retries
        return errors.Unavailable(
            f"etcd at {self.endpoints}: the token of user {self._auth.user!r} is not valid yet or any more "
            f"({detail}); renewing it"
        )

    @contextlib.contextmanager
    def calling(self) -> Iterator[None]:
        try:
            yield
        except (grpc.aio.AioRpcError, EtcdError, TimeoutError, asyncio.InvalidStateError) as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # The caller asked this task to stop; grpc can absorb that request inside a call (its
                # preparation task swallows CancelledError) and surface a timeout or a dead call instead.
                # Mapped, that would read as a transient etcd error and a retry loop would go on forever.
                raise asyncio.CancelledError() from exc
            raise self._map(exc) from exc
