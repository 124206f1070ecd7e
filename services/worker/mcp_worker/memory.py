"""The worker's memory budget: bytes reserved per replica against one capacity.

Invariant: ``used`` never exceeds ``capacity``; a reservation that does not fit raises
``ResourceExhausted`` and changes nothing. Pure logic, no I/O; the asyncio caller serialises access.
"""

from __future__ import annotations

from mcpcore.errors import ResourceExhausted

__all__ = ["MemoryBudget", "human_bytes"]


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


class MemoryBudget:
    def __init__(self, capacity: int, *, owner: str = "this worker") -> None:
        self.capacity = capacity
        self._owner = owner
        self._held: dict[str, int] = {}

    @property
    def used(self) -> int:
        return sum(self._held.values())

    @property
    def free(self) -> int:
        return self.capacity - self.used

    def held(self, name: str) -> int:
        return self._held.get(name, 0)

    def reserve(self, name: str, nbytes: int) -> None:
        """Hold ``nbytes`` for ``name`` (replacing what it held before)."""
        self.check(name, nbytes)
        self._held[name] = nbytes

    def check(self, name: str, nbytes: int) -> None:
        """Raise ``ResourceExhausted`` unless ``reserve(name, nbytes)`` would fit now; changes nothing."""
        if nbytes < 0:
            raise ValueError(f"negative reservation for {name}: {nbytes}")
        available = self.free + self.held(name)
        if nbytes > available:
            raise ResourceExhausted(
                f"{name} needs {human_bytes(nbytes)} but only {human_bytes(available)} of "
                f"{human_bytes(self.capacity)} is free on {self._owner}; unload a model or raise "
                "memory_capacity_bytes"
            )

    def release(self, name: str) -> int:
        return self._held.pop(name, 0)
