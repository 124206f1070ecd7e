"""Coalescing outboxes: requests for one worker sent in one loop iteration leave together (``KIND_BATCH``).

A link's requests wait in its outbox (``Link.outbox``) when its worker's record lists ``FEATURE_BATCH``.
They leave together at the start of the next loop iteration, or, with ``flush_at`` > 0 (the router's
``coalesce_flush_at``; docs/design/early-sends.md), ``flush_at`` at a time as soon as that many wait and
the rest at the next iteration.

Invariants:
- Each request keeps its own id, reply, status and retry; a message holds as many as the limits allow
  (``wire.coalesce``).
- A request still waiting when its link fails, or whose send is refused, never left: it fails
  ``NotSent`` (through ``unsent``), and the other links' requests go on.
- Sends run in a fresh context, so no request's log fields leak into another's.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from typing import Any

from mcpcore import wire
from mcpcore.transport.link import Link, NotSent

__all__ = ["Outboxes"]

log = logging.getLogger(__name__)


class Outboxes:
    """The links with requests waiting to leave, and what sends them."""

    __slots__ = ("_send_now", "_to_flush", "_unsent", "flush_at", "limits")

    def __init__(
        self,
        limits: wire.Limits,
        flush_at: int,
        *,
        send_now: Callable[[Link, list[Any]], None],
        unsent: Callable[[Link, list[str], str], None],
    ) -> None:
        if flush_at < 0:
            raise ValueError(f"flush_at: must be >= 0 (0: only at the next loop iteration), got {flush_at}")
        self.limits = limits
        #: Send a link's outbox once this many wait (0: at the next iteration); docs/design/early-sends.md
        self.flush_at = flush_at
        self._send_now = send_now  # one message now, or ``NotSent``
        self._unsent = unsent  # fails requests that never left
        self._to_flush: list[Link] = []  # links with an outbox to send at the next iteration

    def put(self, loop: asyncio.AbstractEventLoop, link: Link, rid: str, frames: list[Any]) -> None:
        """Queue one request's frames on ``link``: it leaves with this iteration's others for the worker, or
        at once with them when ``flush_at`` wait (its worker can start on these while the iteration goes
        on); a refused send fails them ``NotSent``."""
        outbox = link.outbox
        outbox[rid] = frames
        if not link.flush_scheduled:
            link.flush_scheduled = True
            self._to_flush.append(link)
            if len(self._to_flush) == 1:  # in a fresh context: no request's log fields
                loop.call_soon(self.flush, context=contextvars.Context())
        if self.flush_at and len(outbox) >= self.flush_at:
            contextvars.Context().run(self.send, link)

    def flush(self) -> None:
        """Send each link's requests of the last iteration, coalesced as far as the limits allow; those a
        send refuses fail ``NotSent`` (they never left)."""
        links, self._to_flush = self._to_flush, []
        for link in links:
            link.flush_scheduled = False
        for link in links:
            self.send(link)

    def send(self, link: Link) -> None:
        """Send the requests waiting in ``link``'s outbox, coalesced as far as the limits allow."""
        out, link.outbox = link.outbox, {}
        if not out or link.sock.closed:
            return  # nothing waits, or it failed already (the link closed)
        rids, messages = list(out), list(out.values())
        try:
            groups = wire.coalesce(messages, self.limits)
        except Exception as exc:  # never: the frames were made by encode; if so, none of them left
            log.exception("requests for worker %s could not be coalesced", link.endpoint.id)
            self._unsent(link, rids, f"worker {link.endpoint.id}: the send failed ({exc})")
            return
        at = 0
        for count, message in groups:
            group, at = rids[at : at + count], at + count
            try:
                self._send_now(link, message)
            except NotSent as exc:
                self._unsent(link, group, exc.message)
            except Exception as exc:  # whatever it was, these did not leave; the other links go on
                log.exception("sending to worker %s failed", link.endpoint.id)
                self._unsent(link, group, f"worker {link.endpoint.id}: the send failed ({exc})")
