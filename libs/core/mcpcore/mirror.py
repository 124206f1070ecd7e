"""A local mirror of one etcd prefix: list, then watch from the listed revision, forever.

Invariants:
- ``values`` holds every key under the prefix as of ``revision``; events are applied in revision order,
  each exactly once (the store's watch resumes from the last revision across reconnects).
- When the history a watch needs was compacted, or etcd went back in revisions (restored from a
  snapshot, or its data lost: ``StoreRewound``), the mirror lists again and reports a full reload; every
  such re-list is counted (``on_error("<name>_relist")``), and a list that fails backs off like a watch.
- The loop never dies: errors are logged, counted (``on_error``) and retried with backoff, and the mirror
  keeps its last state meanwhile (services keep working from it while etcd is away).
- ``on_change(keys)`` runs after each applied batch with the keys it touched (or every key after a
  reload); it must not block. If it raises, the error is logged and counted and the mirror goes on: the
  values stay applied (a failing consumer never makes the mirror skip or repeat events).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from mcpcore.store import EventType, Store, WatchCompacted

__all__ = ["PrefixMirror"]

log = logging.getLogger(__name__)


class PrefixMirror:
    def __init__(
        self,
        store: Store,
        prefix: str,
        *,
        on_change: Callable[[set[str]], None] = lambda keys: None,
        on_error: Callable[[str], None] = lambda loop: None,
        on_applied: Callable[[float], None] = lambda seconds: None,
        name: str = "mirror",
    ) -> None:
        self._store = store
        self.prefix = prefix
        self._on_change = on_change
        self._on_error = on_error
        self._on_applied = on_applied
        self._name = name
        self.values: dict[str, bytes] = {}
        self.revisions: dict[str, int] = {}
        self.revision = 0
        self.generation = 0  # full lists so far: a consumer caching what it wrote re-checks after one
        self.synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """List once (raises if etcd is unreachable), then keep watching in the background."""
        await self._list()
        self.start_in_background()

    def start_in_background(self) -> None:
        """List (retrying while etcd is away) and watch, all in the background; ``synced`` tells when."""
        self._task = asyncio.create_task(self._watch(), name=f"{self._name}-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _list(self) -> None:
        snapshot = await self._store.get_prefix(self.prefix)
        touched = set(self.values) | {kv.key for kv in snapshot.items}
        self.values = {kv.key: kv.value for kv in snapshot.items}
        self.revisions = {kv.key: kv.mod_revision for kv in snapshot.items}
        self.revision = snapshot.revision
        self.generation += 1
        self.synced.set()
        self._notify(touched)

    def _notify(self, keys: set[str]) -> None:
        try:
            self._on_change(keys)
        except Exception:
            self._on_error(f"{self._name}_apply")
            log.exception("%s: applying %d changed key(s) failed; the mirror goes on", self._name, len(keys))

    async def _watch(self) -> None:
        backoff, relist = 0.1, not self.synced.is_set()
        while True:
            try:
                if relist:
                    await self._list()
                    relist = False
                stream = self._store.watch_prefix(self.prefix, start_revision=self.revision + 1)
                async with contextlib.aclosing(stream) as batches:
                    async for batch in batches:
                        started = time.perf_counter()
                        touched = set()
                        for ev in batch:
                            self.revision = max(self.revision, ev.mod_revision)
                            touched.add(ev.key)
                            if ev.type is EventType.DELETE:
                                self.values.pop(ev.key, None)
                                self.revisions.pop(ev.key, None)
                            else:
                                self.values[ev.key] = ev.value
                                self.revisions[ev.key] = ev.mod_revision
                        self._notify(touched)
                        self._on_applied(time.perf_counter() - started)
                        backoff = 0.1
            except asyncio.CancelledError:
                raise
            except WatchCompacted as exc:  # compacted history, or etcd went back (StoreRewound)
                self._on_error(f"{self._name}_relist")
                log.warning("%s: %s; listing again", self._name, exc)
                relist = True
            except Exception as exc:  # a failed watch, or a failed list: both back off and are counted
                self._on_error(f"{self._name}_watch")
                log.warning(
                    "%s: %s failed (%s); working from the last state, retrying in %.1fs",
                    self._name,
                    "listing" if relist else "watch",
                    exc,
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
