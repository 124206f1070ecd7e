"""mcpcore.mirror against a real etcd: list, watch, deletes, and a start while etcd is away."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from pathlib import Path

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


def _etcdctl(endpoint: str, *args: str) -> None:
    subprocess.run(
        ["etcdctl", f"--endpoints={endpoint}", *args], check=True, capture_output=True,
        env={"ETCDCTL_API": "3"}, timeout=30,
    )  # fmt: skip


async def test_a_watch_whose_history_was_compacted_lists_again_and_counts_it(restartable_etcd):
    # the etcd make up and the tests run compacts its history by itself (else it fills its quota)
    cmdline = (await asyncio.to_thread(Path(f"/proc/{restartable_etcd.proc.pid}/cmdline").read_bytes)).split(
        b"\0"
    )
    assert b"--auto-compaction-mode=periodic" in cmdline and b"--auto-compaction-retention=10m" in cmdline
    async with EtcdStore([restartable_etcd.endpoint]) as store:
        signal = Signal()
        await store.put("/c/old", b"1")
        mirror = PrefixMirror(store, "/c/", on_change=signal, on_error=signal, name="t")
        await mirror.start()
        await mirror.stop()  # the mirror is away (a long etcd outage, say) while history goes on
        await store.put("/c/new", b"2")
        await store.delete("/c/old")
        revision = await store.ping()
        await asyncio.to_thread(_etcdctl, restartable_etcd.endpoint, "compact", str(revision))
        mirror.start_in_background()  # resumes from the revision it had: compacted away
        try:
            await signal.until(lambda: mirror.values == {"/c/new": b"2"})
            assert "t_relist" in signal.calls
            assert mirror.generation == 2 and mirror.revision >= revision
        finally:
            await mirror.stop()


async def test_etcd_restored_from_a_snapshot_makes_the_mirror_list_again(restartable_etcd, tmp_path):
    async with EtcdStore([restartable_etcd.endpoint], timeout=2.0) as store:
        await store.put("/r/kept", b"1")
        restartable_etcd.save_snapshot(tmp_path / "backup.db")
        for i in range(20):  # history after the backup: its revisions are lost with the restore
            await store.put(f"/r/later{i}", b"x")
        signal = Signal()
        mirror = PrefixMirror(store, "/r/", on_change=signal, on_error=signal, name="t")
        await mirror.start()
        try:
            before = mirror.revision
            await asyncio.to_thread(restartable_etcd.restore_snapshot, tmp_path / "backup.db")
            await signal.until(lambda: mirror.values == {"/r/kept": b"1"}, timeout_s=20)
            assert "t_relist" in signal.calls and mirror.revision < before
            await store.put("/r/after", b"2")  # a write after the restore is seen (no future revision)
            await signal.until(lambda: mirror.values.get("/r/after") == b"2")
        finally:
            await mirror.stop()
