"""Lease renewal over an ``EtcdConnection``: one keep-alive round trip (``refresh``), and the background
refresher behind ``EtcdStore.keep_alive`` (``keep_alive_loop``).

Invariants:
- etcd has no unary renew: each refresh is one request on its own short keep-alive stream, cancelled
  once answered, with its own deadline.
- A lease etcd reports gone (TTL <= 0) is ``errors.NotFound``; the refresher then sets ``lost`` and stops.
- The refresher renews every third of the TTL; while refreshes fail it retries, logging (once per
  outage at warning, an unexpected error always with its traceback), and sets ``lost`` only once it could
  not reach etcd for a whole TTL since the last confirmed expiry. It never dies silently.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc.aio
from etcd3aio._protobuf import LeaseKeepAliveRequest, LeaseStub

from mcpcore import errors
from mcpcore.etcd_connection import RETRY_MAX_S, EtcdConnection
from mcpcore.store import KeepAlive

__all__ = ["keep_alive_loop", "refresh"]

log = logging.getLogger(__name__)


async def refresh(conn: EtcdConnection, lease_id: int, deadline_s: float) -> int:
    """One keep-alive round trip on its own short stream (etcd has no unary renew); the TTL left."""
    _, _, channel = conn.services()
    request = LeaseKeepAliveRequest(ID=lease_id)
    call = LeaseStub(channel).LeaseKeepAlive(iter([request]), timeout=deadline_s)
    try:
        with conn.calling():
            resp = await call.read()  # raises the call's status on failure
    finally:
        call.cancel()
    if resp is grpc.aio.EOF:
        raise conn.unavailable("etcd closed the keep-alive stream without an answer")
    if resp.TTL <= 0:
        raise errors.NotFound(f"lease {lease_id} has expired")
    return resp.TTL


async def keep_alive_loop(conn: EtcdConnection, handle: KeepAlive) -> None:
    lease_id, ttl = handle.lease.id, handle.lease.ttl
    expires = time.monotonic() + ttl  # at best: the lease may have been granted a while ago
    wait, failing = ttl / 3, False
    while True:
        await asyncio.sleep(wait)
        sent = time.monotonic()
        try:
            left = await refresh(conn, lease_id, min(conn.timeout, max(expires - sent, 0.1)))
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
            wait, failing = max(0.02, min(RETRY_MAX_S, ttl / 3, remaining / 2)), True
            continue
        if failing:
            log.info("lease %x: refreshed again (%d s left)", lease_id, left)
        expires, wait, failing = sent + left, ttl / 3, False
