"""mcpcore.mirror against a real etcd: list, watch, deletes, and a start while etcd is away."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from mcpcore.etcd_store import EtcdStore
from mcpcore.mirror import PrefixMirror


class Signal:
    """Set by the mirror's callbacks; ``until`` re-checks a condition after each one (no polling)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.calls: list[object] = []

    def __call__(self, arg: object) -> None:
        self.calls.append(arg)
        self.event.set()

    async def until(self, predicate: Callable[[], bool], timeout_s: float = 15.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not predicate():
                self.event.clear()
                await self.event.wait()


async def test_list_then_watch_keeps_values_and_reports_touched_keys(store, key_prefix):
    await store.put(f"{key_prefix}a", b"1")
    changes = Signal()
    mirror = PrefixMirror(store, key_prefix, on_change=changes)
    await mirror.start()
    try:
        assert mirror.values == {f"{key_prefix}a": b"1"} and changes.calls == [{f"{key_prefix}a"}]
        await store.put(f"{key_prefix}b", b"2")
        await store.delete(f"{key_prefix}a")
        await changes.until(
            lambda: f"{key_prefix}a" not in mirror.values and f"{key_prefix}b" in mirror.values
        )
        assert mirror.values == {f"{key_prefix}b": b"2"}
        assert set().union(*changes.calls[1:]) == {f"{key_prefix}a", f"{key_prefix}b"}
        assert mirror.revisions[f"{key_prefix}b"] <= mirror.revision
    finally:
        await mirror.stop()


async def test_starting_while_etcd_is_away_syncs_when_it_comes_back(restartable_etcd):
    restartable_etcd.stop()
    async with EtcdStore([restartable_etcd.endpoint], timeout=1.0) as store:
        signal = Signal()
        mirror = PrefixMirror(store, "/m/", on_change=signal, on_error=signal, name="t")
        mirror.start_in_background()
        try:
            await signal.until(lambda: "t_watch" in signal.calls)  # it tried, failed, and counted it
            assert not mirror.synced.is_set()
            restartable_etcd.start()
            await signal.until(mirror.synced.is_set)  # the mirror's own retry got through
            await store.put("/m/k", b"v")
            await signal.until(lambda: mirror.values.get("/m/k") == b"v")
        finally:
            await mirror.stop()
