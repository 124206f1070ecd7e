"""Prefix watches over an ``EtcdConnection`` (``EtcdStore.watch_prefix``), resumed across reconnects.

Invariants:
- Every event after the start revision is yielded exactly once, in revision order: the watch tracks the
  last revision it *yielded* and resumes from the one after it, on its own stream (not etcd3aio's
  ``watch``, which resumes from the last response header: a created or progress response, or a catch-up
  batch cut at 1000 revisions, would make it skip events). etcd never splits one revision across
  responses, so resuming at last + 1 loses and repeats nothing. Started at revision 0, it first pins
  "now" (a linearizable read), so a reconnect cannot skip ahead.
- A (re)opened watch whose store is behind the last revision yielded, and a linearizable read too, raises
  ``StoreRewound`` (etcd would otherwise wait, silently, for a revision that a restored or emptied etcd
  reaches only much later, with other data); a member merely a little behind the others is not that.
  Compacted history raises ``WatchCompacted``.
- Watches require a leader: a member cut off from its peers ends them, and they resume on another member.
  A transient failure is retried with backoff for as long as it lasts (logged at warning once per outage);
  any other failure is raised as an ``MCPError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc.aio
from etcd3aio import prefix_range_end
from etcd3aio._protobuf import WatchCreateRequest, WatchRequest, WatchResponse, WatchStub, kv_pb2

from mcpcore import errors
from mcpcore.etcd_auth import says_not_authenticated
from mcpcore.etcd_connection import RETRY_MAX_S, RETRY_MIN_S, TRANSIENT, EtcdConnection, decode, encode
from mcpcore.store import EventType, StoreRewound, WatchCompacted, WatchEvent
from mcpcore.transport import grpc_status

__all__ = ["watch_prefix"]

log = logging.getLogger(__name__)

_REQUIRE_LEADER = (("hasleader", "true"),)


async def watch_prefix(
    conn: EtcdConnection, prefix: str, start_revision: int, ping: Callable[[], Awaitable[int]]
) -> AsyncIterator[list[WatchEvent]]:
    """Batches of events under ``prefix`` from ``start_revision`` (0: from now); ``ping`` is a linearizable
    read returning the store's revision."""
    next_rev = start_revision  # the first revision not yet yielded; 0 until "now" is pinned
    backoff, failing = RETRY_MIN_S, False
    while True:
        call: grpc.aio.StreamStreamCall | None = None
        try:
            if next_rev == 0:
                next_rev = await ping() + 1  # pin "now", so a reconnect cannot skip ahead
            call, resp = await _open(conn, prefix, next_rev)
            if resp.header.revision < next_rev - 1 and await ping() < next_rev - 1:
                # behind what was yielded, and so is a linearizable read (not only a member that lags
                # a few milliseconds behind the one an earlier call reached): restored, or emptied
                raise StoreRewound(resp.header.revision, next_rev - 1)
            if failing:
                log.info("watch on %r resumed at revision %d", prefix, next_rev)
            backoff, failing = RETRY_MIN_S, False
            while True:
                events = _events(conn, prefix, resp, next_rev)
                if events:
                    next_rev = events[-1].mod_revision + 1
                    yield events
                resp = await _read(conn, call)
        except errors.MCPError as exc:
            if not (exc.retryable or grpc_status.to_grpc(exc.code) in TRANSIENT):
                raise
            level = logging.DEBUG if failing else logging.WARNING
            log.log(level, "watch on %r interrupted, resuming at revision %d: %s", prefix, next_rev, exc)
            failing = True
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, RETRY_MAX_S)
        finally:
            if call is not None:
                call.cancel()


async def _open(
    conn: EtcdConnection, prefix: str, start: int
) -> tuple[grpc.aio.StreamStreamCall, WatchResponse]:
    """A watch stream from ``start`` and its first response (etcd's "created"), within the deadline."""
    _, _, channel = conn.services()
    raw = encode(prefix)
    create = WatchCreateRequest(key=raw, range_end=prefix_range_end(raw), start_revision=start, prev_kv=True)
    # etcd's require-leader (clientv3.WithRequireLeader): a member cut off from its peers closes the
    # stream ("no leader", UNAVAILABLE) instead of keeping it open and silent; the watch resumes elsewhere
    call = WatchStub(channel).Watch(metadata=_REQUIRE_LEADER)
    try:
        with conn.calling():
            with contextlib.suppress(asyncio.InvalidStateError):  # the call failed: read() says why
                await call.write(WatchRequest(create_request=create))
            async with asyncio.timeout(conn.timeout):
                return call, await _read(conn, call)
    except BaseException:
        call.cancel()
        raise


async def _read(conn: EtcdConnection, call: grpc.aio.StreamStreamCall) -> WatchResponse:
    with conn.calling():
        resp = await call.read()
    if resp is grpc.aio.EOF:
        raise conn.unavailable("etcd closed the watch stream")
    return resp


def _events(conn: EtcdConnection, prefix: str, resp: WatchResponse, next_rev: int) -> list[WatchEvent]:
    if resp.compact_revision > 0:
        raise WatchCompacted(resp.compact_revision)
    if resp.canceled:
        reason = resp.cancel_reason or "no reason given"
        if says_not_authenticated(reason):  # a token etcd forgot (it restarted): renew
            raise conn.not_authenticated(reason)
        raise errors.FailedPrecondition(f"etcd cancelled the watch on {prefix!r}: {reason}")
    # Defensive: a resumed stream starts at next_rev, so nothing older should ever come back.
    return [_watch_event(ev) for ev in resp.events if ev.kv.mod_revision >= next_rev]


def _watch_event(ev: Any) -> WatchEvent:  # an mvccpb.Event
    is_delete = ev.type == kv_pb2.Event.DELETE
    return WatchEvent(
        type=EventType.DELETE if is_delete else EventType.PUT,
        key=decode(ev.kv.key),
        value=b"" if is_delete else ev.kv.value,
        mod_revision=ev.kv.mod_revision,
        prev_value=ev.prev_kv.value if ev.HasField("prev_kv") else None,
    )
