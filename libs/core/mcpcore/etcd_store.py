"""``EtcdStore``: the ``Store`` interface over a real etcd v3 cluster (gRPC, asyncio).

Built on ``etcd3aio`` (its generated etcd protobufs, stubs and KV/lease facades) over a gRPC channel this
module owns. Why etcd3aio: PyPI ``etcd3`` 0.12 fails to import with protobuf 7, and its pure-Python
protobuf workaround slows every message 11-160x; etcd3aio passed put/get, prefix, lease expiry, watch,
CAS and watch resume across an etcd restart, while ``aetcd`` drops the watch on restart. The choice is
hidden behind ``Store``: nothing outside this module imports etcd3aio.

Invariants:
- No grpc or etcd3aio exception leaves this module: unreachable etcd (refused, reset, deadline) is
  ``errors.Unavailable`` naming the endpoints; other statuses map through ``grpc_status.error_for_status``.
- Every unary call has a deadline (``timeout``). Only idempotent calls (reads, lease revoke) are retried;
  writes and transactions are sent once, so a lost reply never turns a won compare into a "lost race"
  (a write that failed ``Unavailable`` may still have been applied: re-read before writing again).
- Compares are on mod revision (etcd target MOD); a missing key has mod revision 0.
- ``watch_prefix`` tracks the last revision it *yielded* and resumes from the one after it, on its own
  stream (not etcd3aio's ``watch``, which resumes from the last response header: a created or progress
  response, or a catch-up batch cut at 1000 revisions, would make it skip events). etcd never splits one
  revision across responses, so resuming at last + 1 loses and repeats nothing. A (re)opened watch whose
  store is behind the last revision yielded, and a linearizable read too, raises ``StoreRewound`` (etcd
  would otherwise wait, silently, for a revision that a restored or emptied etcd reaches only much later,
  with other data); a member merely a little behind the others is not that. Watches require a leader: a
  member cut off from its peers ends them, and they resume on another member.
- A ``keep_alive`` refresher sets ``lost`` once etcd says the lease is gone, or once it could not reach
  etcd for a whole TTL; until then it retries, logging, and never dies silently.
- Security (``EtcdAuth``): TLS to etcd (its CA; a client certificate where etcd asks for one), and etcd's
  username/password auth. A password is only ever sent over TLS. The token comes from ``Authenticate`` on a
  background task and rides on every call as call credentials; it is renewed every ``_TOKEN_RENEW_S`` and
  whenever etcd says it is invalid. Until the first token, calls fail ``Unavailable`` (callers retry as for
  an unreachable etcd); a refused password is ``PermissionDenied`` on every call, saying which user.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
import grpc.aio
from etcd3aio import EtcdError, prefix_range_end
from etcd3aio._protobuf import (
    AuthenticateRequest,
    AuthStub,
    DeleteRangeRequest,
    LeaseKeepAliveRequest,
    LeaseStub,
    PutRequest,
    RequestOp,
    WatchCreateRequest,
    WatchRequest,
    WatchResponse,
    WatchStub,
    kv_pb2,
)
from etcd3aio._protobuf import Compare as PbCompare
from etcd3aio.kv import KVService
from etcd3aio.lease import LeaseService

from mcpcore import errors
from mcpcore.store import Compare as StoreCompare
from mcpcore.store import (
    Delete,
    EventType,
    KeepAlive,
    KeyValue,
    Lease,
    Put,
    Range,
    Store,
    StoreRewound,
    TxnResult,
    WatchCompacted,
    WatchEvent,
)
from mcpcore.tls import TLSConfig, aio_channel
from mcpcore.transport import grpc_status

__all__ = ["EtcdAuth", "EtcdStore"]

log = logging.getLogger(__name__)

_TRIES = 3  # for idempotent calls only (reads, revoke): writes are sent once
_RETRY_MIN_S, _RETRY_MAX_S = 0.05, 1.0  # watch reconnect and keep-alive retry backoff
_TRANSIENT = frozenset(
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


_TOKEN_RENEW_S = 100.0  # etcd's simple tokens live 300 s (--auth-token-ttl) unless used
_NOT_AUTHENTICATED = ("user name is empty", "invalid auth token", "token is invalid", "auth store is old")


@dataclass(frozen=True)
class EtcdAuth:
    """How a service proves itself to etcd and checks etcd's certificate (each service's ``etcd_auth``
    config section: env ``MCP_<SERVICE>_ETCD_AUTH__USER`` ...)."""

    #: etcd's CA: set, the service speaks TLS to etcd and verifies it.
    ca_file: str = ""
    #: A client certificate and key, where etcd is run with --client-cert-auth.
    cert_file: str = ""
    key_file: str = ""
    #: etcd user (``etcdctl user add``) and a file holding its password (a mounted secret, not an env var).
    user: str = ""
    password_file: str = ""

    def __post_init__(self) -> None:
        if bool(self.user) != bool(self.password_file):
            raise ValueError("etcd_auth: user and password_file go together")
        if self.user and not self.ca_file:
            raise ValueError("etcd_auth: a user needs ca_file: the password would cross the network in clear")
        if self.password_file and not Path(self.password_file).is_file():
            raise ValueError(f"etcd_auth.password_file: no such file {self.password_file!r}")
        self.tls  # noqa: B018  (checks the certificate files now, at start)

    @property
    def tls(self) -> TLSConfig:
        return TLSConfig(ca_file=self.ca_file, cert_file=self.cert_file, key_file=self.key_file)

    def password(self) -> str:
        return Path(self.password_file).read_text().strip()


class _Token(grpc.AuthMetadataPlugin):
    """The current etcd token on every call (none before the first ``Authenticate``)."""

    def __init__(self) -> None:
        self.value = ""

    def __call__(self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback) -> None:
        # never on Authenticate itself: etcd refuses any request with a stale token (after a restart)
        fresh = not context.method_name.endswith("Authenticate")
        callback((("token", self.value),) if self.value and fresh else (), None)


def _b(data: str | bytes) -> bytes:
    return data.encode("utf-8", "surrogateescape") if isinstance(data, str) else bytes(data)


_REQUIRE_LEADER = (("hasleader", "true"),)


def _s(raw: bytes) -> str:
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


class EtcdStore(Store):
    """``Store`` over etcd. Use ``async with EtcdStore([...]) as store`` or ``connect()``/``close()``."""

    def __init__(
        self, endpoints: Sequence[str], *, timeout: float = 5.0, auth: EtcdAuth | None = None
    ) -> None:
        self._endpoints = ",".join(endpoints)
        self._target, self._options = _target(endpoints)
        self._timeout = timeout
        self._auth = auth if auth is not None and (auth.ca_file or auth.user) else None
        self._token = _Token()
        self._auth_error = ""  # etcd refused the password: every call says so
        self._renew = asyncio.Event()
        self._answered = asyncio.Event()  # etcd answered an Authenticate (a token or a refusal)
        self._channel: grpc.aio.Channel | None = None
        self._kv: KVService | None = None
        self._lease: LeaseService | None = None
        self._refreshers: set[asyncio.Task[None]] = set()

    async def connect(self) -> None:
        """Open the channel. Does not wait for etcd (with a user, at most ``timeout`` for its first token):
        calls fail with ``Unavailable`` until it answers."""
        if self._channel is None:
            self._channel = self._open()
            self._kv = KVService(self._channel, max_attempts=1)
            self._lease = LeaseService(self._channel, max_attempts=1)
            if self._auth is not None and self._auth.user:
                task = asyncio.get_running_loop().create_task(self._keep_token(self._auth))
                self._refreshers.add(task)
                task.add_done_callback(self._refreshers.discard)
                # the first calls carry a token when etcd answers in time (else they retry as unreachable)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._answered.wait(), self._timeout)

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

    async def _keep_token(self, auth: EtcdAuth) -> None:
        """Authenticate now, then again every _TOKEN_RENEW_S or when etcd says the token is invalid."""
        stub = AuthStub(self._channel)
        backoff = _RETRY_MIN_S
        while True:
            try:
                reply = await stub.Authenticate(
                    AuthenticateRequest(name=auth.user, password=auth.password()), timeout=self._timeout
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _TRANSIENT or any(s in (exc.details() or "") for s in _NOT_AUTHENTICATED):
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, _RETRY_MAX_S)
                    continue
                self._auth_error = f"etcd at {self._endpoints} refused user {auth.user!r}: {exc.details()}"
                log.error("%s (check etcd_auth.user and etcd_auth.password_file)", self._auth_error)
                self._answered.set()
            else:
                self._token.value, self._auth_error, backoff = reply.token, "", _RETRY_MIN_S
            self._answered.set()
            self._renew.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._renew.wait(), _TOKEN_RENEW_S)

    async def close(self) -> None:
        for task in list(self._refreshers):
            task.cancel()
        self._refreshers.clear()
        channel, self._channel, self._kv, self._lease = self._channel, None, None, None
        if channel is not None:
            await channel.close()

    async def __aenter__(self) -> EtcdStore:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # --- errors ------------------------------------------------------------------------------------

    def _unavailable(self, detail: str) -> errors.Unavailable:
        return errors.Unavailable(
            f"etcd at {self._endpoints} is unreachable ({detail}); is it running? set MCP_ETCD_ENDPOINTS"
        )

    def _map(self, exc: BaseException) -> Exception:
        """The ``MCPError`` for a grpc/etcd3aio failure (the one place statuses are translated)."""
        rpc = exc if isinstance(exc, grpc.aio.AioRpcError) else exc.__cause__
        if isinstance(rpc, grpc.aio.AioRpcError):
            code, detail = rpc.code(), rpc.details() or ""
            if any(s in detail for s in _NOT_AUTHENTICATED):
                return self._not_authenticated(detail)
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return self._unavailable(f"{code.name}: {detail}")
            if code == grpc.StatusCode.UNAUTHENTICATED:
                code = grpc.StatusCode.PERMISSION_DENIED
            return grpc_status.error_for_status(code, f"etcd at {self._endpoints}: {detail or code.name}")
        if isinstance(exc, TimeoutError):
            return self._unavailable(f"no answer within the {self._timeout:g} s deadline")
        return errors.Internal(f"etcd at {self._endpoints}: {exc}")

    def _not_authenticated(self, detail: str) -> errors.MCPError:
        if self._auth_error:
            return errors.PermissionDenied(self._auth_error)
        if self._auth is None or not self._auth.user:
            return errors.PermissionDenied(
                f"etcd at {self._endpoints} requires authentication ({detail}): set this service's "
                "etcd_auth.user, etcd_auth.password_file and etcd_auth.ca_file"
            )
        self._renew.set()  # an expired or not yet issued token: renew it, and the caller retries
        return errors.Unavailable(
            f"etcd at {self._endpoints}: the token of user {self._auth.user!r} is not valid yet or any more "
            f"({detail}); renewing it"
        )

    @contextlib.contextmanager
    def _calling(self) -> Iterator[None]:
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

    def _services(self) -> tuple[KVService, LeaseService, grpc.aio.Channel]:
        if self._kv is None or self._lease is None or self._channel is None:
            raise errors.FailedPrecondition("EtcdStore is not connected: call connect() or use 'async with'")
        return self._kv, self._lease, self._channel

    # --- KV ----------------------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        kv, _, _ = self._services()
        with self._calling():
            resp = await kv.get(_b(key), timeout=self._timeout, max_attempts=_TRIES)
        return _key_value(resp.kvs[0]) if resp.kvs else None

    async def get_prefix(self, prefix: str) -> Range:
        kv, _, _ = self._services()
        raw = _b(prefix)
        end = prefix_range_end(raw)
        with self._calling():  # etcd returns a range sorted by key
            resp = await kv.get(raw, end, timeout=self._timeout, max_attempts=_TRIES)
        return Range(tuple(_key_value(item) for item in resp.kvs), resp.header.revision)

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        kv, _, _ = self._services()
        with self._calling():
            resp = await kv.put(_b(key), _b(value), lease, timeout=self._timeout)
        return resp.header.revision

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        kv, _, _ = self._services()
        raw = _b(key)
        with self._calling():
            resp = await kv.delete(raw, prefix_range_end(raw) if prefix else None, timeout=self._timeout)
        return resp.deleted

    async def txn(self, compares: Sequence[StoreCompare], on_success: Sequence[Put | Delete]) -> TxnResult:
        kv, _, _ = self._services()
        checks = [
            PbCompare(
                key=_b(c.key),
                target=PbCompare.CompareTarget.MOD,
                result=PbCompare.CompareResult.EQUAL,
                mod_revision=c.mod_revision,
            )
            for c in compares
        ]
        with self._calling():
            resp = await kv.txn(checks, [_request_op(op) for op in on_success], timeout=self._timeout)
        return TxnResult(resp.succeeded, resp.header.revision)

    async def ping(self) -> int:
        kv, _, _ = self._services()
        with self._calling():
            # A linearizable read: it also proves the cluster has a leader, not just that a member is up.
            resp = await kv.get(b"\0", count_only=True, timeout=self._timeout, max_attempts=_TRIES)
        return resp.header.revision

    # --- leases ------------------------------------------------------------------------------------

    async def grant_lease(self, ttl: int) -> Lease:
        if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1:
            raise errors.InvalidArgument(f"lease ttl must be a whole number of seconds >= 1, got {ttl!r}")
        _, lease, _ = self._services()
        with self._calling():
            resp = await lease.grant(ttl, timeout=self._timeout)
        return Lease(resp.ID, resp.TTL)

    async def refresh_lease(self, lease_id: int) -> int:
        return await self._refresh(lease_id, self._timeout)

    async def _refresh(self, lease_id: int, deadline_s: float) -> int:
        """One keep-alive round trip on its own short stream (etcd has no unary renew)."""
        _, _, channel = self._services()
        request = LeaseKeepAliveRequest(ID=lease_id)
        call = LeaseStub(channel).LeaseKeepAlive(iter([request]), timeout=deadline_s)
        try:
            with self._calling():
                resp = await call.read()  # raises the call's status on failure
        finally:
            call.cancel()
        if resp is grpc.aio.EOF:
            raise self._unavailable("etcd closed the keep-alive stream without an answer")
        if resp.TTL <= 0:
            raise errors.NotFound(f"lease {lease_id} has expired")
        return resp.TTL

    async def revoke_lease(self, lease_id: int) -> None:
        _, lease, _ = self._services()
        try:
            with self._calling():
                await lease.revoke(lease_id, timeout=self._timeout, max_attempts=_TRIES)
        except errors.NotFound:
            pass  # already expired or revoked: revoking is idempotent

    def keep_alive(self, lease: Lease) -> KeepAlive:
        self._services()
        handle = KeepAlive(lease)
        handle.task = asyncio.create_task(self._refresh_loop(handle), name=f"etcd-keepalive-{lease.id:x}")
        self._refreshers.add(handle.task)
        handle.task.add_done_callback(self._refreshers.discard)
        return handle

    async def _refresh_loop(self, handle: KeepAlive) -> None:
        lease_id, ttl = handle.lease.id, handle.lease.ttl
        expires = time.monotonic() + ttl  # at best: the lease may have been granted a while ago
        wait, failing = ttl / 3, False
        while True:
            await asyncio.sleep(wait)
            sent = time.monotonic()
            try:
                left = await self._refresh(lease_id, min(self._timeout, max(expires - sent, 0.1)))
            except errors.NotFound:
                log.warning("lease %x is gone (expired or revoked)", lease_id)
                handle.lost.set()
                return
            except Exception as exc:  # a background loop: log and retry while the lease may live
                if time.monotonic() >= expires:
                    log.error("lease %x lost: no refresh within its %d s TTL (%s)", lease_id, ttl, exc)
                    handle.lost.set()
                    return
                unexpected = not isinstance(exc, errors.MCPError)
                level = logging.WARNING if unexpected or not failing else logging.DEBUG
                log.log(level, "lease %x: refresh failed, retrying: %s", lease_id, exc, exc_info=unexpected)
                remaining = expires - time.monotonic()
                wait, failing = max(0.02, min(_RETRY_MAX_S, ttl / 3, remaining / 2)), True
                continue
            if failing:
                log.info("lease %x: refreshed again (%d s left)", lease_id, left)
            expires, wait, failing = sent + left, ttl / 3, False

    # --- watch -------------------------------------------------------------------------------------

    async def watch_prefix(self, prefix: str, *, start_revision: int = 0) -> AsyncIterator[list[WatchEvent]]:
        """See ``Store``. Retries for as long as etcd is unreachable (logging once per outage); raises
        ``WatchCompacted``, or an ``MCPError`` for a failure that retrying cannot mend."""
        next_rev = start_revision  # the first revision not yet yielded; 0 until "now" is pinned
        backoff, failing = _RETRY_MIN_S, False
        while True:
            call: grpc.aio.StreamStreamCall | None = None
            try:
                if next_rev == 0:
                    next_rev = await self.ping() + 1  # pin "now", so a reconnect cannot skip ahead
                call, resp = await self._open_watch(prefix, next_rev)
                if resp.header.revision < next_rev - 1 and await self.ping() < next_rev - 1:
                    # behind what was yielded, and so is a linearizable read (not only a member that lags
                    # a few milliseconds behind the one an earlier call reached): restored, or emptied
                    raise StoreRewound(resp.header.revision, next_rev - 1)
                if failing:
                    log.info("watch on %r resumed at revision %d", prefix, next_rev)
                backoff, failing = _RETRY_MIN_S, False
                while True:
                    events = self._events(prefix, resp, next_rev, self._not_authenticated)
                    if events:
                        next_rev = events[-1].mod_revision + 1
                        yield events
                    resp = await self._read(call)
            except errors.MCPError as exc:
                if not (exc.retryable or grpc_status.to_grpc(exc.code) in _TRANSIENT):
                    raise
                level = logging.DEBUG if failing else logging.WARNING
                log.log(level, "watch on %r interrupted, resuming at revision %d: %s", prefix, next_rev, exc)
                failing = True
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _RETRY_MAX_S)
            finally:
                if call is not None:
                    call.cancel()

    async def _open_watch(self, prefix: str, start: int) -> tuple[grpc.aio.StreamStreamCall, WatchResponse]:
        """A watch stream from ``start`` and its first response (etcd's "created"), within the deadline."""
        _, _, channel = self._services()
        raw = _b(prefix)
        create = WatchCreateRequest(
            key=raw, range_end=prefix_range_end(raw), start_revision=start, prev_kv=True
        )
        # etcd's require-leader (clientv3.WithRequireLeader): a member cut off from its peers closes the
        # stream ("no leader", UNAVAILABLE) instead of keeping it open and silent; the watch resumes elsewhere
        call = WatchStub(channel).Watch(metadata=_REQUIRE_LEADER)
        try:
            with self._calling():
                with contextlib.suppress(asyncio.InvalidStateError):  # the call failed: read() says why
                    await call.write(WatchRequest(create_request=create))
                async with asyncio.timeout(self._timeout):
                    return call, await self._read(call)
        except BaseException:
            call.cancel()
            raise

    async def _read(self, call: grpc.aio.StreamStreamCall) -> WatchResponse:
        with self._calling():
            resp = await call.read()
        if resp is grpc.aio.EOF:
            raise self._unavailable("etcd closed the watch stream")
        return resp

    @staticmethod
    def _events(
        prefix: str, resp: WatchResponse, next_rev: int, not_authenticated: Callable[[str], Exception]
    ) -> list[WatchEvent]:
        if resp.compact_revision > 0:
            raise WatchCompacted(resp.compact_revision)
        if resp.canceled:
            reason = resp.cancel_reason or "no reason given"
            if any(s in reason for s in _NOT_AUTHENTICATED):  # a token etcd forgot (it restarted): renew
                raise not_authenticated(reason)
            raise errors.FailedPrecondition(f"etcd cancelled the watch on {prefix!r}: {reason}")
        # Defensive: a resumed stream starts at next_rev, so nothing older should ever come back.
        return [_watch_event(ev) for ev in resp.events if ev.kv.mod_revision >= next_rev]


def _key_value(kv: Any) -> KeyValue:  # an mvccpb.KeyValue
    return KeyValue(_s(kv.key), kv.value, kv.mod_revision, kv.create_revision, kv.version, kv.lease)


def _watch_event(ev: Any) -> WatchEvent:  # an mvccpb.Event
    is_delete = ev.type == kv_pb2.Event.DELETE
    return WatchEvent(
        type=EventType.DELETE if is_delete else EventType.PUT,
        key=_s(ev.kv.key),
        value=b"" if is_delete else ev.kv.value,
        mod_revision=ev.kv.mod_revision,
        prev_value=ev.prev_kv.value if ev.HasField("prev_kv") else None,
    )


def _request_op(op: Put | Delete) -> RequestOp:
    if isinstance(op, Put):
        return RequestOp(request_put=PutRequest(key=_b(op.key), value=_b(op.value), lease=op.lease))
    raw = _b(op.key)
    end = prefix_range_end(raw) if op.prefix else b""
    return RequestOp(request_delete_range=DeleteRangeRequest(key=raw, range_end=end))
