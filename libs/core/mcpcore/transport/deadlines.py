"""Request deadlines kept in 2 ms slots, one timer per slot in use, not one per request.

Invariants:
- A request is given up on at the start of its deadline's slot: at most ``SLOT_S`` before its deadline,
  never after it (so the router's answer is there before the worker's own deadline answer or the
  client's deadline).
- Only slots with requests in flight are kept: a slot goes, and its timer is cancelled, once its last
  request ends (``discard``). A request without a finite deadline is never slotted.
- ``on_due`` runs once per request still slotted when its slot comes due; an error in it is logged and
  never keeps the slot's other requests from being given up on.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
from collections.abc import Callable

from mcpcore.transport.link import Link, Pending

__all__ = ["SLOT_S", "DeadlineSlots"]

log = logging.getLogger(__name__)

#: How long one slot is: the most a request can be given up on before its deadline.
SLOT_S = 0.002


class DeadlineSlots:
    """Deadline slot -> its timer and the requests due in it."""

    __slots__ = ("_on_due", "due")

    def __init__(self, on_due: Callable[[Pending, Link], None]) -> None:
        self._on_due = on_due
        self.due: dict[int, tuple[asyncio.TimerHandle, dict[Pending, Link]]] = {}

    def add(self, loop: asyncio.AbstractEventLoop, deadline: float, entry: Pending, link: Link) -> None:
        """Slot ``entry`` (on ``link``) for ``deadline``, a ``loop.time()``; an infinite one waits for its
        reply or its link."""
        if not math.isfinite(deadline):
            return
        entry.slot = slot = math.floor(deadline / SLOT_S)
        slotted = self.due.get(slot)
        if slotted is None:
            timer = loop.call_at(slot * SLOT_S, self.expire, slot, context=contextvars.Context())
            slotted = self.due[slot] = (timer, {})
        slotted[1][entry] = link

    def discard(self, entry: Pending) -> None:
        """``entry`` ended: it is no longer due."""
        slotted = self.due.get(entry.slot)
        if slotted is not None:
            due = slotted[1]
            due.pop(entry, None)
            if not due:  # its last request ended: no timer for nobody
                slotted[0].cancel()
                del self.due[entry.slot]

    def expire(self, slot: int) -> None:
        """The requests whose deadline passed in ``slot`` and that are still waiting: given up on."""
        slotted = self.due.pop(slot, None)
        if slotted is None:
            return
        for entry, link in slotted[1].items():
            future = entry.future
            if future is None or future.done():
                continue
            try:
                self._on_due(entry, link)
            except Exception:  # never: the others of the slot are still given up on
                log.exception("request %s could not be given up on cleanly", entry.rid)
