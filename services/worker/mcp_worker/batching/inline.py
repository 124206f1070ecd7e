"""Whether a model's next batch runs on the worker's event loop (inline) or on an executor thread.

Pure logic: times are arguments (nanoseconds), so tests drive it with numbers; ``mcp_worker.batching``
measures each batch and asks before starting one.

Why: for a small model the hand-off to a thread and back (waking the thread, the result's callback, the
loop's self-pipe) costs more than the batch (the measurement is a design record in ``docs/design/``).

Rules, for a model whose backend allows it (``Backend.inline``) with a limit ``limit_ns`` > 0:
- On the threads, the last ``WINDOW`` batches are kept (wall time, thread CPU time). A batch on a thread
  waits for the GIL while the loop holds it, so its wall time overstates what it would take inline; its
  CPU time does not, but misses time spent sleeping or waiting for a device. So the model is tried inline
  (a probe) only when each of those batches used at most ``limit_ns`` of CPU and their median wall time
  is at most ``PROBE_WALL`` times the limit: a probe of a model that waits holds the loop that long.
- Inline, the model goes back to the threads after a batch over ``LEAVE_AT`` times the limit, two batches
  in a row over the limit (one alone is most often the loop's thread preempted meanwhile), a probe over
  the limit, or a batch that fails. The next probe comes only after ``backoff`` more batches there,
  doubling each time (up to ``MAX_BACKOFF``) and back to ``WINDOW`` after an inline batch within the
  limit. A model that turns slow holds the loop for one or two batches; one that is slow only now and then
  is probed ever more rarely.
"""

from __future__ import annotations

from collections import deque

__all__ = ["LEAVE_AT", "MAX_BACKOFF", "PROBE_WALL", "WINDOW", "InlinePolicy"]

WINDOW = 8  # batches on the threads measured before a probe
PROBE_WALL = 8  # a probe needs the threads' median wall time within this many limits
LEAVE_AT = 4  # an inline batch this many limits long sends the model back to the threads at once
MAX_BACKOFF = 1024  # batches on the threads between probes, at most


class InlinePolicy:
    """One model version's choice between the loop and the threads (the module's rules)."""

    def __init__(self, limit_ns: int, allowed: bool = True) -> None:
        if limit_ns < 0:
            raise ValueError(f"limit_ns must be >= 0, got {limit_ns}")
        self.limit_ns = limit_ns if allowed else 0
        self.inline = False  # its batches run on the loop now
        self._recent: deque[tuple[int, int]] = deque(maxlen=WINDOW)  # (wall, cpu) on the threads
        self._wait = WINDOW  # batches on the threads before the next probe may come
        self._backoff = WINDOW
        self._over = False  # the last inline batch took longer than the limit

    def take(self) -> bool:
        """Whether the next batch runs on the loop (inline, or a probe)."""
        if self.inline:
            return True
        if not self.limit_ns or self._wait > 0 or len(self._recent) < WINDOW:
            return False
        walls = sorted(wall for wall, _ in self._recent)
        return (
            max(cpu for _, cpu in self._recent) <= self.limit_ns
            and walls[len(walls) // 2] <= PROBE_WALL * self.limit_ns
        )

    def ran(self, inline: bool, wall_ns: int, cpu_ns: int) -> None:
        """A batch finished: where it ran (``inline``), its wall time, and its thread's CPU time."""
        if not inline:
            self._recent.append((wall_ns, cpu_ns))
            self._wait -= 1
        elif wall_ns <= self.limit_ns:
            self.inline, self._over = True, False
            self._backoff = WINDOW
        elif self.inline and not self._over and wall_ns <= LEAVE_AT * self.limit_ns:
            self._over = True  # once: the next batch tells a slow model from a busy host
        else:
            self._leave()

    def failed(self, inline: bool) -> None:
        """A batch failed: a model running inline goes back to the threads."""
        if inline:
            self._leave()

    def _leave(self) -> None:
        self.inline = self._over = False
        self._recent.clear()
        self._wait = self._backoff
        self._backoff = min(2 * self._backoff, MAX_BACKOFF)
