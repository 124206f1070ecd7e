"""The one rule for a malformed operator document, and where each service publishes what it rejected.

The rule (DESIGN.md section 4), the same in every service that reads an operator document (router,
scheduler, health, worker), applied by ``OperatorDocs``:
- A document that parses is in force, and clears any rejection of its key.
- A document that does not parse is rejected: logged, counted (``on_rejected(kind)``: the service's
  ``mcp_config_rejected_total``), recorded with its reason, and the last good value of that key stays in
  force; with none yet, the key counts as absent.
- A deleted key is absent, and no longer rejected.

Each service publishes its current rejections to ``/mcp/rejected/<service>/<instance>`` (a
``RejectionsDoc``, under a lease of its own, so it goes with the process): ``mcpctl status`` lists them,
naming the key, the service and why. ``RejectionPublisher`` writes it when the rejections change; it uses
only the ``Store`` interface and never dies (errors are logged, counted, and retried).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from mcpcore.errors import InvalidArgument, MCPError
from mcpcore.records.base import Reader, dumps
from mcpcore.store import KeepAlive, Store

__all__ = ["OperatorDocs", "Rejection", "RejectionPublisher", "RejectionsDoc", "published_operator_docs"]

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Rejection:
    key: str
    kind: str  # the document kind: traffic, spec, breaker, breaker_policy
    reason: str  # the parse error: names the key and the field
    at: float  # when it was rejected (unix s)


@dataclass(frozen=True)
class RejectionsDoc:
    """One service instance's current rejections (``/mcp/rejected/<service>/<instance>``)."""

    service: str
    instance: str
    rejections: tuple[Rejection, ...] = ()

    @classmethod
    def parse(cls, key: str, raw: bytes | str) -> RejectionsDoc:
        d = Reader(key, raw, ("service", "instance", "rejections"), kind="rejected", strict=False)
        items = d.get("rejections", [])
        if not isinstance(items, list):
            d.fail("rejections", "expected a list")
        out = []
        for i, item in enumerate(items):
            r = Reader(
                f"{key}: rejections[{i}]",
                item,
                ("key", "kind", "reason", "at"),
                kind="rejected",
                strict=False,
            )
            out.append(
                Rejection(
                    r.str_("key"), r.str_("kind", "", empty=True), r.str_("reason"), r.float_("at", 0.0)
                )
            )
        return cls(d.str_("service"), d.str_("instance"), tuple(out))

    def to_json(self) -> bytes:
        return dumps(
            {
                "service": self.service,
                "instance": self.instance,
                "rejections": [
                    {"key": r.key, "kind": r.kind, "reason": r.reason, "at": r.at} for r in self.rejections
                ],
            }
        )


class OperatorDocs(Generic[T]):
    """Operator documents of one service, by key, under the one rule (module docstring)."""

    def __init__(
        self,
        service: str,
        instance: str,
        *,
        on_rejected: Callable[[str], None] = lambda kind: None,
        on_change: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.service, self.instance = service, instance
        self._on_rejected, self._on_change, self._clock = on_rejected, on_change, clock
        self._good: dict[str, T] = {}
        self._rejected: dict[str, Rejection] = {}

    def apply(self, key: str, raw: bytes | None, parse: Callable[[str, bytes], T], kind: str) -> T | None:
        """The value of ``key`` in force after ``raw`` arrived there (None: deleted, or absent)."""
        if raw is None:
            self._good.pop(key, None)
            if self._rejected.pop(key, None) is not None:
                self._on_change()
            return None
        try:
            doc = parse(key, raw)
        except InvalidArgument as exc:
            self._rejected[key] = Rejection(key, kind, exc.message, self._clock())
            self._on_rejected(kind)
            kept = "the last good value stays" if key in self._good else "the key counts as absent"
            log.warning("%s %s rejected %s: %s (%s)", self.service, self.instance, key, exc.message, kept)
            self._on_change()
            return self._good.get(key)
        self._good[key] = doc
        if self._rejected.pop(key, None) is not None:
            log.info("%s %s: %s is valid again", self.service, self.instance, key)
            self._on_change()
        return doc

    def get(self, key: str) -> T | None:
        return self._good.get(key)

    @property
    def good(self) -> Mapping[str, T]:
        return self._good

    @property
    def rejections(self) -> Mapping[str, Rejection]:
        return self._rejected

    def doc(self) -> RejectionsDoc:
        return RejectionsDoc(
            self.service, self.instance, tuple(self._rejected[k] for k in sorted(self._rejected))
        )


def published_operator_docs(
    service: str,
    instance: str,
    store: Store,
    key: str,
    *,
    on_rejected: Callable[[str], None] = lambda kind: None,
    on_error: Callable[[str], None] = lambda loop: None,
    clock: Callable[[], float] = time.time,
) -> tuple[OperatorDocs[Any], RejectionPublisher]:
    """A service's operator documents and the publisher of its rejections at ``key``, wired so that every
    change of the rejections is published (what each service that reads operator documents makes)."""
    docs: OperatorDocs[Any] = OperatorDocs(
        service,
        instance,
        on_rejected=on_rejected,
        on_change=lambda: publisher.changed(),  # noqa: PLW0108 - the publisher is made next, from these
        clock=clock,
    )
    publisher = RejectionPublisher(store, key, docs.doc, on_error=on_error)
    return docs, publisher


class RejectionPublisher:
    """Writes ``docs()`` (merged rejections of one service instance) to ``key`` under a lease of its own,
    whenever ``changed()`` is called; an empty list is written too, so a fixed document clears it."""

    def __init__(
        self,
        store: Store,
        key: str,
        docs: Callable[[], RejectionsDoc],
        *,
        ttl: int = 10,
        on_error: Callable[[str], None] = lambda loop: None,
    ) -> None:
        self._store, self._key, self._docs, self._ttl, self._on_error = store, key, docs, ttl, on_error
        self._dirty = asyncio.Event()
        self._keeper: KeepAlive | None = None
        self._task: asyncio.Task[None] | None = None
        self._dirty.set()  # the first write says "nothing rejected" (or what was, before it started)

    def changed(self) -> None:
        self._dirty.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="rejections")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._keeper is not None:
            await self._keeper.stop()
            with contextlib.suppress(MCPError):
                await self._store.revoke_lease(self._keeper.lease.id)

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            lost: Any = self._keeper.lost.wait() if self._keeper is not None else asyncio.sleep(3600)
            waits = [asyncio.ensure_future(self._dirty.wait()), asyncio.ensure_future(lost)]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            self._dirty.clear()
            try:
                await self.publish_once()
                backoff = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._on_error("rejections")
                log.warning("could not publish %s (%s); retrying in %.1fs", self._key, exc, backoff)
                self._dirty.set()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def publish_once(self) -> None:
        if self._keeper is None or self._keeper.lost.is_set():
            if self._keeper is not None:
                await self._keeper.stop()
            self._keeper = self._store.keep_alive(await self._store.grant_lease(self._ttl))
        await self._store.put(self._key, self._docs().to_json(), lease=self._keeper.lease.id)
