"""Admission at the worker's door: bounded requests and bytes in flight, shared fairly between models.

Every request the tensor server takes holds a ``Ticket`` until its reply is sent, so a worker never holds
more than ``max_requests`` requests or ``max_bytes`` of their tensors, however fast they are offered: the
rest are refused at once, before anything is decoded or queued, with ``Unavailable`` "exceeds maximum queue
size" (Triton's words) marked not started, so a router sends them elsewhere.

Fair share (by count and by bytes): a model is *active* while it has requests in flight or was refused
within ``recent_s``. Alone, a model may fill the worker; beside others, each active model holds at most its
share, the limit over the number of active models. A model offered ten times the worker's capacity beside
a light one is held to half, and the light one always finds its room. (The limits bound what waits, not
what runs: a model's share of the execution slots is the batcher's weighted share.)

Pure logic: no I/O; the clock is injected. Not thread-safe: the tensor server's event loop owns it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from mcpcore.errors import Unavailable, not_started

__all__ = ["Admission", "Ticket"]


@dataclass(eq=False, slots=True)
class Ticket:
    model: str
    nbytes: int
    released: bool = False


@dataclass(slots=True)
class _Use:
    requests: int = 0
    nbytes: int = 0
    refused_at: float = float("-inf")


class Admission:
    def __init__(
        self,
        *,
        max_requests: int,
        max_bytes: int,
        owner: str = "this worker",
        recent_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        on_refused: Callable[[], None] = lambda: None,
    ) -> None:
        if max_requests < 1 or max_bytes < 1:
            raise ValueError("max_requests and max_bytes must be >= 1")
        self.max_requests, self.max_bytes = max_requests, max_bytes
        self._owner, self._recent, self._clock = owner, recent_s, clock
        self._on_refused = on_refused
        self._use: dict[str, _Use] = {}
        self.requests = 0
        self.nbytes = 0
        self.refused_total = 0

    def admit(self, model: str, nbytes: int) -> Ticket:
        """A ticket for one request of ``model`` carrying ``nbytes``; ``Unavailable`` (not started) when
        the worker is full, or full enough that ``model`` is over its fair share."""
        now = self._clock()
        use = self._use.get(model)
        if use is None:
            use = self._use[model] = _Use()
        why = self._refusal(model, use, nbytes, now)
        if why:
            use.refused_at = now
            self.refused_total += 1
            self._on_refused()
            if len(self._use) > 64:
                self._prune(now)
            raise not_started(
                Unavailable(f"exceeds maximum queue size: {why}; retry later or on another worker")
            )
        use.requests += 1
        use.nbytes += nbytes
        self.requests += 1
        self.nbytes += nbytes
        return Ticket(model, nbytes)

    def release(self, ticket: Ticket) -> None:
        if ticket.released:
            return
        ticket.released = True
        self.requests -= 1
        self.nbytes -= ticket.nbytes
        use = self._use.get(ticket.model)
        if use is not None:
            use.requests -= 1
            use.nbytes -= ticket.nbytes
            if not use.requests and self._clock() - use.refused_at > self._recent:
                del self._use[ticket.model]  # names come from the network: keep only active models

    def _refusal(self, model: str, use: _Use, nbytes: int, now: float) -> str:
        if self.requests >= self.max_requests:
            return f"{self._owner} holds {self.requests} requests, its limit (max_in_flight_requests)"
        if self.nbytes + nbytes > self.max_bytes:
            return (
                f"{self._owner} holds {self.nbytes} bytes of tensors and this request brings {nbytes}, "
                f"over its limit of {self.max_bytes} (max_in_flight_bytes)"
            )
        recent = now - self._recent
        active = 1 + sum(
            1 for m, u in self._use.items() if m != model and (u.requests or u.refused_at >= recent)
        )
        if active > 1 and use.requests + 1 > max(1, self.max_requests // active):
            return f"{self._owner} is shared by {active} models and model {model} holds its share"
        if active > 1 and use.nbytes + nbytes > max(nbytes, self.max_bytes // active):
            return f"{self._owner} is shared by {active} models and model {model} holds its share of bytes"
        return ""

    def _prune(self, now: float) -> None:
        """Forget models refused a while ago with nothing in flight."""
        for m in [m for m, u in self._use.items() if not u.requests and now - u.refused_at > self._recent]:
            del self._use[m]
