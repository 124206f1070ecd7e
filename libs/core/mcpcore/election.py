"""Leader election over the ``Store``: one key, created only if absent, under the winner's lease.

The scheduler and the health service (``Keyspace.leader(role)``) run several copies; exactly one of each
acts. This module imports only ``mcpcore``: it works over any ``Store`` (etcd, or a unit-test fake).

Invariants:
1. Winning is ``txn([Compare(key, 0)], [Put(key, candidate, lease)])``: etcd serialises transactions, so
   while the key exists no other create succeeds, and the key lives exactly as long as the winner's lease
   (or until the winner deletes it by revoking the lease).
2. A leader believes it leads only while it knows its lease is alive. It measures the lease's life from
   when it *sent* the grant or the last successful refresh (etcd counts from later), keeps a margin, and
   steps down when that local deadline passes without a refresh, even if etcd cannot be reached. So a
   leader cut off from etcd stops believing before etcd can expire its key and hand it to another (as
   long as clocks run at rates within the margin of each other).
3. A leader also watches its own key: any change to it (an outside revoke or delete, an overwrite) makes
   it step down at once. A lost lease (refresh answered NotFound) does too.
4. Stepping down flips ``is_leader`` to False first, synchronously, before any await; only then is the
   lease revoked (its key goes, so a successor can start at once) and ``on_change(False)`` called.
   ``resign()`` keeps the same order, so no candidate still believes it leads once its key is gone.
5. ``on_change(True)`` and ``on_change(False)`` strictly alternate, starting with True, one at a time;
   a False always follows a True, also after ``resign()``/``stop()``. A failing callback is logged and
   counted; it never stops the election. Do not ``await`` ``resign()``/``stop()`` inside the callback.
6. The campaign loop never dies: every error is logged, counted through ``on_error(loop_name)`` and
   retried after a jittered exponential backoff that resets once a round ends normally, so no error can
   make it spin. A deposed leader pauses briefly before campaigning again, so a healthy standby, not a
   flapping leader, takes over.
7. Fencing: ``leader_revision`` is the leader key's mod revision as won, and ``fence()`` the token made of
   it (``mcpcore.fencing``). A write that must never come from a deposed leader adds ``fence().compare()``
   to its transaction; etcd then rejects it once this candidate's key is gone, whatever this process
   believes. Control calls to workers carry ``fence().metadata()``.

``leader`` is the leader's candidate id as last seen (None when unknown or no one leads). It can equal
``candidate`` while ``is_leader`` is False: a previous incarnation's key, waiting for its lease to expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable
from types import TracebackType

from mcpcore import errors
from mcpcore.fencing import Fence
from mcpcore.store import Compare, EventType, KeyValue, Lease, Put, Store

__all__ = ["LeaderElection"]

log = logging.getLogger(__name__)

_BACKOFF_MIN_S, _BACKOFF_MAX_S = 0.05, 2.0  # campaign retries after errors (jittered)
_REFRESH_RETRY_MAX_S = 0.25  # between failed refreshes, while the lease may still live
_MARGIN_FRACTION, _MARGIN_MAX_S = 0.2, 0.5  # a leader steps down this much before its lease can expire
_DEPOSED_PAUSE_MAX_S = 1.0  # a deposed leader waits up to this (and <= TTL/2) before campaigning again

OnChange = Callable[[bool], Awaitable[None] | None]


class LeaderElection:
    """Campaign for ``key`` as ``candidate`` until ``resign()`` or ``stop()``. See the module invariants."""

    def __init__(
        self,
        store: Store,
        key: str,
        candidate: str,
        *,
        ttl: int = 5,
        on_change: OnChange | None = None,
        on_error: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1:
            raise errors.InvalidArgument(f"election ttl must be a whole number of seconds >= 1, got {ttl!r}")
        if not key or not candidate:
            raise errors.InvalidArgument(f"election needs a key and a candidate, got {key!r}, {candidate!r}")
        self._store = store
        self.key = key
        self.candidate = candidate
        self.ttl = ttl
        self._on_change = on_change
        self._on_error = on_error
        self._clock = clock
        self._leading = asyncio.Event()  # set exactly while this candidate leads: is_leader
        self._announced = False  # on_change(True) was sent and no on_change(False) yet
        self._lease: Lease | None = None  # the lease of the current round, until revoked
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.leader: str | None = None
        self.leader_revision: int | None = None

    @property
    def is_leader(self) -> bool:
        return self._leading.is_set()

    def fence(self) -> Fence:
        """This leader's fencing token; ``FailedPrecondition`` once it does not lead."""
        revision = self.leader_revision
        if not self.is_leader or revision is None:
            raise errors.FailedPrecondition(f"{self.candidate} does not lead {self.key!r}: not acting")
        return Fence(self.key.rstrip("/").rpartition("/")[2], self.key, revision)

    # --- public control ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start campaigning in the background (again, after ``resign()``). Returns at once."""
        if self._closed:
            raise errors.FailedPrecondition(f"election for {self.key!r} was stopped; make a new one")
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"election {self.key} {self.candidate}")

    async def resign(self) -> None:
        """Step down if leading and stop campaigning; the lease is revoked, so the key goes at once."""
        if self._task is not None and self._task is asyncio.current_task():
            raise errors.FailedPrecondition("resign()/stop() cannot be awaited inside on_change")
        task, self._task = self._task, None
        self._step_down_now("resigned", level=logging.INFO)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._release_lease()
        if self._announced:
            await self._notify(False)

    async def stop(self) -> None:
        """``resign()`` for good: no task is left behind and ``start()`` is refused afterwards."""
        self._closed = True
        await self.resign()

    async def __aenter__(self) -> LeaderElection:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # --- the campaign --------------------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = _BACKOFF_MIN_S
        while True:
            try:
                deposed = await self._round()
            except Exception as exc:  # a background loop: log, count, back off, go on
                self._error("campaign", exc)
                await asyncio.sleep(random.uniform(backoff / 2, backoff))
                backoff = min(backoff * 2, _BACKOFF_MAX_S)
                continue
            backoff = _BACKOFF_MIN_S
            if deposed:
                await asyncio.sleep(random.uniform(0.5, 1.0) * min(_DEPOSED_PAUSE_MAX_S, self.ttl / 2))

    async def _round(self) -> bool:
        """One try: lead until deposed (returns True), or follow until the key goes (returns False)."""
        granted_at = self._clock()  # before sending: etcd starts the TTL later than this
        lease = self._lease = await self._store.grant_lease(self.ttl)
        try:
            result = await self._store.txn(
                [Compare(self.key, 0)], [Put(self.key, self.candidate.encode(), lease.id)]
            )
        except Exception:
            # The create may have been applied with its reply lost: revoking removes the key either way.
            await self._release_lease()
            raise
        if result.succeeded:
            await self._lead(lease, granted_at, result.revision)
            return True
        await self._release_lease()  # it holds nothing; the next round grants a fresh one
        await self._follow()
        return False

    async def _lead(self, lease: Lease, granted_at: float, revision: int) -> None:
        self.leader, self.leader_revision = self.candidate, revision
        self._leading.set()
        log.info("%s leads %r (lease %x, revision %d)", self.candidate, self.key, lease.id, revision)
        guards = [
            asyncio.create_task(self._keep_lease(lease, granted_at), name=f"election refresh {self.key}"),
            asyncio.create_task(self._watch_own_key(revision), name=f"election watch {self.key}"),
        ]
        try:
            await self._notify(True)
            done, _ = await asyncio.wait(guards, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for guard in guards:
                guard.cancel()
            await asyncio.gather(*guards, return_exceptions=True)
        for guard in done:
            if not guard.cancelled() and guard.exception() is not None:
                self._error("leader guard", guard.exception())  # type: ignore[arg-type]
        self._step_down_now("leadership ended")
        await self._release_lease()
        await self._notify(False)

    async def _keep_lease(self, lease: Lease, granted_at: float) -> None:
        """Refresh ``lease`` until it is gone or its local deadline passes, then step down at once."""
        ttl, lease_hex = lease.ttl, f"{lease.id:x}"
        margin = min(_MARGIN_MAX_S, ttl * _MARGIN_FRACTION)
        valid_until, due = granted_at + ttl - margin, granted_at + ttl / 3
        while True:
            await asyncio.sleep(max(0.0, min(due, valid_until) - self._clock()))
            sent = self._clock()
            if sent >= valid_until:
                why = f"lease {lease_hex} not refreshed within its {ttl} s TTL"
                break
            try:
                async with asyncio.timeout(valid_until - sent):
                    left = await self._store.refresh_lease(lease.id)
            except errors.NotFound:
                why = f"lease {lease_hex} is gone (expired or revoked)"
                break
            except Exception as exc:  # Unavailable, or our own deadline (TimeoutError): retry soon
                self._error("refresh", exc)
                now = self._clock()
                due = now + min(_REFRESH_RETRY_MAX_S, max(valid_until - now, 0.0) / 2)
                continue
            valid_until, due = sent + left - margin, sent + ttl / 3
        self._step_down_now(why)

    async def _watch_own_key(self, revision: int) -> None:
        """Return (having stepped down) once the leader key changes in any way after ``revision``."""
        start, backoff = revision + 1, _BACKOFF_MIN_S
        while True:
            try:
                async with contextlib.aclosing(self._store.watch_prefix(self.key, start_revision=start)) as w:
                    async for batch in w:
                        for event in batch:
                            if event.key == self.key:
                                self._step_down_now(f"the leader key saw a {event.type.value}")
                                return
            except Exception as exc:  # the lease refresher still guards expiry meanwhile
                self._error("leader watch", exc)
            await asyncio.sleep(random.uniform(backoff / 2, backoff))
            backoff = min(backoff * 2, _BACKOFF_MAX_S)
            try:
                kv, now_revision = await self._read()
            except Exception as exc:
                self._error("leader watch", exc)
                continue
            if kv is None or kv.mod_revision != revision:
                self._step_down_now("the leader key changed while its watch was down")
                return
            start = now_revision + 1

    async def _follow(self) -> None:
        """Track the current leader until its key is deleted; a watch failure raises (re-campaign)."""
        kv, revision = await self._read()
        if kv is None:
            self.leader = None
            return  # deleted since our create failed: campaign again now
        self.leader = kv.value.decode("utf-8", "replace")
        log.info("%s follows %s for %r", self.candidate, self.leader, self.key)
        async with contextlib.aclosing(self._store.watch_prefix(self.key, start_revision=revision + 1)) as w:
            async for batch in w:
                for event in batch:
                    if event.key != self.key:
                        continue
                    if event.type is EventType.DELETE:
                        self.leader = None
                        return
                    self.leader = event.value.decode("utf-8", "replace")

    # --- helpers -------------------------------------------------------------------------------------

    async def _read(self) -> tuple[KeyValue | None, int]:
        """The leader key (or None) and the store revision it was read at."""
        found = await self._store.get_prefix(self.key)
        return next((kv for kv in found.items if kv.key == self.key), None), found.revision

    def _step_down_now(self, why: str, *, level: int = logging.WARNING) -> None:
        """Synchronous, so nothing can run between the decision and ``is_leader`` turning False."""
        if self._leading.is_set():
            log.log(level, "%s steps down as leader of %r: %s", self.candidate, self.key, why)
            self._leading.clear()
            self.leader = self.leader_revision = None

    async def _release_lease(self) -> None:
        lease, self._lease = self._lease, None
        if lease is None:
            return
        try:
            # Bounded: with etcd unreachable the lease expires by itself within its TTL anyway.
            async with asyncio.timeout(self.ttl):
                await self._store.revoke_lease(lease.id)
        except Exception as exc:
            self._error("revoke", exc)

    async def _notify(self, leading: bool) -> None:
        self._announced = leading
        if self._on_change is None:
            return
        try:
            result = self._on_change(leading)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            self._error("on_change", exc)

    def _error(self, what: str, exc: BaseException) -> None:
        expected = isinstance(exc, errors.MCPError | TimeoutError)
        log.warning(
            "election %r (%s): %s failed: %s", self.key, self.candidate, what, exc, exc_info=not expected
        )
        if self._on_error is not None:
            try:
                self._on_error(f"election.{what.replace(' ', '_')}")
            except Exception:
                log.exception("election %r: on_error callback failed", self.key)
