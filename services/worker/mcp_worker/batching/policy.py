"""Dynamic batching policy for one model version: which queued requests form the next batch, and when.

``BatchConfig`` is a model version's batching settings (from ``model.yaml``); ``BatchPolicy`` its queue.

Pure logic: no asyncio, no I/O; every time is an argument (seconds on one monotonic clock), so tests drive
it with a fake clock. ``mcp_worker.batching`` owns the event loop, the threads and the futures.

Rules (DESIGN §9, and §11 item 5: the article's batching flushed on the time since the *last flush* and
busy-polled; here the delay runs from the *oldest queued request's arrival* and the caller sleeps until
``next_wakeup()``):

- A batch is ready when the head request's shape has ``max_batch_size`` rows queued (or the largest
  preferred batch size, Triton's rule: a preferred size is worth sending at once), or when the oldest
  queued request has waited ``max_queue_delay``.
- The head is the oldest request of the best priority level (level 1 first). A batch holds only requests
  with the head's shape key (input names, dtypes and non-batch dims), taken level by level and FIFO within
  a level, stopping at the first one that would overflow ``max_batch_size`` rows: order is never skipped
  within a shape. Before the delay has run out, a batch stops at the largest preferred size it can reach.
- A request still queued at its deadline leaves through ``expire`` (the caller answers it).
- A single request larger than the limit is refused when queued; one larger than a limit lowered later (the
  breaker halves it) runs alone rather than never.

Data: one deque per (priority level, shape key), so taking a batch costs O(batch) and finding the head
O(levels x shapes); a heap of deadlines with lazy deletion, rebuilt when it holds more stale entries than
live ones (taken requests must not stay referenced for a whole timeout).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from mcpcore.errors import InvalidArgument
from mcpcore.modelspec import DynamicBatching, ModelConfig

__all__ = ["BatchConfig", "BatchPolicy", "Request"]


@dataclass(frozen=True)
class BatchConfig:
    """One model version's batching; ``max_batch_size`` 0 = no batching (each request runs alone, as is)."""

    max_batch_size: int
    max_queue_delay_s: float = 0.0
    preferred_batch_sizes: tuple[int, ...] = ()
    priority_levels: int = 1
    default_priority_level: int = 1
    default_queue_timeout_s: float | None = None  # None = requests wait as long as it takes
    max_queue_size: int = 0  # requests; 0 = unbounded

    def __post_init__(self) -> None:
        checks = {
            "max_batch_size": self.max_batch_size >= 0,
            "max_queue_delay_s": self.max_queue_delay_s >= 0,
            "priority_levels": self.priority_levels >= 1,
            "default_priority_level": 1 <= self.default_priority_level <= self.priority_levels,
            "default_queue_timeout_s": self.default_queue_timeout_s is None
            or self.default_queue_timeout_s > 0,
            "max_queue_size": self.max_queue_size >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise InvalidArgument(f"batch config: {name}: invalid value {getattr(self, name)!r}")

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0

    @classmethod
    def from_model_config(cls, cfg: ModelConfig) -> BatchConfig:
        """From ``model.yaml``. With ``max_batch_size > 0`` and no ``dynamic_batching`` section, requests
        that queue up while the model is busy still run together (a zero delay: nobody waits for them)."""
        db = cfg.dynamic_batching or DynamicBatching()
        batched = cfg.max_batch_size > 0 and not cfg.decoupled  # a decoupled model's requests run alone
        return cls(
            max_batch_size=cfg.max_batch_size if batched else 0,
            max_queue_delay_s=db.max_queue_delay_us / 1e6 if batched else 0.0,
            preferred_batch_sizes=db.preferred_batch_sizes if batched else (),
            priority_levels=db.priority_levels,
            default_priority_level=db.default_priority_level,
            default_queue_timeout_s=db.default_queue_timeout_us / 1e6 or None,
            max_queue_size=db.max_queue_size,
        )


@dataclass(eq=False, slots=True, kw_only=True)
class Request:
    """One queued request as the policy sees it; the dispatcher subclasses it to carry its payload."""

    arrival: float
    level: int = 1  # priority level, 1 = served first
    deadline: float | None = None  # absolute; expires while still queued at this time
    rows: int = 1  # the first dim of its inputs
    shape_key: Hashable = None  # requests batch together only with an equal key
    seq: int = field(default=0, init=False)
    queued: bool = field(default=False, init=False)


class BatchPolicy:
    """The queue of one model version. Not thread-safe: the dispatcher's event loop owns it."""

    def __init__(
        self,
        *,
        max_batch_size: int,
        max_queue_delay_s: float = 0.0,
        preferred_batch_sizes: Sequence[int] = (),
        priority_levels: int = 1,
    ) -> None:
        if max_batch_size < 1 or priority_levels < 1 or max_queue_delay_s < 0:
            raise ValueError("max_batch_size and priority_levels must be >= 1, max_queue_delay_s >= 0")
        self.max_queue_delay_s = max_queue_delay_s
        self._preferred_all = tuple(sorted(set(preferred_batch_sizes)))
        self._levels: list[dict[Hashable, deque[Request]]] = [{} for _ in range(priority_levels)]
        self._rows: dict[Hashable, int] = {}
        self._deadlines: list[tuple[float, int, Request]] = []
        self._count = 0
        self._seq = itertools.count()
        self.set_max_batch_size(max_batch_size)

    @classmethod
    def for_config(cls, config: BatchConfig) -> BatchPolicy:
        """The queue for ``config``; without batching each request is one row of a one-row limit."""
        return cls(
            max_batch_size=max(1, config.max_batch_size),
            max_queue_delay_s=config.max_queue_delay_s,
            preferred_batch_sizes=config.preferred_batch_sizes,
            priority_levels=config.priority_levels,
        )

    def __len__(self) -> int:
        return self._count

    @property
    def max_batch_size(self) -> int:
        return self._limit

    def set_max_batch_size(self, n: int) -> None:
        """Change the row limit (the breaker lowers it); preferred sizes above it are ignored meanwhile."""
        self._limit = max(1, n)
        self._preferred = tuple(p for p in self._preferred_all if p <= self._limit)
        self._full = self._preferred[-1] if self._preferred else self._limit

    # --- queue ----------------------------------------------------------------------------------------

    def push(self, req: Request) -> None:
        if not 1 <= req.level <= len(self._levels):
            raise ValueError(f"priority level {req.level} is not in 1..{len(self._levels)}")
        req.seq = next(self._seq)
        req.queued = True
        self._levels[req.level - 1].setdefault(req.shape_key, deque()).append(req)
        self._rows[req.shape_key] = self._rows.get(req.shape_key, 0) + req.rows
        self._count += 1
        if req.deadline is not None:
            heapq.heappush(self._deadlines, (req.deadline, req.seq, req))

    def remove(self, req: Request) -> bool:
        """Take a still-queued request out (its client is gone); False if it already left the queue."""
        if not req.queued:
            return False
        level = self._levels[req.level - 1]
        dq = level[req.shape_key]
        if dq[0] is req:
            dq.popleft()
        else:
            dq.remove(req)
        self._forget(req, level, dq)
        return True

    def clear(self) -> list[Request]:
        """Remove and return every queued request, best level first, FIFO within a level."""
        reqs = [r for level in self._levels for dq in level.values() for r in dq]
        reqs.sort(key=lambda r: (r.level, r.seq))
        for req in reqs:
            req.queued = False
        for level in self._levels:
            level.clear()
        self._rows.clear()
        self._deadlines.clear()
        self._count = 0
        return reqs

    def expire(self, now: float) -> list[Request]:
        """Remove and return the queued requests whose deadline is ``<= now``, earliest first."""
        out: list[Request] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            req = heapq.heappop(self._deadlines)[2]
            if self.remove(req):
                out.append(req)
        return out

    # --- timing ---------------------------------------------------------------------------------------

    def oldest_arrival(self) -> float | None:
        heads = [dq[0].arrival for level in self._levels for dq in level.values()]
        return min(heads) if heads else None

    def ready(self, now: float) -> bool:
        """Whether a batch should be taken now: a full one is queued, or the oldest has waited enough."""
        head = self._head()
        if head is None:
            return False
        return self._rows.get(head.shape_key, 0) >= self._full or self._delay_over(now)

    def next_flush(self) -> float | None:
        """When the oldest queued request will have waited ``max_queue_delay`` (None: queue empty)."""
        oldest = self.oldest_arrival()
        return None if oldest is None else oldest + self.max_queue_delay_s

    def next_expiry(self) -> float | None:
        """The earliest deadline among queued requests."""
        while self._deadlines and not self._deadlines[0][2].queued:
            heapq.heappop(self._deadlines)
        return self._deadlines[0][0] if self._deadlines else None

    def next_wakeup(self) -> float | None:
        """The next time ``ready`` or ``expire`` can change without a new request arriving."""
        times = [t for t in (self.next_flush(), self.next_expiry()) if t is not None]
        return min(times) if times else None

    # --- batches --------------------------------------------------------------------------------------

    def take_batch(self, now: float) -> list[Request]:
        """Remove and return the next batch (see the module's rules); ``[]`` when nothing is queued.

        Call ``expire(now)`` first: this does not look at deadlines.
        """
        head = self._head()
        if head is None:
            return []
        batch = self._plan(head.shape_key)
        if self._preferred and not self._delay_over(now):
            batch = self._trim_to_preferred(batch)
        for req in batch:
            level = self._levels[req.level - 1]
            dq = level[req.shape_key]
            dq.popleft()  # a batch is a prefix of each (level, shape) deque
            self._forget(req, level, dq)
        return batch

    def _head(self) -> Request | None:
        for level in self._levels:
            if level:
                return min((dq[0] for dq in level.values()), key=lambda r: r.seq)
        return None

    def _delay_over(self, now: float) -> bool:
        oldest = self.oldest_arrival()
        return oldest is not None and now >= oldest + self.max_queue_delay_s

    def _plan(self, key: Hashable) -> list[Request]:
        batch: list[Request] = []
        rows = 0
        for level in self._levels:
            for req in level.get(key, ()):
                if rows + req.rows > self._limit:
                    return batch or [req]  # an oversized head runs alone
                batch.append(req)
                rows += req.rows
                if rows == self._limit:
                    return batch
        return batch

    def _trim_to_preferred(self, batch: list[Request]) -> list[Request]:
        total = sum(r.rows for r in batch)
        fitting = [p for p in self._preferred if p <= total]
        if not fitting or fitting[-1] == total:
            return batch
        target, rows = fitting[-1], 0
        for i, req in enumerate(batch):
            rows += req.rows
            if rows > target:
                return batch[: max(i, 1)]
        return batch

    def _forget(self, req: Request, level: dict[Hashable, deque[Request]], dq: deque[Request]) -> None:
        req.queued = False
        if not dq:
            del level[req.shape_key]
        left = self._rows[req.shape_key] - req.rows
        if left:
            self._rows[req.shape_key] = left
        else:
            self._rows.pop(req.shape_key)
        self._count -= 1
        if len(self._deadlines) > 2 * self._count + 16:  # mostly stale: drop what no longer queues
            self._deadlines = [e for e in self._deadlines if e[2].queued]
            heapq.heapify(self._deadlines)
