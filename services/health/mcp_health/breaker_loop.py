"""Breaker levels from error rates: aggregate every router's window, decide, write ``/mcp/breakers/<m>``.

Invariants:
- The policy is ``/mcp/config/breaker`` (DESIGN.md section 8's JSON) or the default when absent. It and the
  breaker documents get the mesh's one rule for operator documents (``records.OperatorDocs``, fed by
  ``on_change``): one that does not parse is logged, counted, published to ``/mcp/rejected/health/<id>``,
  and the last good value stays in force.
- Only fresh router windows count: written within the policy's metrics window, as measured on this
  process's monotonic clock from when each window's new value arrived (never a router's ``at`` against
  this host's clock: a router whose clock is off by a minute would be ignored, or counted forever); only
  server-side error classes count (``levels.error_rate``), so clients sending bad input can never open a
  breaker.
- A decision is written by compare-and-swap on the key's revision as this instance last saw it: an
  operator's write in between wins, and the next check decides again. Only the leader writes, fenced: the
  write also compares the health leader key (``mcpcore.fencing``), so a deposed leader's write fails.
- Every decision is logged and reflected in ``mcp_breaker_level``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from mcp_health.alerts import Alert, Alerter
from mcp_health.levels import BreakerController, error_rate
from mcpcore.errors import InvalidArgument, MCPError
from mcpcore.fencing import Fence
from mcpcore.keys import Keyspace
from mcpcore.mirror import PrefixMirror
from mcpcore.records import (
    BreakerDoc,
    BreakerPolicy,
    StatsDoc,
    published_operator_docs,
)
from mcpcore.records.breaker import DEFAULT_POLICY
from mcpcore.store import Compare, Put, Store

__all__ = ["BreakerLoop"]

log = logging.getLogger(__name__)


class BreakerLoop:
    def __init__(
        self,
        mirror: PrefixMirror,
        store: Store,
        keys: Keyspace,
        alerter: Alerter,
        *,
        fence: Callable[[], Fence | None],
        on_level: Callable[[str, int], None] = lambda model, level: None,
        on_rejected: Callable[[str], None] = lambda key: None,
        on_error: Callable[[str], None] = lambda loop: None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        instance: str = "health",
    ) -> None:
        self.operator_docs, self.rejections_publisher = published_operator_docs(
            "health",
            instance,
            store,
            keys.rejected("health", instance),
            on_rejected=on_rejected,
            on_error=on_error,
            clock=clock,
        )
        self._mirror, self._store, self._keys, self._alerter = mirror, store, keys, alerter
        self._monotonic = monotonic
        # stats key -> (mod revision, local arrival, its window: parsed once per revision, None if bad)
        self._arrived: dict[str, tuple[int, float, dict[str, int] | None]] = {}
        self._fence, self._on_level, self._on_rejected, self._on_error = (
            fence,
            on_level,
            on_rejected,
            on_error,
        )
        self._clock = clock
        self.policy: BreakerPolicy = DEFAULT_POLICY
        self.controller = BreakerController(self.policy)
        # what this instance wrote, until the mirror shows it: the next check must not decide it twice
        self._written: dict[str, tuple[BreakerDoc, int]] = {}  # model -> (doc, revision written at)

    def start(self) -> None:
        self.rejections_publisher.start()

    async def stop(self) -> None:
        await self.rejections_publisher.stop()

    def on_change(self, keys: set[str]) -> None:
        """Apply the one rule to the operator documents among ``keys`` (the mirror's changed keys)."""
        for key in keys:
            raw = self._mirror.values.get(key)
            if self._keys.parse_breaker_key(key) is not None:
                self.operator_docs.apply(key, raw, BreakerDoc.parse, "breaker")
            elif key == self._keys.breaker_config():
                found = self.operator_docs.apply(key, raw, BreakerPolicy.parse, "breaker_policy")
                policy = found if isinstance(found, BreakerPolicy) else DEFAULT_POLICY
                if policy != self.policy:
                    log.info("breaker policy now %s", policy)
                    self.policy = policy
                    self.controller.policy = policy  # keeps the step-down timers

    def _windows(self) -> dict[str, list[dict]]:
        windows: dict[str, list[dict]] = {}
        local = self._monotonic()
        arrived: dict[str, tuple[int, float, dict[str, int] | None]] = {}
        for key, raw in self._mirror.values.items():
            parsed = self._keys.parse_stats_key(key)
            if parsed is None:
                continue
            revision = self._mirror.revisions.get(key, 0)
            seen = self._arrived.get(key)
            if seen is None or seen[0] != revision:
                seen = (revision, local, self._window_of(key, raw))
            arrived[key] = seen
            if local - seen[1] > self.policy.metrics_window_s:
                continue  # not rewritten for a whole window: its router stopped reporting
            if seen[2] is not None:
                windows.setdefault(parsed[1], []).append(seen[2])
        self._arrived = arrived  # keys gone from etcd are forgotten
        return windows

    def _window_of(self, key: str, raw: bytes) -> dict[str, int] | None:
        try:
            return StatsDoc.parse(key, raw).window()
        except InvalidArgument as exc:  # a window with a bad count: left out, said once per value
            self._on_rejected("stats")
            log.warning("ignoring %s: %s", key, exc.message)
            return None

    async def check(self) -> None:
        now = self._clock()
        windows = self._windows()
        models = set(windows) | {m for k in self._mirror.values if (m := self._keys.parse_breaker_key(k))}
        for model in sorted(models):
            try:
                rate, requests = error_rate(windows.get(model, ()))
            except InvalidArgument as exc:  # a router's window with a bad count: skip this model this time
                self._on_rejected("stats")
                log.warning("ignoring the stats of %s: %s", model, exc.message)
                continue
            key = self._keys.breaker(model)
            current = self._current(model, key)
            self._on_level(model, current.level_at(now) if current else 0)
            decision = self.controller.decide(model, rate, requests, now, current)
            fence = self._fence() if decision is not None else None
            if decision is None or fence is None:
                continue
            await self._write(model, key, decision.doc, decision.previous, decision.reason, fence=fence)

    def _current(self, model: str, key: str) -> BreakerDoc | None:
        written = self._written.get(model)
        if written is not None and self._mirror.revisions.get(key, 0) < written[1]:
            return written[0]  # the mirror has not caught up with our own write yet
        self._written.pop(model, None)
        doc = self.operator_docs.get(key)  # the last good one, if an operator's write was rejected
        return doc if isinstance(doc, BreakerDoc) else None

    async def _write(
        self, model: str, key: str, doc: BreakerDoc, previous: int, reason: str, *, fence: Fence
    ) -> None:
        revision = self._mirror.revisions.get(key, 0)
        try:
            result = await self._store.txn(
                [Compare(key, revision), fence.compare()], [Put(key, doc.to_json())]
            )
        except MCPError as exc:
            self._on_error("breaker_write")
            log.warning("could not write the breaker of %s: %s", model, exc.message)
            return
        if not result.succeeded:
            log.info("breaker of %s changed meanwhile (or this instance no longer leads); deciding again "
                     "next check", model)  # fmt: skip
            return
        self._written[model] = (doc, result.revision)
        log.warning("breaker of %s: level %d -> %d (%s)", model, previous, doc.level, reason)
        self._on_level(model, doc.level)
        alert = Alert(name="BreakerOpen", severity="warning", labels={"model": model},
                      annotations={"summary": f"breaker of {model} at level {doc.level}", "reason": reason},
                      starts_at=self._clock())  # fmt: skip
        if doc.level > 0:
            await self._alerter.fire(alert)
        else:
            await self._alerter.resolve(alert)
