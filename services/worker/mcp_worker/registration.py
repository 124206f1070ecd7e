"""Registration and heartbeats: the worker's record and load report in etcd, under its lease.

Invariants:
- ``/mcp/workers/<id>`` and ``/mcp/workers/<id>/load`` live under one lease: when the worker dies, both
  vanish within the TTL. Both are written through their ``mcpcore.records`` types (``WorkerRecord``,
  ``LoadReport``), so the worker never writes a document its readers would refuse.
- The record carries the process's incarnation (a fresh id per start) and is written by compare: created
  when absent, else taken over at the revision just read (a record left by an earlier process under the
  same id, or by this one before its lease was lost). The worker record, its load report and the real
  state of every replica it holds go in one transaction, so watchers see them come back together and
  a decision planned from the records before it (a scheduler forgetting "a dead worker's" replicas)
  fails its compare.
- A load report goes out every ``interval``; the interval is kept at least 3x the mean inference time
  (DESIGN.md section 8: a heartbeat must not be starved by one long inference): when measured inference
  gets slower, the interval is raised, with a warning.
- Losing etcd never stops serving. When the lease is lost (expired while etcd was away, or revoked), the
  loop registers again as soon as etcd answers, with the replicas it really holds. So it does when etcd
  went back in revisions (a heartbeat's write lands at a revision below one seen before: etcd was
  restored from a snapshot, which may hold an older record and older replica states under a lease that
  is still alive).
- The loop never dies: each failure is logged, counted, and retried after a backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from mcpcore.errors import FailedPrecondition, InvalidArgument, MCPError
from mcpcore.keys import Keyspace
from mcpcore.lifecycle import Resync
from mcpcore.records import LoadReport, WorkerRecord
from mcpcore.store import Compare, KeepAlive, Put, Store

__all__ = ["Registration", "effective_interval"]

log = logging.getLogger(__name__)
_TRIES = 5  # a registration whose compares keep failing gives up for this heartbeat and tries again
_TXN_REPLICAS = 100  # etcd takes 128 operations per transaction by default


def effective_interval(configured_s: float, mean_exec_s: float, ttl_s: float) -> float:
    """The heartbeat interval actually used: >= 3x mean inference time, and below the lease TTL."""
    return min(max(configured_s, 3.0 * mean_exec_s), ttl_s / 2)


class Registration:
    def __init__(
        self,
        store: Store,
        keys: Keyspace,
        worker_id: str,
        *,
        record: Callable[[], Mapping[str, Any]],
        report: Callable[[], Mapping[str, Any]],
        resync_ops: Callable[[], Awaitable[list[Resync]]],
        resynced: Callable[[list[Resync], int], None],
        ttl: int,
        interval_s: float,
        on_error: Callable[[str], None] = lambda loop: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._keys = keys
        self._id = worker_id
        self._record = record
        self._report = report
        self._resync_ops = resync_ops
        self._resynced = resynced
        self._ttl = ttl
        self._configured = interval_s
        self.interval_s = interval_s
        self._on_error = on_error
        self._clock = clock
        self._keeper: KeepAlive | None = None
        self._record_revision = 0
        self._seen_revision = 0  # the highest store revision a write of ours landed at
        self._rewound = False
        self._task: asyncio.Task[None] | None = None
        self.registrations = 0  # how many times the worker (re-)registered
        self.registered = asyncio.Event()

    async def register(self) -> None:
        """Grant a lease and write the record, a first report and the held replicas' real states in one
        transaction (a replica record naming a worker that is not registered would look dead)."""
        lease = await self._store.grant_lease(self._ttl)
        try:
            previous = await self._commit(lease.id)
        except BaseException:
            with contextlib.suppress(MCPError):
                await self._store.revoke_lease(lease.id)
            raise
        if self._keeper is not None:
            await self._keeper.stop()
        self._keeper = self._store.keep_alive(lease)
        if previous and previous != lease.id:  # its keys are ours now; nothing else lives under it
            with contextlib.suppress(MCPError):
                await self._store.revoke_lease(previous)
        self.registrations += 1
        self.registered.set()
        log.info("worker %s registered (lease %x, registration %d)", self._id, lease.id, self.registrations)

    async def _commit(self, lease_id: int) -> int:
        """The registration transaction; returns the lease of the record it replaced (0: none)."""
        key = self._keys.worker(self._id)
        for _ in range(_TRIES):
            current = await self._store.get(key)
            if current is not None:
                self._took_over(current.value)
            writes = await self._resync_ops()
            first, rest = writes[:_TXN_REPLICAS], writes[_TXN_REPLICAS:]
            result = await self._store.txn(
                [Compare(key, current.mod_revision if current else 0), *(w.compare for w in first)],
                [
                    Put(key, self._record_json(), lease_id),
                    Put(self._keys.worker_load(self._id), self._report_json(), lease_id),
                    *(w.put for w in first),
                ],
            )
            if not result.succeeded:
                continue  # someone wrote the record or a replica meanwhile: read again
            self._record_revision = self._seen_revision = result.revision
            self._rewound = False
            self._resynced(first, result.revision)
            await self._commit_rest(rest)
            return current.lease if current is not None else 0
        raise FailedPrecondition(f"worker {self._id}: could not register; its records keep changing")

    async def _commit_rest(self, writes: list[Resync]) -> None:
        """Replicas past the first transaction's room, in more transactions (each re-read and tried again
        while someone else wrote in between)."""
        for start in range(0, len(writes), _TXN_REPLICAS):
            chunk = writes[start : start + _TXN_REPLICAS]
            for _ in range(_TRIES):
                done = await self._store.txn([w.compare for w in chunk], [w.put for w in chunk])
                if done.succeeded:
                    self._resynced(chunk, done.revision)
                    break
                rids = {w.rid for w in chunk}
                chunk = [w for w in await self._resync_ops() if w.rid in rids]
            else:
                log.warning("worker %s: %d replica records could not be re-synced", self._id, len(chunk))

    def _took_over(self, raw: bytes) -> None:
        try:
            incarnation = WorkerRecord.parse(self._keys.worker(self._id), raw).incarnation
        except InvalidArgument:
            incarnation = ""
        mine = self._record().get("incarnation", "")
        if incarnation != mine:
            log.warning(
                "worker id %s was registered by incarnation %r; this process (%r) takes it over",
                self._id, incarnation or "?", mine,
            )  # fmt: skip

    async def update_record(self) -> bool:
        """Write the record again (its draining flag changed), if this process still holds it."""
        if self._keeper is None or self._keeper.lost.is_set():
            return False
        key = self._keys.worker(self._id)
        result = await self._store.txn(
            [Compare(key, self._record_revision)], [Put(key, self._record_json(), self._keeper.lease.id)]
        )
        if result.succeeded:
            self._record_revision = result.revision
            self._seen_revision = max(self._seen_revision, result.revision)
        return result.succeeded

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="worker-heartbeat")

    async def stop(self, *, deregister: bool = True) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._keeper is not None:
            await self._keeper.stop()
            if deregister:
                with contextlib.suppress(MCPError):
                    await self._store.revoke_lease(self._keeper.lease.id)

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            try:
                if self._keeper is None or self._keeper.lost.is_set() or self._rewound:
                    if self._rewound:
                        log.warning("worker %s: etcd went back in revisions; registering again", self._id)
                    elif self._keeper is not None:
                        log.warning("worker %s lost its lease; registering again", self._id)
                    await self.register()
                await self._publish(self._keeper.lease.id)  # type: ignore[union-attr]
                backoff = 0.1
                if self._rewound:
                    continue  # register again now, not after a heartbeat interval
                await self._sleep_or_lost(self.interval_s * random.uniform(0.9, 1.0))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._on_error("heartbeat")
                log.warning("heartbeat of worker %s failed (%s); retrying in %.1fs", self._id, exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, max(1.0, self._ttl / 3))

    async def _sleep_or_lost(self, seconds: float) -> None:
        assert self._keeper is not None
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that races a wake-up
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._keeper.lost.wait()

    async def _publish(self, lease_id: int) -> None:
        key = self._keys.worker_load(self._id)
        revision = await self._store.put(key, self._report_json(), lease=lease_id)
        if revision < self._seen_revision:
            self._rewound = True  # the loop registers again at once
            return
        self._seen_revision = revision

    def _record_json(self) -> bytes:
        return WorkerRecord.parse(self._keys.worker(self._id), self._record()).to_json()

    def _report_json(self) -> bytes:
        return LoadReport.parse(self._keys.worker_load(self._id), self._stamped()).to_json()

    def _stamped(self) -> dict[str, Any]:
        """The load report with the heartbeat interval in force (raised to 3x mean inference time)."""
        report = dict(self._report())
        interval = effective_interval(self._configured, float(report.get("mean_exec_s", 0.0)), self._ttl)
        if interval > self.interval_s * 1.01:
            log.warning(
                "heartbeat interval raised from %.3fs to %.3fs: it must be at least 3x the mean inference "
                "time (%.3fs)",
                self.interval_s,
                interval,
                report.get("mean_exec_s", 0.0),
            )
        self.interval_s = interval
        report.update(heartbeat_interval_s=interval, last_beat=self._clock())
        return report
