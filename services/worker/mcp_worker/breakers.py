"""The breaker levels in force for this worker: a list-then-watch of ``/mcp/breakers/`` (DESIGN.md 4, 7, 8).

The worker acts on level 1 and up (its models' max batch size halves); this module only tracks the level
of each model and reports changes through ``on_level(model, level)``.

Invariants:
- Breaker documents get the mesh's one rule for operator documents (``records.OperatorDocs``): one that
  does not parse is logged, counted (``on_rejected("breaker")``), published to
  ``/mcp/rejected/worker/<id>``, and the last good level of that model stays in force. A deleted key means
  level 0.
- ``until`` bounds an operator's forced level: once it has passed, the level in force is 0 until the
  document is replaced. An expiry timer re-evaluates at the earliest pending ``until``.
- ``on_level`` is called on the event loop, once per change of the level in force, never for a repeat.
- The loop never dies: a failed list or watch is logged, counted (``on_error("breaker_watch")``) and
  resumed after a backoff; a compacted history is re-listed. Serving never waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from mcpcore.keys import Keyspace
from mcpcore.mirror import PrefixMirror
from mcpcore.records import BreakerDoc, published_operator_docs
from mcpcore.store import EventType, Store

__all__ = ["BreakerWatch", "level_in_force"]

log = logging.getLogger(__name__)
_MAX_TIMER_S = 60.0  # re-check expiries at least this often, so a wall-clock step cannot stall one


def level_in_force(doc: BreakerDoc | None, now: float) -> int:
    """The level ``doc`` imposes at ``now`` (unix seconds): 0 once its ``until`` has passed."""
    return 0 if doc is None else doc.level_at(now)


class BreakerWatch:
    def __init__(
        self,
        store: Store,
        keys: Keyspace,
        *,
        on_level: Callable[[str, int], None],
        on_rejected: Callable[[str], None] = lambda key: None,
        on_error: Callable[[str], None] = lambda loop: None,
        clock: Callable[[], float] = time.time,
        instance: str = "worker",
    ) -> None:
        self._keys = keys
        self._on_level = on_level
        self._on_error = on_error
        self.operator_docs, self.rejections_publisher = published_operator_docs(
            "worker",
            instance,
            store,
            keys.rejected("worker", instance),
            on_rejected=on_rejected,
            on_error=on_error,
            clock=clock,
        )
        self._clock = clock
        self._docs: dict[str, BreakerDoc] = {}  # model -> last good document
        self._levels: dict[str, int] = {}  # model -> level in force (absent: 0)
        self._rearm = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.mirror = PrefixMirror(
            store, keys.breakers_prefix(), on_change=self._changed, on_error=on_error, name="worker-breakers"
        )

    @property
    def synced(self) -> asyncio.Event:
        return self.mirror.synced

    def level(self, model: str) -> int:
        return self._levels.get(model, 0)

    def levels(self) -> dict[str, int]:
        return dict(self._levels)

    def start(self) -> None:
        """Never waits for etcd: the mirror lists and watches in the background, retrying."""
        self.mirror.start_in_background()
        self._task = asyncio.create_task(self._expiries(), name="worker-breaker-expiry")
        self.rejections_publisher.start()

    async def stop(self) -> None:
        await self.rejections_publisher.stop()
        await self.mirror.stop()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _changed(self, keys: set[str]) -> None:
        for key in keys:
            value = self.mirror.values.get(key)
            self._apply(EventType.DELETE if value is None else EventType.PUT, key, value or b"")

    def _apply(self, kind: EventType, key: str, value: bytes) -> str:
        """Apply one event; returns the model it is about ("" for a key that is not a breaker)."""
        model = self._keys.parse_breaker_key(key)
        if model is None:
            return ""
        doc = self.operator_docs.apply(
            key, None if kind is EventType.DELETE else value, BreakerDoc.parse, "breaker"
        )
        if doc is None:
            self._docs.pop(model, None)
        else:
            self._docs[model] = doc
        self._evaluate(model)
        self._rearm.set()
        return model

    # -- levels in force -------------------------------------------------------------------------------
    def _evaluate(self, model: str) -> None:
        level = level_in_force(self._docs.get(model), self._clock())
        if level == self.level(model):
            return
        if level:
            self._levels[model] = level
        else:
            self._levels.pop(model, None)
        doc = self._docs.get(model)
        log.info(
            "breaker of %s now at level %d (%s)", model, level, doc.reason if doc and level else "closed"
        )
        try:
            self._on_level(model, level)
        except Exception:
            self._on_error("breaker_apply")
            log.exception("applying breaker level %d to %s failed", level, model)

    async def _expiries(self) -> None:
        """Drop forced levels whose ``until`` has passed, at the earliest one pending."""
        while True:
            self._rearm.clear()
            now = self._clock()
            pending = [d.until for d in self._docs.values() if d.until is not None and d.until > now]
            timeout = min(min(pending) - now, _MAX_TIMER_S) if pending else None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._rearm.wait()
            for model in sorted(self._docs):
                self._evaluate(model)
