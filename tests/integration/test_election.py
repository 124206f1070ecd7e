"""LeaderElection against a real etcd: one leader among several, hand-over on resign, on a revoked lease,
on a killed leader process and on an etcd outage; callbacks in order; nothing left running after stop().

Every candidate has a store (a gRPC channel) of its own, as separate processes would. Waits poll with a
deadline; the only sleeps are poll intervals.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from mcpcore import errors
from mcpcore.election import LeaderElection
from mcpcore.etcd_store import EtcdStore

POLL_S = 0.01
CANDIDATE_SCRIPT = Path(__file__).with_name("election_candidate.py")


async def until(check: Callable[[], bool], what: str, timeout_s: float = 5.0) -> float:
    """Poll ``check`` until true; returns the seconds it took."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(POLL_S)
    return time.monotonic() - start


class Candidate:
    """An election plus the record of its callbacks."""

    def __init__(self, store: EtcdStore, key: str, name: str, ttl: int) -> None:
        self.name = name
        self.changes: list[bool] = []
        self.errors: list[str] = []
        self.election = LeaderElection(
            store, key, name, ttl=ttl, on_change=self._changed, on_error=self.errors.append
        )

    async def _changed(self, leading: bool) -> None:
        await asyncio.sleep(0)  # an async callback, as a service's would be
        self.changes.append(leading)


@pytest.fixture
async def stores(etcd_endpoint: str) -> AsyncIterator[Callable[..., Awaitable[EtcdStore]]]:
    opened: list[EtcdStore] = []

    async def open_store(endpoint: str = etcd_endpoint) -> EtcdStore:
        store = EtcdStore([endpoint], timeout=2.0)
        await store.connect()
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        await store.close()


@pytest.fixture
async def candidates(stores, key_prefix: str) -> AsyncIterator[Callable[..., Awaitable[list[Candidate]]]]:
    made: list[Candidate] = []

    async def make(count: int, *, ttl: int = 2, endpoint: str | None = None) -> list[Candidate]:
        batch = []
        for i in range(count):
            store = await (stores() if endpoint is None else stores(endpoint))
            batch.append(Candidate(store, f"{key_prefix}leader/scheduler", f"c{len(made) + i}", ttl))
        made.extend(batch)
        for c in batch:
            await c.election.start()
        return batch

    yield make
    for c in made:
        await c.election.stop()


def leaders(group: list[Candidate]) -> list[Candidate]:
    return [c for c in group if c.election.is_leader]


@pytest.mark.parametrize("count", [2, 3])
async def test_exactly_one_candidate_leads_and_the_others_see_it(candidates, store, count: int) -> None:
    group = await candidates(count)
    await until(lambda: len(leaders(group)) == 1, "a leader")
    (leader,) = leaders(group)
    await until(lambda: all(c.election.leader == leader.name for c in group), "everyone to see the leader")
    kv = await store.get(leader.election.key)
    assert kv is not None and kv.value == leader.name.encode() and kv.lease != 0
    assert leader.election.leader_revision == kv.mod_revision
    assert leader.changes == [True]
    assert all(c.changes == [] and c.election.leader_revision is None for c in group if c is not leader)


async def test_resign_hands_over_at_once_and_never_two_leaders(candidates, store) -> None:
    group = await candidates(3)
    await until(lambda: len(leaders(group)) == 1, "a leader")
    seen_two = False

    async def watch_for_two() -> None:
        nonlocal seen_two
        while True:
            seen_two |= len(leaders(group)) > 1
            await asyncio.sleep(0)

    monitor = asyncio.create_task(watch_for_two())
    try:
        for _ in range(len(group) - 1):  # leaders resign one after the other
            (old,) = leaders(group)
            await old.election.resign()
            assert not old.election.is_leader and old.changes == [True, False]
            took = await until(lambda o=old: any(c is not o for c in leaders(group)), "a successor", 2.0)
            assert took < 1.0  # the key went with the revoked lease: no TTL to wait for
    finally:
        monitor.cancel()
    assert not seen_two
    (last,) = leaders(group)
    assert last.changes == [True]
    assert all(c.changes == [True, False] for c in group if c is not last)


async def test_outside_revoke_deposes_the_leader_and_the_standby_takes_over(candidates, store) -> None:
    a, b = await candidates(2)
    await until(lambda: len(leaders([a, b])) == 1, "a leader")
    old, standby = (a, b) if a.election.is_leader else (b, a)
    kv = await store.get(old.election.key)
    assert kv is not None

    await store.revoke_lease(kv.lease)

    await until(lambda: standby.election.is_leader, "the standby to lead", 3.0)
    await until(lambda: old.changes == [True, False], "the old leader to step down")
    assert not old.election.is_leader
    await until(lambda: old.election.leader == standby.name, "the old leader to follow the new one")
    assert standby.changes == [True]


async def test_killed_leader_process_is_replaced_within_the_ttl(
    candidates, etcd_endpoint, key_prefix, tmp_path
):
    ttl, key = 1, f"{key_prefix}leader/scheduler"
    with (tmp_path / "child.log").open("wb") as log:
        child = await asyncio.create_subprocess_exec(
            sys.executable, str(CANDIDATE_SCRIPT), etcd_endpoint, key, "child", str(ttl),
            stdout=asyncio.subprocess.PIPE, stderr=log,
        )  # fmt: skip
    try:
        line = await asyncio.wait_for(child.stdout.readline(), 20)
        assert line == b"leader\n", (tmp_path / "child.log").read_text()
        (standby,) = await candidates(1, ttl=ttl)
        await until(lambda: standby.election.leader == "child", "the standby to see the child lead")
        assert not standby.election.is_leader

        child.kill()  # SIGKILL: no resign, the lease must expire
        await child.wait()
        took = await until(lambda: standby.election.is_leader, "the standby to take over", ttl + 4.0)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    # The lease expires at most one TTL after its last refresh; etcd checks expiry every 0.5 s.
    assert took < ttl + 1.5, took
    # is_leader turns true before the on_change(True) callback has run to its end: wait for it
    await until(lambda: standby.changes == [True], "on_change(True)")


async def test_leader_cut_off_from_etcd_steps_down_before_its_lease_expires(candidates, restartable_etcd):
    ttl = 1
    (c,) = await candidates(1, ttl=ttl, endpoint=restartable_etcd.endpoint)
    await until(lambda: c.election.is_leader, "the only candidate to lead")

    stopped_at = time.monotonic()
    restartable_etcd.kill()
    await until(lambda: not c.election.is_leader, "the leader to step down", ttl + 1.0)
    # It steps down within a TTL of its last refresh, which came at most TTL/3 before the outage.
    assert time.monotonic() - stopped_at <= ttl
    await until(lambda: c.changes == [True, False], "on_change(False)")
    assert "election.refresh" in c.errors

    restartable_etcd.start()  # the old key lives on until its lease expires; then it wins again
    await until(lambda: c.election.is_leader, "the candidate to lead again", ttl + 10.0)
    await until(lambda: c.changes == [True, False, True], "on_change(True) again")


async def test_stop_releases_the_key_and_leaves_no_task(candidates, store) -> None:
    a, b = await candidates(2)
    await until(lambda: len(leaders([a, b])) == 1, "a leader")
    await asyncio.gather(a.election.stop(), b.election.stop())
    assert await store.get(a.election.key) is None
    assert not a.election.is_leader and not b.election.is_leader
    assert sorted([a.changes, b.changes]) == [[], [True, False]]
    assert asyncio.all_tasks() == {asyncio.current_task()}
    with pytest.raises(errors.FailedPrecondition):
        await a.election.start()


async def test_a_resigned_candidate_can_campaign_again(candidates) -> None:
    (c,) = await candidates(1)
    await until(lambda: c.changes == [True], "the only candidate to lead (on_change(True))")
    await c.election.resign()
    assert c.changes == [True, False] and c.election.leader is None
    await c.election.start()
    await until(lambda: c.changes == [True, False, True], "the candidate to lead again", 2.0)
    assert c.election.is_leader


async def test_bad_arguments_are_refused(store, key_prefix) -> None:
    with pytest.raises(errors.InvalidArgument):
        LeaderElection(store, f"{key_prefix}k", "c", ttl=0)
    with pytest.raises(errors.InvalidArgument):
        LeaderElection(store, "", "c")
