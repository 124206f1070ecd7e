"""Where each sequence runs (Triton's sequence_id, sequence_start, sequence_end), for one router.

A sequence's state lives on the worker its first request went to, so its requests go there and nowhere
else, one at a time in the order they came (as Triton's sequence batcher runs them).

Invariants:
- ``place`` pins a sequence to (version, worker, that worker's incarnation) when its first answer comes;
  ``placed`` gives the pin, or raises ``Aborted`` once that worker left the table, restarted or cannot take
  requests: the sequence is then lost, and stays lost (a tombstone) until a request with sequence_start
  begins it again, so no later request of it is ever re-routed silently.
- A sequence this router has neither pinned nor lost (its start went through another router) is adopted
  where its hash leads; ``end`` (sequence_end) forgets it.
- Bounded: every ``SWEEP_EVERY`` pins, sequences idle over ``IDLE_S`` become tombstones and tombstones
  older than that are dropped.
- ``turn`` serialises one sequence's requests (FIFO); requests of different sequences never wait on each
  other. Everything runs on the router's event loop: no locks but the per-sequence asyncio ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mcpcore.errors import Aborted, InvalidArgument

if TYPE_CHECKING:
    from mcp_router.dataplane import SequenceFlags
    from mcp_router.routing.table import ModelRoute, RoutingTable

__all__ = ["IDLE_S", "SWEEP_EVERY", "Pin", "Sequences"]

IDLE_S = 600.0  # a sequence with no request for this long is forgotten (a tombstone)
SWEEP_EVERY = 1024  # pins made between sweeps

Key = tuple[str, str]  # (model, sequence id)


@dataclass(slots=True)
class Pin:
    """Where a sequence runs: its version and worker (that incarnation of it)."""

    version: str
    worker: str
    incarnation: str
    used: float


class Sequences:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._pins: dict[Key, Pin] = {}
        self._lost: dict[Key, tuple[str, float]] = {}  # the error's message, and when
        self._turns: dict[Key, tuple[asyncio.Lock, int]] = {}  # the lock and how many use it
        self._made = 0

    def __len__(self) -> int:
        return len(self._pins)

    @contextlib.asynccontextmanager
    async def turn(self, model: str, sequence: SequenceFlags) -> AsyncIterator[None]:
        """Hold the sequence's turn: its earlier requests are answered first."""
        key = (model, sequence.id)
        lock, users = self._turns.get(key, (None, 0))
        lock = lock or asyncio.Lock()
        self._turns[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._turns[key]
            if users == 1:
                del self._turns[key]
            else:
                self._turns[key] = (lock, users - 1)

    def placed(
        self,
        route: ModelRoute,
        table: RoutingTable,
        sequence: SequenceFlags,
        version: str,
        serving: Callable[[str], bool],
    ) -> Pin | None:
        """The pin of a running sequence (None: a start, or one not seen here); ``Aborted`` when its
        worker is gone, or it was lost before and this is no new start."""
        key = (route.name, sequence.id)
        if sequence.start:  # begins afresh (Triton: a new START restarts it)
            self._pins.pop(key, None)
            self._lost.pop(key, None)
            return None
        pin = self._pins.get(key)
        if pin is None:
            lost = self._lost.get(key)
            if lost is not None:
                raise Aborted(lost[0])
            return None
        if version and version != pin.version:
            raise InvalidArgument(
                f"sequence {sequence.id} of model {route.name} runs on version {pin.version}, not {version}"
            )
        ring, endpoint = route.rings.get(pin.version), table.workers.get(pin.worker)
        why = ""
        if endpoint is None or ring is None or pin.worker not in ring.nodes:
            why = "left the routing table"
        elif endpoint.incarnation != pin.incarnation:
            why = "restarted"
        elif not serving(pin.worker):
            why = "is disconnected or draining"
        if why:
            raise self.lose(route.name, sequence, pin.worker, why)
        pin.used = self._clock()
        return pin

    def place(self, model: str, sequence: SequenceFlags, version: str, worker: str, incarnation: str) -> None:
        now = self._clock()
        self._pins[(model, sequence.id)] = Pin(version, worker, incarnation, now)
        self._made += 1
        if self._made % SWEEP_EVERY == 0:
            self._sweep(now)

    def lose(self, model: str, sequence: SequenceFlags, worker: str, why: str) -> Aborted:
        """The sequence's state is gone with its worker: remembered as lost, and the error to answer."""
        key = (model, sequence.id)
        self._pins.pop(key, None)
        error = Aborted(
            f"sequence {sequence.id} of model {model} ran on worker {worker}, which {why}; its state is lost "
            "and it is not moved to another worker: start it again (sequence_start=true)"
        )
        self._lost[key] = (error.message, self._clock())
        return error

    def end(self, model: str, sequence: SequenceFlags) -> None:
        self._pins.pop((model, sequence.id), None)

    def _sweep(self, now: float) -> None:
        for key, pin in list(self._pins.items()):
            if now - pin.used > IDLE_S:
                del self._pins[key]
                self._lost[key] = (
                    f"sequence {key[1]} of model {key[0]} had no request for {IDLE_S:.0f} s and was "
                    "forgotten with where it ran: start it again (sequence_start=true)",
                    now,
                )
        for key, (_, when) in list(self._lost.items()):
            if now - when > IDLE_S:
                del self._lost[key]
