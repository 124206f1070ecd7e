"""EtcdStore against a real etcd: KV, compare-and-swap, leases, watches, restarts and outages.

Every wait polls with a bounded deadline; the only sleeps are poll intervals and, in the keep-alive
test, letting a lease's TTL pass while checking the key stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from etcd3aio import Etcd3Client

from mcpcore import errors
from mcpcore.etcd_store import EtcdStore
from mcpcore.store import Compare, Delete, EventType, KeyValue, Put, WatchCompacted, WatchEvent

POLL_S = 0.02


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(POLL_S)


async def until_available(store: EtcdStore, timeout_s: float = 5.0) -> None:
    async def answers() -> bool:
        with contextlib.suppress(errors.Unavailable):
            return await store.ping() > 0
        return False

    await until(answers, "etcd to answer", timeout_s)


class Collector:
    """Consumes a watch in the background, keeping every event (the test checks the exact sequence)."""

    def __init__(self, watch: AsyncIterator[list[WatchEvent]], *, hold_at: int = 0) -> None:
        self.events: list[WatchEvent] = []
        self.hold_at = hold_at  # stop pulling once this many events came, until resume() is called
        self._resumed = asyncio.Event()
        self.task = asyncio.create_task(self._run(watch))

    async def _run(self, watch: AsyncIterator[list[WatchEvent]]) -> None:
        async with contextlib.aclosing(watch):  # type: ignore[type-var]
            async for batch in watch:
                assert batch, "a watch never yields an empty batch"
                self.events.extend(batch)
                if self.hold_at and len(self.events) >= self.hold_at:
                    await self._resumed.wait()  # the watch stays suspended at its yield meanwhile

    def resume(self) -> None:
        self._resumed.set()

    async def wait_for(self, count: int, timeout_s: float = 5.0) -> list[WatchEvent]:
        async def enough() -> bool:
            if self.task.done():
                self.task.result()  # raises what the watch raised
                pytest.fail("the watch ended")
            return len(self.events) >= count

        await until(enough, f"{count} watch events (have {len(self.events)})", timeout_s)
        return self.events

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


def event_tuples(events: list[WatchEvent]) -> list[tuple[EventType, str, bytes, int]]:
    return [(e.type, e.key, e.value, e.mod_revision) for e in events]


# --- KV ------------------------------------------------------------------------------------------


async def test_get_put_delete(store: EtcdStore, key_prefix: str) -> None:
    key = key_prefix + "a"
    assert await store.get(key) is None
    rev = await store.put(key, b"one")
    assert await store.get(key) == KeyValue(key, b"one", rev, create_revision=rev, version=1)
    rev2 = await store.put(key, "two")  # type: ignore[arg-type]  # str values are encoded as UTF-8
    assert await store.get(key) == KeyValue(key, b"two", rev2, create_revision=rev, version=2)
    assert await store.ping() >= rev2
    assert await store.delete(key) == 1
    assert await store.get(key) is None
    assert await store.delete(key) == 0


async def test_get_prefix_is_sorted_and_has_the_revision(store: EtcdStore, key_prefix: str) -> None:
    for name in ("c", "a", "b/x", "b"):
        await store.put(key_prefix + "p/" + name, name.encode())
    await store.put(key_prefix + "p", b"not under p/")
    last = await store.put(key_prefix + "q/z", b"not under p/ either")
    result = await store.get_prefix(key_prefix + "p/")
    assert [kv.key.removeprefix(key_prefix + "p/") for kv in result.items] == ["a", "b", "b/x", "c"]
    assert [kv.value for kv in result.items] == [b"a", b"b", b"b/x", b"c"]
    assert result.revision >= last
    assert (await store.get_prefix(key_prefix + "nothing/")).items == ()


async def test_delete_prefix_spares_neighbours(store: EtcdStore, key_prefix: str) -> None:
    for key in ("d/1", "d/2", "d/2/deep", "d", "d0", "e"):
        await store.put(key_prefix + key, b"x")
    assert await store.delete(key_prefix + "d/", prefix=True) == 3
    left = await store.get_prefix(key_prefix)
    assert [kv.key.removeprefix(key_prefix) for kv in left.items] == ["d", "d0", "e"]


async def test_put_under_an_unknown_lease_is_not_found(store: EtcdStore, key_prefix: str) -> None:
    with pytest.raises(errors.NotFound, match="lease"):
        await store.put(key_prefix + "k", b"v", lease=0x7EADBEEF)


# --- transactions --------------------------------------------------------------------------------


async def test_a_txn_compares_the_mod_revision(store: EtcdStore, key_prefix: str) -> None:
    key = key_prefix + "cas"
    created = await store.txn([Compare(key, 0)], [Put(key, b"v1")])
    assert created.succeeded
    again = await store.txn([Compare(key, 0)], [Put(key, b"v1-again")])
    assert not again.succeeded, "Compare(key, 0) means the key must not exist"
    assert again.revision >= created.revision

    updated = await store.txn([Compare(key, created.revision)], [Put(key, b"v2")])
    assert updated.succeeded and updated.revision > created.revision
    stale = await store.txn([Compare(key, created.revision)], [Put(key, b"v3")])
    assert not stale.succeeded
    got = await store.get(key)
    assert got is not None and (got.value, got.mod_revision) == (b"v2", updated.revision)


async def test_txn_applies_all_or_nothing(store: EtcdStore, key_prefix: str) -> None:
    a, b, c = (key_prefix + n for n in ("a", "b", "c/"))
    rev_a = await store.put(a, b"1")
    await store.put(c + "1", b"x")
    await store.put(c + "2", b"x")
    ops = [Put(a, b"2"), Put(b, b"new"), Delete(c, prefix=True)]
    failed = await store.txn([Compare(a, rev_a), Compare(b, rev_a)], ops)
    assert not failed.succeeded
    assert (await store.get(b)) is None and len((await store.get_prefix(c)).items) == 2

    done = await store.txn([Compare(a, rev_a), Compare(b, 0)], ops)
    assert done.succeeded
    got_a, got_b = await store.get(a), await store.get(b)
    assert got_a is not None and got_b is not None
    assert (got_a.value, got_b.value) == (b"2", b"new")
    assert got_a.mod_revision == got_b.mod_revision == done.revision
    assert (await store.get_prefix(c)).items == ()


async def test_racing_txns_on_one_revision_exactly_one_wins(
    store: EtcdStore, etcd_endpoint: str, key_prefix: str
) -> None:
    key = key_prefix + "race"
    rev = await store.put(key, b"start")
    async with EtcdStore([etcd_endpoint]) as other:
        racers = [
            s.txn([Compare(key, rev)], [Put(key, f"writer-{i}".encode())])
            for i, s in enumerate([store, other] * 4)
        ]
        results = await asyncio.gather(*racers)
    winners = [i for i, r in enumerate(results) if r.succeeded]
    assert len(winners) == 1
    got = await store.get(key)
    assert got is not None and got.value == f"writer-{winners[0]}".encode()
    assert got.mod_revision == results[winners[0]].revision


# --- leases --------------------------------------------------------------------------------------


async def test_lease_keys_vanish_after_expiry_and_refresh_says_not_found(
    store: EtcdStore, key_prefix: str
) -> None:
    lease = await store.grant_lease(1)
    assert lease.ttl == 1 and lease.id > 0
    key = key_prefix + "leased"
    await store.put(key, b"alive", lease=lease.id)
    got = await store.get(key)
    assert got is not None and got.lease == lease.id
    assert await store.refresh_lease(lease.id) == 1

    async def gone() -> bool:
        return await store.get(key) is None

    await until(gone, "the leased key to expire", timeout_s=5.0)
    with pytest.raises(errors.NotFound, match=f"lease {lease.id} has expired"):
        await store.refresh_lease(lease.id)
    await store.revoke_lease(lease.id)  # revoking an expired lease is fine


async def test_revoke_removes_keys_at_once_and_is_idempotent(store: EtcdStore, key_prefix: str) -> None:
    lease = await store.grant_lease(60)
    await store.put(key_prefix + "1", b"x", lease=lease.id)
    await store.put(key_prefix + "2", b"x", lease=lease.id)
    await store.revoke_lease(lease.id)
    assert (await store.get_prefix(key_prefix)).items == ()
    await store.revoke_lease(lease.id)
    with pytest.raises(errors.NotFound):
        await store.refresh_lease(lease.id)


@pytest.mark.parametrize("ttl", [0, -1, 1.5, True])
async def test_grant_lease_rejects_a_bad_ttl(store: EtcdStore, ttl: int) -> None:
    with pytest.raises(errors.InvalidArgument, match="ttl"):
        await store.grant_lease(ttl)


async def test_keep_alive_outlives_the_ttl_then_reports_revocation(store: EtcdStore, key_prefix: str) -> None:
    lease = await store.grant_lease(1)
    key = key_prefix + "kept"
    await store.put(key, b"x", lease=lease.id)
    keeper = store.keep_alive(lease)
    try:
        end = time.monotonic() + 2.5  # two and a half TTLs: the key must be there all along
        while time.monotonic() < end:
            assert await store.get(key) is not None, "the kept-alive key expired"
            assert not keeper.lost.is_set()
            await asyncio.sleep(0.1)
        await store.revoke_lease(lease.id)
        await asyncio.wait_for(keeper.lost.wait(), timeout=3.0)
        assert await store.get(key) is None
        assert keeper.task is not None and keeper.task.done()
    finally:
        await keeper.stop()


async def test_keep_alive_rides_out_a_restart_but_not_a_ttl_long_outage(restartable_etcd, key_prefix) -> None:
    async with EtcdStore([restartable_etcd.endpoint], timeout=1.0) as store:
        lease = await store.grant_lease(2)
        keeper = store.keep_alive(lease)
        await store.put(key_prefix + "k", b"x", lease=lease.id)
        await asyncio.to_thread(restartable_etcd.restart)
        await until_available(store)
        end = time.monotonic() + 2.5  # past the TTL (and etcd's lease extension on restart)
        while time.monotonic() < end:
            assert await store.get(key_prefix + "k") is not None, "the kept-alive key expired"
            assert not keeper.lost.is_set()
            await asyncio.sleep(0.1)

        await asyncio.to_thread(restartable_etcd.stop)
        await asyncio.wait_for(keeper.lost.wait(), timeout=4.0)
        await keeper.stop()


# --- watches -------------------------------------------------------------------------------------


async def test_watch_sees_puts_and_deletes_in_order(store: EtcdStore, key_prefix: str) -> None:
    watcher = Collector(store.watch_prefix(key_prefix + "w/", start_revision=await store.ping() + 1))
    try:
        r1 = await store.put(key_prefix + "w/a", b"1")
        r2 = await store.put(key_prefix + "w/a", b"2")
        await store.put(key_prefix + "elsewhere", b"ignored")
        await store.delete(key_prefix + "w/a")
        r3 = await store.ping()
        events = await watcher.wait_for(3)
    finally:
        await watcher.close()
    assert event_tuples(events) == [
        (EventType.PUT, key_prefix + "w/a", b"1", r1),
        (EventType.PUT, key_prefix + "w/a", b"2", r2),
        (EventType.DELETE, key_prefix + "w/a", b"", r3),
    ]
    assert [e.prev_value for e in events] == [None, b"1", b"2"]


async def test_watch_from_now_skips_the_past(store: EtcdStore, key_prefix: str) -> None:
    await store.put(key_prefix + "before", b"old")
    watch = store.watch_prefix(key_prefix)
    first = asyncio.ensure_future(anext(watch))
    try:
        deadline = time.monotonic() + 5.0
        ticks = 0
        while not first.done():  # the watch starts "now" at some point: write until it sees a write
            assert time.monotonic() < deadline, "the watch saw none of the writes"
            ticks += 1
            await store.put(key_prefix + "tick", str(ticks).encode())
            await asyncio.wait([first], timeout=0.05)
        assert {e.key for e in first.result()} == {key_prefix + "tick"}
    finally:
        first.cancel()
        await asyncio.wait([first])
        await watch.aclose()  # type: ignore[attr-defined]


async def test_watch_from_a_revision_replays_history(store: EtcdStore, key_prefix: str) -> None:
    revs = [await store.put(key_prefix + f"h/{i}", str(i).encode()) for i in range(5)]
    await store.delete(key_prefix + "h/", prefix=True)
    watcher = Collector(store.watch_prefix(key_prefix + "h/", start_revision=revs[2]))
    try:
        events = await watcher.wait_for(3 + 5)
    finally:
        await watcher.close()
    puts = [(EventType.PUT, key_prefix + f"h/{i}", str(i).encode(), revs[i]) for i in (2, 3, 4)]
    assert event_tuples(events[:3]) == puts
    assert [(e.type, e.key) for e in events[3:]] == [
        (EventType.DELETE, key_prefix + f"h/{i}") for i in range(5)
    ]
    assert len({e.mod_revision for e in events[3:]}) == 1, "one delete-prefix is one revision"


@pytest.mark.parametrize("outage", ["restart", "kill"])
async def test_watch_resumes_across_an_etcd_restart_exactly_once(
    restartable_etcd, key_prefix: str, outage: str
) -> None:
    written: list[tuple[EventType, str, bytes, int]] = []
    async with EtcdStore([restartable_etcd.endpoint], timeout=2.0) as store:

        async def put(i: int) -> None:
            key, value = key_prefix + f"k{i % 3}", f"v{i}".encode()
            written.append((EventType.PUT, key, value, await store.put(key, value)))

        start = await store.ping() + 1
        # The consumer holds after the first 6 events, so the watch is certainly disconnected while the
        # next ones are written, and must replay them from where it left off.
        watcher = Collector(store.watch_prefix(key_prefix, start_revision=start), hold_at=6)
        try:
            for i in range(5):
                await put(i)
            await store.delete(key_prefix + "k0")
            written.append((EventType.DELETE, key_prefix + "k0", b"", await store.ping()))
            await watcher.wait_for(6)

            await asyncio.to_thread(restartable_etcd.kill if outage == "kill" else restartable_etcd.stop)
            await asyncio.to_thread(restartable_etcd.start)
            await until_available(store)
            for i in range(5, 12):
                await put(i)
            watcher.resume()
            await watcher.wait_for(len(written), timeout_s=8.0)
            await put(12)  # and it goes on live
            await watcher.wait_for(len(written))
            await store.put(key_prefix + "sentinel", b"end")
            await watcher.wait_for(len(written) + 1)
        finally:
            await watcher.close()
    assert event_tuples(watcher.events[: len(written)]) == written
    assert [e.key for e in watcher.events[len(written) :]] == [key_prefix + "sentinel"]


async def test_watch_raises_watch_compacted(restartable_etcd, key_prefix: str) -> None:
    async with EtcdStore([restartable_etcd.endpoint]) as store:
        first = await store.put(key_prefix + "a", b"1")
        await store.put(key_prefix + "a", b"2")
        last = await store.put(key_prefix + "a", b"3")
        async with Etcd3Client([restartable_etcd.endpoint]) as raw:
            assert raw.kv is not None
            await raw.kv.compact(last, physical=True, timeout=5.0)
        with pytest.raises(WatchCompacted) as caught:
            async with contextlib.aclosing(store.watch_prefix(key_prefix, start_revision=first)) as w:  # type: ignore[type-var]
                async for _ in w:
                    pytest.fail("a compacted watch must not yield")
        assert caught.value.compact_revision == last
        assert "re-list" in str(caught.value)


def _watch_streams(endpoint: str) -> float:
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=2.0) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("etcd_debugging_mvcc_watch_stream_total "):
                return float(line.split()[1])
    raise AssertionError("etcd exports no etcd_debugging_mvcc_watch_stream_total")


async def test_closing_a_watch_cancels_its_stream(restartable_etcd, key_prefix: str) -> None:
    endpoint = restartable_etcd.endpoint

    async def streams(n: float) -> bool:
        return await asyncio.to_thread(_watch_streams, endpoint) == n

    async with EtcdStore([endpoint]) as store:
        watch = store.watch_prefix(key_prefix)
        pending = asyncio.ensure_future(anext(watch))
        await until(lambda: streams(1), "the watch stream to open")
        await store.put(key_prefix + "x", b"1")
        assert [e.key for e in await pending] == [key_prefix + "x"]
        await watch.aclose()  # type: ignore[attr-defined]
        await until(lambda: streams(0), "etcd to see the watch stream cancelled")


# --- outages -------------------------------------------------------------------------------------


async def test_unavailable_names_the_endpoint_and_the_store_recovers(restartable_etcd, key_prefix) -> None:
    async with EtcdStore([restartable_etcd.endpoint], timeout=1.0) as store:
        await store.put(key_prefix + "k", b"kept")
        await asyncio.to_thread(restartable_etcd.stop)
        for call in (store.get(key_prefix + "k"), store.put(key_prefix + "k", b"x"), store.ping()):
            with pytest.raises(errors.Unavailable) as caught:
                await call
            assert restartable_etcd.endpoint in caught.value.message
            assert "is it running? set MCP_ETCD_ENDPOINTS" in caught.value.message
        await asyncio.to_thread(restartable_etcd.start)
        await until_available(store)
        got = await store.get(key_prefix + "k")
        assert got is not None and got.value == b"kept"


async def test_a_store_that_never_reached_etcd_says_unavailable() -> None:
    with socket.socket() as sock:  # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{sock.getsockname()[1]}"
    async with EtcdStore([endpoint], timeout=1.0) as store:
        with pytest.raises(errors.Unavailable, match=f"etcd at {endpoint} is unreachable"):
            await store.grant_lease(5)


async def test_a_task_being_cancelled_stops_instead_of_retrying(key_prefix: str) -> None:
    """grpc can absorb a cancel inside a call and fail the call instead; the store must then raise
    CancelledError, not a transient error a watch would retry forever (the election hang in CI)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{sock.getsockname()[1]}"
    async with EtcdStore([endpoint], timeout=1.0) as store:

        async def absorbed_cancel_then_call() -> None:
            asyncio.current_task().cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(1)  # the cancel lands here and is absorbed, as grpc's would be
            await store.get(key_prefix + "k")

        async def absorbed_cancel_then_watch() -> None:
            asyncio.current_task().cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(1)
            async with contextlib.aclosing(store.watch_prefix(key_prefix, start_revision=1)) as watch:
                async for _ in watch:
                    pass

        for work in (absorbed_cancel_then_call, absorbed_cancel_then_watch):
            task = asyncio.create_task(work())
            done, _ = await asyncio.wait([task], timeout=10)
            assert done, f"{work.__name__} went on after its task was cancelled"
            assert task.cancelled(), task.exception()


async def test_a_closed_store_says_so(etcd_endpoint: str) -> None:
    store = EtcdStore([etcd_endpoint])
    with pytest.raises(errors.FailedPrecondition, match="connect"):
        await store.get("/x")
    await store.connect()
    await store.ping()
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(errors.FailedPrecondition):
        await store.ping()


async def test_several_endpoints_may_be_host_names(etcd_endpoint: str, key_prefix: str) -> None:
    """A cluster's endpoints as DNS names (etcd-0.etcd:2379, ...): names among several are resolved, and
    a member that does not answer (port 1 here) is skipped by round robin."""
    port = etcd_endpoint.rpartition(":")[2]
    names = [f"{socket.gethostname()}:{port}", f"{socket.gethostname()}:1"]
    async with EtcdStore(names, timeout=5.0) as s:
        await until_available(s)
        for i in range(4):  # round robin: some calls are sent while the dead address is tried too
            await s.put(f"{key_prefix}k{i}", b"v")
        assert [kv.key for kv in (await s.get_prefix(key_prefix)).items] == [
            f"{key_prefix}k{i}" for i in range(4)
        ]
        await s.delete(key_prefix, prefix=True)


def test_an_endpoint_name_that_does_not_resolve_is_a_clear_error() -> None:
    with pytest.raises(
        errors.InvalidArgument, match=r"etcd endpoint 'no-such-host\.invalid:2379': cannot resolve"
    ):
        EtcdStore(["127.0.0.1:2379", "no-such-host.invalid:2379"])
    with pytest.raises(errors.InvalidArgument, match=r"etcd endpoint '127.0.0.1': expected host:port"):
        EtcdStore(["127.0.0.1", "127.0.0.2:2379"])
