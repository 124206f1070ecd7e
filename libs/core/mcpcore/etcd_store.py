"""``EtcdStore``: the ``Store`` interface over a real etcd v3 cluster (gRPC, asyncio), and its reads, writes
and transactions.

Built on ``etcd3aio`` (its generated etcd protobufs, stubs and KV/lease facades) over a gRPC channel that
``mcpcore.etcd_connection`` owns; leases are renewed by ``mcpcore.etcd_leases``, prefixes watched by
``mcpcore.etcd_watch``, and ``mcpcore.etcd_auth`` holds the TLS and password settings (``EtcdAuth``, also
importable from here). Why etcd3aio: PyPI ``etcd3`` 0.12 fails to import with protobuf 7, and its
pure-Python protobuf workaround slows every message 11-160x; etcd3aio passed put/get, prefix, lease expiry,
watch, CAS and watch resume across an etcd restart, while ``aetcd`` drops the watch on restart. The choice
is hidden behind ``Store``: nothing outside the ``mcpcore.etcd_*`` modules imports etcd3aio.

Invariants:
- No grpc or etcd3aio exception leaves this class (every call runs in ``EtcdConnection.calling``).
- Every unary call has a deadline (``timeout``). Only idempotent calls (reads, lease revoke) are retried;
  writes and transactions are sent once, so a lost reply never turns a won compare into a "lost race"
  (a write that failed ``Unavailable`` may still have been applied: re-read before writing again).
- Compares are on mod revision (etcd target MOD); a missing key has mod revision 0.
- Security (``EtcdAuth``): TLS to etcd (its CA; a client certificate where etcd asks for one), and etcd's
  username/password auth. Until the first token, calls fail ``Unavailable`` (callers retry as for an
  unreachable etcd); a refused password is ``PermissionDenied`` on every call, saying which user.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any

from etcd3aio import prefix_range_end
from etcd3aio._protobuf import Compare as PbCompare
from etcd3aio._protobuf import DeleteRangeRequest, PutRequest, RequestOp

from mcpcore import errors
from mcpcore.etcd_auth import EtcdAuth
from mcpcore.etcd_connection import TRIES, EtcdConnection, decode, encode
from mcpcore.etcd_leases import keep_alive_loop, refresh
from mcpcore.etcd_watch import watch_prefix
from mcpcore.store import Compare as StoreCompare
from mcpcore.store import (
    Delete,
    KeepAlive,
    KeyValue,
    Lease,
    Put,
    Range,
    Store,
    TxnResult,
    WatchEvent,
)

__all__ = ["EtcdAuth", "EtcdStore"]


class EtcdStore(Store):
    """``Store`` over etcd. Use ``async with EtcdStore([...]) as store`` or ``connect()``/``close()``."""

    def __init__(
        self, endpoints: Sequence[str], *, timeout: float = 5.0, auth: EtcdAuth | None = None
    ) -> None:
        self._conn = EtcdConnection(endpoints, timeout=timeout, auth=auth)
        self._timeout = timeout

    async def connect(self) -> None:
        """Open the channel. Does not wait for etcd (with a user, at most ``timeout`` for its first token):
        calls fail with ``Unavailable`` until it answers."""
        await self._conn.open()

    async def close(self) -> None:
        await self._conn.close()

    async def __aenter__(self) -> EtcdStore:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # --- KV ----------------------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        kv, _, _ = self._conn.services()
        with self._conn.calling():
            resp = await kv.get(encode(key), timeout=self._timeout, max_attempts=TRIES)
        return _key_value(resp.kvs[0]) if resp.kvs else None

    async def get_prefix(self, prefix: str) -> Range:
        kv, _, _ = self._conn.services()
        raw = encode(prefix)
        end = prefix_range_end(raw)
        with self._conn.calling():  # etcd returns a range sorted by key
            resp = await kv.get(raw, end, timeout=self._timeout, max_attempts=TRIES)
        return Range(tuple(_key_value(item) for item in resp.kvs), resp.header.revision)

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        kv, _, _ = self._conn.services()
        with self._conn.calling():
            resp = await kv.put(encode(key), encode(value), lease, timeout=self._timeout)
        return resp.header.revision

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        kv, _, _ = self._conn.services()
        raw = encode(key)
        with self._conn.calling():
            resp = await kv.delete(raw, prefix_range_end(raw) if prefix else None, timeout=self._timeout)
        return resp.deleted

    async def txn(self, compares: Sequence[StoreCompare], on_success: Sequence[Put | Delete]) -> TxnResult:
        kv, _, _ = self._conn.services()
        checks = [
            PbCompare(
                key=encode(c.key),
                target=PbCompare.CompareTarget.MOD,
                result=PbCompare.CompareResult.EQUAL,
                mod_revision=c.mod_revision,
            )
            for c in compares
        ]
        with self._conn.calling():
            resp = await kv.txn(checks, [_request_op(op) for op in on_success], timeout=self._timeout)
        return TxnResult(resp.succeeded, resp.header.revision)

    async def ping(self) -> int:
        kv, _, _ = self._conn.services()
        with self._conn.calling():
            # A linearizable read: it also proves the cluster has a leader, not just that a member is up.
            resp = await kv.get(b"\0", count_only=True, timeout=self._timeout, max_attempts=TRIES)
        return resp.header.revision

    # --- leases ------------------------------------------------------------------------------------

    async def grant_lease(self, ttl: int) -> Lease:
        if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1:
            raise errors.InvalidArgument(f"lease ttl must be a whole number of seconds >= 1, got {ttl!r}")
        _, lease, _ = self._conn.services()
        with self._conn.calling():
            resp = await lease.grant(ttl, timeout=self._timeout)
        return Lease(resp.ID, resp.TTL)

    async def refresh_lease(self, lease_id: int) -> int:
        return await refresh(self._conn, lease_id, self._timeout)

    async def revoke_lease(self, lease_id: int) -> None:
        _, lease, _ = self._conn.services()
        try:
            with self._conn.calling():
                await lease.revoke(lease_id, timeout=self._timeout, max_attempts=TRIES)
        except errors.NotFound:
            pass  # already expired or revoked: revoking is idempotent

    def keep_alive(self, lease: Lease) -> KeepAlive:
        self._conn.services()
        handle = KeepAlive(lease)
        handle.task = self._conn.spawn(
            keep_alive_loop(self._conn, handle), name=f"etcd-keepalive-{lease.id:x}"
        )
        return handle

    # --- watch -------------------------------------------------------------------------------------

    def watch_prefix(self, prefix: str, *, start_revision: int = 0) -> AsyncIterator[list[WatchEvent]]:
        """See ``Store`` and ``mcpcore.etcd_watch``. Retries for as long as etcd is unreachable (logging once
        per outage); raises ``WatchCompacted``, or an ``MCPError`` for a failure that retrying cannot mend."""
        return watch_prefix(self._conn, prefix, start_revision, self.ping)


def _key_value(kv: Any) -> KeyValue:  # an mvccpb.KeyValue
    return KeyValue(decode(kv.key), kv.value, kv.mod_revision, kv.create_revision, kv.version, kv.lease)


def _request_op(op: Put | Delete) -> RequestOp:
    if isinstance(op, Put):
        return RequestOp(request_put=PutRequest(key=encode(op.key), value=encode(op.value), lease=op.lease))
    raw = encode(op.key)
    end = prefix_range_end(raw) if op.prefix else b""
    return RequestOp(request_delete_range=DeleteRangeRequest(key=raw, range_end=end))
