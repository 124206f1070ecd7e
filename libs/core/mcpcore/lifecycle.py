"""The replica state machine (DESIGN.md section 5), persisted in the store by compare-and-swap.

Rules (everything that decides a replica's state lives in this file):
1. The planned path is ``TRANSITIONS``. ERROR is also reachable from every other state, because a failure
   (a worker dies, a load or warm-up fails) can strike anywhere; it leaves ERROR only through RECOVERING.
2. A transition runs the exit hooks of the old state, then the enter hooks of the new one, and only then
   writes the new state. A hook that raises leaves the stored state as it was, and its error reaches the
   caller (an ``MCPError`` as is; anything else as ``Internal`` naming the hook). When a hook or the write
   fails, the hooks of the way back (the new state's exit hooks, the old state's enter hooks) run before
   the error goes on, so what the hooks did in this process follows the stored state again (a worker
   that withheld a replica for a pause whose write failed admits it again). Hooks are idempotent.
3. The write is a transaction guarded by the record's mod revision: of two writers racing on one replica,
   exactly one wins and the other gets ``FailedPrecondition``. Within one process an asyncio lock per
   replica serialises transitions, so hooks of one replica never interleave.
4. The stored value is ``mcpcore.records.ReplicaRecord`` (its ``to_json``, read by its ``parse``); a value
   that does not parse is never overwritten silently: reading it raises ``DataLoss`` naming the key.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from mcpcore.errors import DataLoss, FailedPrecondition, Internal, InvalidArgument, MCPError, NotFound
from mcpcore.keys import Keyspace, ReplicaId
from mcpcore.records.replica import ReplicaRecord, ReplicaState, Transition
from mcpcore.store import Compare, Delete, Put, Store

__all__ = [
    "TRANSITIONS",
    "Hook",
    "ReplicaLifecycle",
    "ReplicaRecord",
    "ReplicaState",
    "Resync",
    "Transition",
    "check_transition",
    "is_legal",
]

log = logging.getLogger(__name__)


S = ReplicaState
TRANSITIONS: Mapping[ReplicaState, frozenset[ReplicaState]] = {
    S.IDLE: frozenset({S.LOADING, S.ERROR}),
    S.LOADING: frozenset({S.READY, S.ERROR}),
    S.READY: frozenset({S.RUNNING, S.UNLOADING}),
    S.RUNNING: frozenset({S.PAUSED, S.UNLOADING}),
    S.PAUSED: frozenset({S.RUNNING, S.UNLOADING}),
    S.UNLOADING: frozenset({S.IDLE, S.ERROR}),
    S.ERROR: frozenset({S.RECOVERING}),
    S.RECOVERING: frozenset({S.IDLE}),
}


def is_legal(src: ReplicaState, dst: ReplicaState) -> bool:
    return dst in TRANSITIONS[src] or (dst is S.ERROR and src is not S.ERROR)


def check_transition(src: ReplicaState, dst: ReplicaState, what: str = "replica") -> None:
    if not is_legal(src, dst):
        allowed = sorted(s.value for s in TRANSITIONS[src] | ({S.ERROR} if src is not S.ERROR else set()))
        raise FailedPrecondition(
            f"{what}: illegal transition {src.value} -> {dst.value}; from {src.value} it may go to "
            f"{', '.join(allowed)}"
        )


@dataclass(frozen=True, slots=True)
class Resync:
    """One replica's re-sync write (``ReplicaLifecycle.resync_op``), to commit in a transaction."""

    rid: ReplicaId
    compare: Compare
    put: Put
    record: ReplicaRecord  # as written; its revision is the transaction's


#: A hook gets the replica, the state it leaves and the state it enters.
Hook = Callable[[ReplicaId, ReplicaState, ReplicaState], Awaitable[None]]


class ReplicaLifecycle:
    """Reads and moves replica states in the store; one instance per process is enough."""

    def __init__(
        self,
        store: Store,
        keys: Keyspace,
        *,
        clock: Callable[[], float] = time.time,
        history: int = 8,
    ) -> None:
        self._store = store
        self._keys = keys
        self._clock = clock
        self._history = history
        self._enter: dict[ReplicaState, list[Hook]] = {s: [] for s in ReplicaState}
        self._exit: dict[ReplicaState, list[Hook]] = {s: [] for s in ReplicaState}
        self._locks: dict[ReplicaId, asyncio.Lock] = {}

    def on_enter(self, state: ReplicaState, hook: Hook) -> None:
        self._enter[state].append(hook)

    def on_exit(self, state: ReplicaState, hook: Hook) -> None:
        self._exit[state].append(hook)

    async def get(self, rid: ReplicaId) -> ReplicaRecord | None:
        key = self._keys.replica_key(rid)
        kv = await self._store.get(key)
        return None if kv is None else _parse(key, kv.value, kv.mod_revision)

    async def records_of(self, worker: str) -> list[tuple[ReplicaId, ReplicaRecord]]:
        """Every replica record naming ``worker`` (one prefix read; for a worker's registration)."""
        prefix = self._keys.replicas_prefix()
        out = []
        for kv in (await self._store.get_prefix(prefix)).items:
            rid = self._keys.parse_replica_key(kv.key)
            if rid is not None and rid.worker == worker:
                try:
                    out.append((rid, _parse(kv.key, kv.value, kv.mod_revision)))
                except DataLoss:
                    continue  # not ours to judge here: whoever reads it gets the error
        return out

    async def create(
        self, rid: ReplicaId, *, reason: str = "", info: Mapping[str, Any] | None = None
    ) -> ReplicaRecord:
        """Record a new replica in IDLE; ``FailedPrecondition`` if it already exists."""
        async with self._lock(rid):
            record = ReplicaRecord(S.IDLE, self._clock(), reason, info=dict(info or {}))
            return await self._write(rid, record, expected_revision=0)

    async def transition(
        self,
        rid: ReplicaId,
        dst: ReplicaState,
        *,
        reason: str = "",
        expected_revision: int | None = None,
        info: Mapping[str, Any] | None = None,
        guard: Sequence[Compare] = (),
    ) -> ReplicaRecord:
        """Move ``rid`` to ``dst`` (rules 1-3 above). ``expected_revision`` pins the record the caller saw;
        ``info`` entries are merged into the record's info; ``guard`` adds compares the write also needs
        (the health service marks a dead worker's replicas ERROR only while its record is still gone)."""
        async with self._lock(rid):
            current = await self.get(rid)
            if current is None:
                raise NotFound(f"replica {rid} does not exist")
            if expected_revision is not None and current.revision != expected_revision:
                raise self._conflict(rid, expected_revision)
            check_transition(current.state, dst, f"replica {rid}")
            try:
                await self._run_hooks(rid, current.state, dst)
                now = self._clock()
                step = Transition(current.state, dst, now, reason)
                record = replace(
                    current,
                    state=dst,
                    since=now,
                    reason=reason,
                    history=(*current.history, step)[-self._history :],
                    info={**current.info, **(info or {})},
                )
                return await self._write(rid, record, expected_revision=current.revision, guard=guard)
            except (Exception, asyncio.CancelledError):
                await self._run_back(rid, current.state, dst)
                raise

    async def resync_op(
        self, rid: ReplicaId, state: ReplicaState, *, reason: str, info: Mapping[str, Any] | None = None
    ) -> Resync:
        """The compare-and-put that records what the holder of a replica actually has, whatever the
        record says: the re-sync of a worker that lost etcd and comes back, when others may have marked
        its replicas ERROR (or deleted them) meanwhile.

        Not a transition (no hooks, no legality check). The caller commits it in one transaction with its
        own registration (``Store.txn``), so watchers see the worker and its replicas return together; a
        failed compare means someone wrote meanwhile: build it again. It always writes, so a decision
        planned from the record as it was before (a scheduler's forget) loses its own compare.
        """
        current = await self.get(rid)
        key = self._keys.replica_key(rid)
        now = self._clock()
        history: tuple[Transition, ...] = () if current is None else current.history
        if current is not None and current.state is not state:
            history = (*history, Transition(current.state, state, now, f"re-sync: {reason}"))
        merged = {**(current.info if current else {}), **(info or {})}
        record = ReplicaRecord(state, now, reason, history=history[-self._history :], info=merged)
        compare = Compare(key, current.revision if current else 0)
        return Resync(rid, compare, Put(key, record.to_json()), record)

    async def remove(self, rid: ReplicaId, *, expected_revision: int, guard: Sequence[Compare] = ()) -> None:
        """Delete the record if it is still at ``expected_revision`` (a replica gone for good) and the
        ``guard`` compares hold."""
        key = self._keys.replica_key(rid)
        result = await self._store.txn([Compare(key, expected_revision), *guard], [Delete(key)])
        if not result.succeeded:
            raise self._conflict(rid, expected_revision)

    async def _run_hooks(self, rid: ReplicaId, src: ReplicaState, dst: ReplicaState) -> None:
        for hook in (*self._exit[src], *self._enter[dst]):
            try:
                await hook(rid, src, dst)
            except MCPError:
                raise
            except Exception as exc:
                name = getattr(hook, "__qualname__", repr(hook))
                raise Internal(
                    f"replica {rid}: hook {name} failed on {src.value} -> {dst.value}: {exc!r}; "
                    f"state stays {src.value}"
                ) from exc

    async def _run_back(self, rid: ReplicaId, src: ReplicaState, dst: ReplicaState) -> None:
        """After a failed ``src -> dst``: the hooks of ``dst -> src``, each tried once; one that fails is
        logged (the first error is the one the caller gets)."""
        for hook in (*self._exit[dst], *self._enter[src]):
            try:
                await hook(rid, dst, src)
            except Exception:
                name = getattr(hook, "__qualname__", repr(hook))
                log.exception("replica %s: hook %s failed undoing %s -> %s", rid, name, src.value, dst.value)

    async def _write(
        self, rid: ReplicaId, record: ReplicaRecord, *, expected_revision: int, guard: Sequence[Compare] = ()
    ) -> ReplicaRecord:
        key = self._keys.replica_key(rid)
        result = await self._store.txn(
            [Compare(key, expected_revision), *guard], [Put(key, record.to_json())]
        )
        if not result.succeeded:
            raise self._conflict(rid, expected_revision)
        return replace(record, revision=result.revision)

    @staticmethod
    def _conflict(rid: ReplicaId, expected_revision: int) -> FailedPrecondition:
        if expected_revision == 0:
            return FailedPrecondition(f"replica {rid} already exists")
        return FailedPrecondition(
            f"replica {rid} was changed by another writer (expected revision {expected_revision}); "
            "re-read it and retry"
        )

    def _lock(self, rid: ReplicaId) -> asyncio.Lock:
        lock = self._locks.get(rid)
        if lock is None:
            lock = self._locks[rid] = asyncio.Lock()
        return lock


def _parse(key: str, raw: bytes, revision: int) -> ReplicaRecord:
    """A stored record; one that does not parse is ``DataLoss`` (never overwritten silently)."""
    try:
        return ReplicaRecord.parse(key, raw, revision=revision)
    except InvalidArgument as exc:
        raise DataLoss(f"replica record at {key} is not valid ({exc.message}); fix or delete it") from None
