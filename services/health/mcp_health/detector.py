"""Failure detection: dead workers (lease gone, or report too old) and sick ones (their models keep failing).

Invariants:
- A worker is dead when its lease-bound record disappears or its load reports stopped arriving while
  other workers' still arrive: report age is measured on this process's monotonic clock from the
  freshest report seen, never by comparing another host's wall clock; when no report at all arrived for
  ``report_timeout_s`` (etcd or the watch was away) nobody is judged by age until every worker has had a
  whole timeout to report again. Then every replica it
  held that is not already ERROR goes to ERROR by compare-and-swap, guarded by the worker's record:
  still absent (lease gone) or still the one seen (stale reports), so a worker that registered again
  meanwhile keeps its replicas. One WorkerDown alert names the worker, its replicas and its last active
  time. Recovery (placing the replicas elsewhere) is the scheduler's job.
- Many workers dying at once are handled concurrently (one task each), never one after another.
- A sick worker (backend faults in its reports, or a device error flag) gets one EmergencyStop through its
  control API; it then reports itself stopped and the scheduler moves its replicas away.
- Only the leader acts, fenced (``mcpcore.fencing``): its ERROR marks carry the leader key's compare and
  its EmergencyStop calls the token, so a deposed health leader changes nothing. Every instance keeps its
  view current so a new leader acts at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from mcp_health.alerts import Alert, Alerter
from mcpapi.v2 import worker_pb2, worker_pb2_grpc
from mcpcore.errors import FailedPrecondition, InvalidArgument, MCPError
from mcpcore.fencing import Fence
from mcpcore.keys import Keyspace, ReplicaId
from mcpcore.lifecycle import ReplicaLifecycle, ReplicaState
from mcpcore.mirror import PrefixMirror
from mcpcore.records import LoadReport, ReplicaRecord, WorkerRecord
from mcpcore.store import Compare
from mcpcore.tls import TLSConfig, aio_channel

__all__ = ["Detector", "WorkerSeen"]

log = logging.getLogger(__name__)


@dataclass
class WorkerSeen:
    id: str
    grpc: str = ""
    alive: bool = True
    last_beat: float = 0.0
    last_active: float = 0.0
    queue_depth: int = 0
    errors_total: int = 0
    errors_checked: int | None = None  # errors_total at the last check
    stopped: str = ""
    device_error: str = ""
    emergency_sent: bool = False
    seen_at: float = field(default_factory=time.time)
    arrived: float = field(default_factory=time.monotonic)  # when its last report came, locally


class Detector:
    def __init__(
        self,
        mirror: PrefixMirror,
        keys: Keyspace,
        lifecycle: ReplicaLifecycle,
        alerter: Alerter,
        *,
        report_timeout_s: float,
        sick_errors: int,
        worker_timeout_s: float,
        fence: Callable[[], Fence | None],
        tls: TLSConfig | None = None,
        on_heartbeat_age: Callable[[str, float], None] = lambda worker, age: None,
        on_error: Callable[[str], None] = lambda loop: None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._mirror, self._keys, self._lifecycle, self._alerter = mirror, keys, lifecycle, alerter
        self._tls = tls  # EmergencyStop calls: under mutual TLS the workers check this identity
        self._report_timeout, self._sick_errors, self._worker_timeout = (
            report_timeout_s,
            sick_errors,
            worker_timeout_s,
        )
        self._fence, self._on_age, self._on_error, self._clock = (
            fence,
            on_heartbeat_age,
            on_error,
            clock,
        )
        self._monotonic = monotonic
        self._freshest = self._flow_since = monotonic()  # last report from anyone; since when they flow
        self.workers: dict[str, WorkerSeen] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.detected: dict[str, float] = {}  # worker -> when it was found dead (for tests and bench)

    # -- the mirror's view -----------------------------------------------------------------------------
    def on_change(self, keys: set[str]) -> None:
        for key in keys:
            parsed = self._keys.parse_worker_key(key)
            if parsed is None:
                continue
            worker, is_report = parsed
            raw = self._mirror.values.get(key)
            if raw is None and not is_report:
                guard = Compare(self._keys.worker(worker), 0)  # only while it is still gone
                self._spawn(self._dead(worker, "its lease expired (record gone)", guard))
            elif raw is not None:
                self._seen(worker, raw, is_report)

    def _seen(self, worker: str, raw: bytes, is_report: bool) -> None:
        key = self._keys.worker_load(worker) if is_report else self._keys.worker(worker)
        try:
            doc: LoadReport | WorkerRecord = (LoadReport if is_report else WorkerRecord).parse(key, raw)
        except InvalidArgument as exc:
            log.warning("ignoring %s: %s", key, exc.message)
            return
        seen = self.workers.get(worker)
        if seen is None:
            seen = self.workers[worker] = WorkerSeen(
                worker, last_beat=self._clock(), arrived=self._monotonic()
            )
        if not seen.alive:
            seen.alive, seen.emergency_sent = True, False
            self._spawn(self._recovered(worker))
        if isinstance(doc, LoadReport):
            now = self._monotonic()
            if now - self._freshest > self._report_timeout:  # reports stopped for everyone, now resume
                self._flow_since = now
            seen.arrived = self._freshest = now
            seen.last_beat = doc.last_beat or self._clock()
            seen.last_active = doc.last_active
            seen.queue_depth = doc.queue_depth
            seen.errors_total = doc.exec_errors_total
            seen.stopped = doc.stopped
            seen.device_error = doc.device_error
        else:
            seen.grpc = doc.grpc

    # -- periodic checks -------------------------------------------------------------------------------
    def check(self) -> None:
        """Report ages and sickness; cheap, runs on the event loop."""
        now = self._monotonic()
        flowing = now - self._freshest <= self._report_timeout  # reports arrive: the watch works
        for seen in list(self.workers.values()):
            if not seen.alive:
                continue
            age = max(0.0, now - seen.arrived)
            self._on_age(seen.id, age)
            if flowing and now - max(seen.arrived, self._flow_since) > self._report_timeout:
                key = self._keys.worker(seen.id)
                guard = Compare(key, self._mirror.revisions.get(key, 0))  # not registered again since
                self._spawn(self._dead(seen.id, f"no load report for {age:.1f}s", guard))
                continue
            new_errors = seen.errors_total - (
                seen.errors_checked if seen.errors_checked is not None else seen.errors_total
            )
            seen.errors_checked = seen.errors_total
            sick = seen.device_error or (
                new_errors >= self._sick_errors and f"{new_errors} requests failed in its models"
            )
            if sick and not seen.stopped and not seen.emergency_sent:
                seen.emergency_sent = True
                self._spawn(self._emergency_stop(seen, str(sick)))

    # -- actions ---------------------------------------------------------------------------------------
    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _replicas_of(self, worker: str) -> list[tuple[ReplicaId, str]]:
        out = []
        for key, raw in self._mirror.values.items():
            rid = self._keys.parse_replica_key(key)
            if rid is not None and rid.worker == worker:
                with contextlib.suppress(InvalidArgument):
                    out.append((rid, ReplicaRecord.parse(key, raw).state.value))
        return out

    async def _dead(self, worker: str, why: str, guard: Compare) -> None:
        seen = self.workers.setdefault(worker, WorkerSeen(worker, last_beat=0.0))
        if not seen.alive:
            return
        seen.alive = False
        self.detected[worker] = self._clock()
        fence = self._fence()
        if fence is None:
            return
        held = [(rid, state) for rid, state in self._replicas_of(worker) if state not in ("ERROR", "IDLE")]
        reason = f"worker {worker} is dead: {why}; last active {_iso(seen.last_active or seen.last_beat)}"
        guards = [guard, fence.compare()]
        marked = await asyncio.gather(*(self._mark_error(rid, reason, guards) for rid, _ in held))
        log.warning("%s; %d of %d replica(s) marked ERROR", reason, sum(marked), len(held))
        await self._alerter.fire(
            Alert(
                name="WorkerDown",
                severity="critical",
                labels={"worker": worker},
                annotations={
                    "summary": f"worker {worker} is dead ({why})",
                    "replicas": ", ".join(str(rid) for rid, _ in held) or "none",
                    "last_active": _iso(seen.last_active or seen.last_beat),
                    "last_active_unix": f"{seen.last_active or seen.last_beat:.3f}",
                },
                starts_at=self._clock(),
            )
        )

    async def _mark_error(self, rid: ReplicaId, reason: str, guards: list[Compare]) -> bool:
        try:
            await self._lifecycle.transition(rid, ReplicaState.ERROR, reason=reason, guard=guards)
        except FailedPrecondition:
            return False  # already ERROR, changed meanwhile, the worker is back, or fenced: decided later
        except MCPError as exc:
            self._on_error("mark_error")
            log.warning("could not mark %s ERROR: %s", rid, exc.message)
            return False
        return True

    async def _recovered(self, worker: str) -> None:
        if self._fence() is not None:
            back = {"summary": f"worker {worker} is back"}
            alert = Alert(name="WorkerDown", severity="critical", labels={"worker": worker}, annotations=back)
            await self._alerter.resolve(alert)

    async def _emergency_stop(self, seen: WorkerSeen, why: str) -> None:
        fence = self._fence()
        if fence is None or not seen.grpc:
            return
        log.warning("worker %s is sick (%s): emergency stop", seen.id, why)
        try:
            async with aio_channel(seen.grpc, self._tls) as channel:
                stub = worker_pb2_grpc.WorkerControlStub(channel)
                reply = await stub.EmergencyStop(
                    worker_pb2.EmergencyStopRequest(reason=f"health: {why}"),
                    timeout=self._worker_timeout,
                    metadata=fence.metadata(),
                )
        except grpc.aio.AioRpcError as exc:
            seen.emergency_sent = False  # try again on the next check
            self._on_error("emergency_stop")
            log.warning("emergency stop of %s failed: %s", seen.id, exc.details())
            return
        await self._alerter.fire(
            Alert(
                name="WorkerSick",
                severity="critical",
                labels={"worker": seen.id},
                annotations={
                    "summary": f"worker {seen.id} was stopped: {why}",
                    "checkpoint": reply.checkpoint_path,
                    "last_active": _iso(reply.last_active_unix_ms / 1000),
                },
                starts_at=self._clock(),
            )
        )  # fmt: skip

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _iso(unix_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(unix_s)) + f".{int(unix_s % 1 * 1000):03d}Z"
