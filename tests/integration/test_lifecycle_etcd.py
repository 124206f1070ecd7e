"""The replica state machine persisted in a real etcd."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from mcpcore.errors import DataLoss, FailedPrecondition, Internal, NotFound, ResourceExhausted
from mcpcore.keys import Keyspace, ReplicaId
from mcpcore.lifecycle import ReplicaLifecycle, ReplicaRecord, ReplicaState, is_legal
from mcpcore.store import Compare

S = ReplicaState
RID = ReplicaId("demo-mlp", "1", "w1")


@pytest.fixture
def keys(key_prefix):
    return Keyspace(key_prefix.rstrip("/"))


@pytest.fixture
def lifecycle(store, keys):
    return ReplicaLifecycle(store, keys)


async def _put_state(store, keys, state: ReplicaState) -> int:
    return await store.put(keys.replica_key(RID), ReplicaRecord(state, 1.0).to_json())


async def test_create_then_the_planned_path(lifecycle):
    rec = await lifecycle.create(RID, reason="placed")
    assert rec.state is S.IDLE and rec.revision > 0
    for dst in (S.LOADING, S.READY, S.RUNNING, S.PAUSED, S.RUNNING, S.UNLOADING, S.IDLE):
        rec = await lifecycle.transition(RID, dst, reason=f"to {dst.value}")
    stored = await lifecycle.get(RID)
    assert stored == rec
    assert stored.state is S.IDLE and stored.reason == "to IDLE"
    assert [t.dst for t in stored.history][-3:] == [S.RUNNING, S.UNLOADING, S.IDLE]
    assert len(stored.history) == 7


async def test_create_twice_fails(lifecycle):
    await lifecycle.create(RID)
    with pytest.raises(FailedPrecondition, match="already exists"):
        await lifecycle.create(RID)


async def test_missing_replica_is_not_found(lifecycle):
    with pytest.raises(NotFound, match="demo-mlp/1@w1 does not exist"):
        await lifecycle.transition(RID, S.LOADING)


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(S, S)), ids=lambda s: s.value)
async def test_every_transition_against_etcd(store, keys, lifecycle, src, dst):
    revision = await _put_state(store, keys, src)
    if is_legal(src, dst):
        rec = await lifecycle.transition(RID, dst, reason="test")
        assert rec.state is dst and rec.revision > revision
        assert (await lifecycle.get(RID)).state is dst
    else:
        with pytest.raises(FailedPrecondition, match=f"{src.value} -> {dst.value}"):
            await lifecycle.transition(RID, dst)
        kv = await store.get(keys.replica_key(RID))
        assert kv.mod_revision == revision  # nothing written


@pytest.mark.parametrize("where", ["exit", "enter"])
@pytest.mark.parametrize("exc", [RuntimeError("gpu fell off"), ResourceExhausted("no memory")])
async def test_failing_hook_leaves_state_unchanged(store, keys, lifecycle, where, exc):
    await lifecycle.create(RID)
    await lifecycle.transition(RID, S.LOADING)
    before = await store.get(keys.replica_key(RID))

    async def hook(rid, src, dst):
        raise exc

    (lifecycle.on_exit if where == "exit" else lifecycle.on_enter)(
        S.LOADING if where == "exit" else S.READY, hook
    )
    expected = type(exc) if isinstance(exc, ResourceExhausted) else Internal
    with pytest.raises(expected) as info:
        await lifecycle.transition(RID, S.READY)
    if expected is Internal:
        assert "state stays LOADING" in info.value.message and "gpu fell off" in info.value.message
    after = await store.get(keys.replica_key(RID))
    assert after.mod_revision == before.mod_revision and after.value == before.value


async def test_a_write_that_fails_after_the_hooks_runs_the_way_back(store, keys, lifecycle):
    """A worker withholds a replica on leaving RUNNING; when the PAUSED write then loses its compare (another
    writer got there first), the replica is admitted again, so it does not refuse traffic while etcd and
    the worker both still say RUNNING."""
    await lifecycle.create(RID)
    for state in (S.LOADING, S.READY, S.RUNNING):
        await lifecycle.transition(RID, state)
    other = ReplicaLifecycle(store, keys)
    calls = []

    async def withhold(rid, src, dst):
        calls.append(("withhold", src, dst))
        await other.transition(rid, S.PAUSED, reason="another writer")
        await other.transition(rid, S.RUNNING, reason="and back")

    async def admit(rid, src, dst):
        calls.append(("admit", src, dst))

    lifecycle.on_exit(S.RUNNING, withhold)
    lifecycle.on_enter(S.RUNNING, admit)
    with pytest.raises(FailedPrecondition, match="changed by another writer"):
        await lifecycle.transition(RID, S.PAUSED, reason="pause")
    assert calls == [("withhold", S.RUNNING, S.PAUSED), ("admit", S.PAUSED, S.RUNNING)]
    assert (await lifecycle.get(RID)).state is S.RUNNING


async def test_a_failing_hook_runs_the_way_back_for_the_hooks_before_it(store, keys, lifecycle):
    await lifecycle.create(RID)
    await lifecycle.transition(RID, S.LOADING)
    calls = []

    async def exit_loading(rid, src, dst):
        calls.append(("exit LOADING", src, dst))

    async def enter_loading(rid, src, dst):
        calls.append(("enter LOADING", src, dst))

    async def warm_up(rid, src, dst):
        raise ResourceExhausted("warm-up ran out of memory")

    lifecycle.on_exit(S.LOADING, exit_loading)
    lifecycle.on_enter(S.LOADING, enter_loading)
    lifecycle.on_enter(S.READY, warm_up)
    with pytest.raises(ResourceExhausted, match="warm-up"):
        await lifecycle.transition(RID, S.READY)
    assert calls == [("exit LOADING", S.LOADING, S.READY), ("enter LOADING", S.READY, S.LOADING)]
    assert (await lifecycle.get(RID)).state is S.LOADING


async def test_hooks_run_exit_then_enter_with_both_states(lifecycle):
    calls = []

    def recorder(tag):
        async def hook(rid, src, dst):
            calls.append((tag, rid, src, dst))

        return hook

    lifecycle.on_exit(S.IDLE, recorder("exit"))
    lifecycle.on_enter(S.LOADING, recorder("enter"))
    await lifecycle.create(RID)
    await lifecycle.transition(RID, S.LOADING)
    assert calls == [("exit", RID, S.IDLE, S.LOADING), ("enter", RID, S.IDLE, S.LOADING)]


async def test_two_concurrent_writers_exactly_one_wins(store, keys):
    """Two processes' state machines read the same revision, then race to write it."""
    first, second = ReplicaLifecycle(store, keys), ReplicaLifecycle(store, keys)
    await first.create(RID)
    both_read = asyncio.Barrier(2)

    async def wait_for_the_other(rid, src, dst):
        await both_read.wait()

    first.on_enter(S.LOADING, wait_for_the_other)
    second.on_enter(S.LOADING, wait_for_the_other)
    results = await asyncio.gather(
        first.transition(RID, S.LOADING, reason="first"),
        second.transition(RID, S.LOADING, reason="second"),
        return_exceptions=True,
    )
    winners = [r for r in results if isinstance(r, ReplicaRecord)]
    losers = [r for r in results if isinstance(r, FailedPrecondition)]
    assert len(winners) == 1 and len(losers) == 1, results
    assert "changed by another writer" in losers[0].message
    stored = await first.get(RID)
    assert stored.state is S.LOADING and stored.reason == winners[0].reason
    assert len(stored.history) == 1


async def test_one_process_serialises_its_own_writers(lifecycle):
    await lifecycle.create(RID)
    results = await asyncio.gather(
        lifecycle.transition(RID, S.LOADING), lifecycle.transition(RID, S.LOADING), return_exceptions=True
    )
    assert sum(isinstance(r, ReplicaRecord) for r in results) == 1
    assert sum(isinstance(r, FailedPrecondition) and "LOADING -> LOADING" in r.message for r in results) == 1


async def test_expected_revision_pins_what_the_caller_saw(lifecycle):
    seen = await lifecycle.create(RID)
    await lifecycle.transition(RID, S.LOADING)
    with pytest.raises(FailedPrecondition, match=f"expected revision {seen.revision}"):
        await lifecycle.transition(RID, S.ERROR, expected_revision=seen.revision)


async def test_info_is_merged_and_kept(lifecycle):
    await lifecycle.create(RID, info={"endpoint": "tcp://127.0.0.1:5555"})
    rec = await lifecycle.transition(RID, S.LOADING, info={"memory_bytes": 1024})
    assert rec.info == {"endpoint": "tcp://127.0.0.1:5555", "memory_bytes": 1024}
    assert (await lifecycle.get(RID)).info == rec.info


async def test_corrupt_record_is_reported_and_not_overwritten(store, keys, lifecycle):
    key = keys.replica_key(RID)
    revision = await store.put(key, b'{"state": "RUNING"')
    with pytest.raises(DataLoss, match=key):
        await lifecycle.transition(RID, S.PAUSED)
    assert (await store.get(key)).mod_revision == revision


async def test_remove_is_guarded_by_revision(lifecycle):
    rec = await lifecycle.create(RID)
    moved = await lifecycle.transition(RID, S.LOADING)
    with pytest.raises(FailedPrecondition):
        await lifecycle.remove(RID, expected_revision=rec.revision)
    await lifecycle.remove(RID, expected_revision=moved.revision)
    assert await lifecycle.get(RID) is None


async def test_resync_records_the_holders_truth_over_any_state(store, keys, lifecycle):
    await lifecycle.create(RID)
    for dst in (S.LOADING, S.READY, S.RUNNING, S.ERROR):
        await lifecycle.transition(RID, dst, reason="worker lost")
    write = await lifecycle.resync_op(RID, S.RUNNING, reason="worker back", info={"endpoint": "e"})
    assert (await store.txn([write.compare], [write.put])).succeeded
    rec = await lifecycle.get(RID)
    assert rec.state is S.RUNNING and rec.info == {"endpoint": "e"}
    assert rec.history[-1].reason == "re-sync: worker back"
    # always a write: a decision planned from the record before it (a forget) loses its compare
    again = await lifecycle.resync_op(RID, S.RUNNING, reason="worker back", info={"endpoint": "e"})
    assert (await store.txn([again.compare], [again.put])).succeeded
    assert (await lifecycle.get(RID)).revision > rec.revision


async def test_resync_creates_a_missing_record_and_loses_a_race(store, lifecycle):
    write = await lifecycle.resync_op(RID, S.PAUSED, reason="re-registered")
    stale = await lifecycle.resync_op(RID, S.PAUSED, reason="re-registered")
    assert (await store.txn([write.compare], [write.put])).succeeded
    assert (await lifecycle.get(RID)).state is S.PAUSED and write.record.history == ()
    assert not (await store.txn([stale.compare], [stale.put])).succeeded  # someone wrote meanwhile


async def test_a_guard_keeps_a_transition_from_happening(store, keys, lifecycle):
    await lifecycle.create(RID)
    await store.put(keys.worker(RID.worker), b"{}")  # the worker is registered again
    with pytest.raises(FailedPrecondition):
        await lifecycle.transition(RID, S.ERROR, reason="dead?", guard=[Compare(keys.worker(RID.worker), 0)])
    assert (await lifecycle.get(RID)).state is S.IDLE
