"""The scheduler's state mirror against a real etcd: a large list is applied in chunks, never at once, and
a re-list is reported only once the indexes hold all of it (what the reconciler plans from)."""

from __future__ import annotations

import asyncio
import subprocess

from mcp_scheduler.state import Changes, ClusterState
from mcp_scheduler.view import ModelSpecDoc
from mcpcore.etcd_store import EtcdStore
from mcpcore.keys import Keyspace
from mcpcore.store import Put

MODELS = 50


async def _fill(store: EtcdStore, keys: Keyspace, names: list[str]) -> None:
    ops = [Put(keys.model_spec(n), ModelSpecDoc(n, ("1",)).to_json()) for n in names]
    await store.txn([], ops)


async def test_a_large_list_is_applied_in_chunks_and_reported_whole(restartable_etcd):
    keys = Keyspace("/chunks/mcp")
    async with EtcdStore([restartable_etcd.endpoint]) as store:
        await _fill(store, keys, [f"m{i:02d}" for i in range(MODELS)])
        state = ClusterState(store, keys, apply_chunk=7)
        seen: list[tuple[int, bool, bool]] = []  # (specs visible, reload, applying) per report

        def listener(changes: Changes) -> None:
            seen.append((len(state.view().specs), changes.reload, state.applying))

        state.listen(listener)
        await state.start()  # returns once all of it is applied
        try:
            assert len(state.view().specs) == MODELS and not state.applying
            assert len(seen) == -(-MODELS // 7)  # one report per chunk, not one for all
            assert [r[:2] for r in seen if r[1]] == [(MODELS, True)]
            assert all(not r[1] for r in seen[:-1])  # the reload comes with the last chunk, whole
            assert all(r[2] for r in seen)  # applied turn by turn, ``applying`` meanwhile

            # etcd compacts past what the mirror saw while it was away: it lists again, in chunks
            await state.mirror.stop()
            await _fill(store, keys, [f"n{i:02d}" for i in range(MODELS)])
            await store.delete(keys.model_spec("m00"))  # a second revision: the one it resumes at is gone
            revision = await store.ping()
            await asyncio.to_thread(
                subprocess.run,
                ["etcdctl", f"--endpoints={restartable_etcd.endpoint}", "compact", str(revision)],
                check=True, capture_output=True, env={"ETCDCTL_API": "3"}, timeout=30,
            )  # fmt: skip
            seen.clear()
            state.mirror.start_in_background()
            async with asyncio.timeout(15):
                while not any(r[1] for r in seen):
                    await state.wait_change(1.0)
            reloads = [r for r in seen if r[1]]
            assert len(reloads) == 1 and reloads[0][0] == 2 * MODELS - 1  # reported once, with all of it
            assert len(seen) > 1  # applied in several turns
        finally:
            await state.stop()
