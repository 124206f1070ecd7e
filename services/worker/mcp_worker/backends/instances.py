"""``instance_count`` copies of one model version behind one backend (Triton's instance group).

``create_backend`` builds one ``Instances`` for a model with ``instance_count`` > 1: every instance is
loaded (a failed one closes those already made), warmed up and closed together, and each run takes the
instance with the fewest runs in progress (the next in turn among equals). A backend whose runs cannot
overlap (``concurrent`` false: the cuda backend's one stream per instance) gets at most ``instance_count``
batches at once from the worker's dispatcher (``ModelManager``), so each batch has an instance to itself;
a thread-safe backend (numpy, onnx on the CPU) may take more, shared out evenly.

Invariants: ``memory_bytes`` and ``measured_device_bytes`` are the instances' sums; the instances are
alike (one config, one device), so ``device`` and ``fallback`` are the first one's. ``fits`` (the worker's
budget check) is asked for all the copies' bytes once the first is made, before the others are.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from mcp_worker.backends.base import NO_PARAMETERS, Backend, Emit
from mcpcore.errors import FailedPrecondition
from mcpcore.modelspec import ModelConfig

__all__ = ["Instances"]


def _to_every_instance(name: str) -> property:
    """An attribute read from the first instance and set on every instance that has it."""

    def get(self: Instances) -> Any:
        return getattr(self.instances[0], name, None)

    def put(self: Instances, value: Any) -> None:
        for instance in self.instances:
            if hasattr(instance, name):
                setattr(instance, name, value)

    return property(get, put)


class Instances(Backend):
    name = "instances"  # until the first instance is made: then its backend's name

    def __init__(
        self, config: ModelConfig, make: Callable[[], Backend], fits: Callable[[int], None] | None = None
    ) -> None:
        super().__init__(config, None)
        self.instances: list[Backend] = []
        try:
            for _ in range(config.instance_count):
                self.instances.append(make())
                if len(self.instances) == 1 and fits is not None:  # raises when all copies cannot fit
                    fits(config.instance_count * self.instances[0].memory_bytes)
        except BaseException:
            for instance in self.instances:
                instance.close()
            raise
        first = self.instances[0]
        self.name = first.name  # type: ignore[misc]
        self.concurrent = first.concurrent  # type: ignore[misc]
        self.inline = first.inline  # type: ignore[misc]
        self.device, self.fallback = first.device, first.fallback
        self._where = (
            f"model {config.name}/{config.version} ({first.name} backend, {len(self.instances)} instances)"
        )
        self.memory_bytes = sum(i.memory_bytes for i in self.instances)
        self.measured_device_bytes = sum(getattr(i, "measured_device_bytes", 0) for i in self.instances)
        self._busy = [0] * len(self.instances)
        self._next = 0
        self._lock = threading.Lock()

    # what the worker sets on a backend after the load goes to every instance
    on_work = _to_every_instance("on_work")
    fault_directory = _to_every_instance("fault_directory")

    def infer(
        self,
        inputs: Mapping[str, np.ndarray],
        *,
        skip: frozenset[str] = frozenset(),
        parameters: Mapping[str, str] = NO_PARAMETERS,
        emit: Emit | None = None,
    ) -> dict[str, np.ndarray]:
        if self._closed:
            raise FailedPrecondition(f"{self._where} is closed")
        with self._lock:  # the fewest runs in progress; among equals, the next after the last one taken
            n = len(self._busy)
            index = min(((self._next + i) % n for i in range(n)), key=self._busy.__getitem__)
            self._busy[index] += 1
            self._next = index + 1
        try:
            return self.instances[index].infer(inputs, skip=skip, parameters=parameters, emit=emit)
        finally:
            with self._lock:
                self._busy[index] -= 1

    def runs(self) -> list[int]:
        """Runs in progress per instance."""
        with self._lock:
            return list(self._busy)

    def warmup(self) -> None:
        for instance in self.instances:
            instance.warmup()

    def _run(
        self, inputs: Mapping[str, np.ndarray], *, skip: frozenset[str], parameters: Mapping[str, str]
    ) -> dict[str, np.ndarray] | Iterator[dict[str, np.ndarray]]:
        raise NotImplementedError("Instances.infer hands each run to an instance")  # never called

    def _release(self) -> None:
        for instance in self.instances:
            instance.close()
