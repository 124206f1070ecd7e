"""The process tuning every service applies at start: a ``tuning`` config section whose defaults follow the
CPU cores the process may use.

The knobs are settable like any setting (YAML ``tuning: {gc_freeze: false}``, env
``MCP_ROUTER_TUNING__GC_FREEZE=0``, flag ``--tuning.gc-freeze`` / ``--no-tuning.gc-freeze``); each field's
``#:`` comment says what it does. Why each exists and what it measured: docs/design/process-tuning.md,
per-request-cuts.md (the collector), heap-buffers.md (glibc's thresholds) and
helper-threads-sched-batch.md. ``bench/tuning_probe.py`` measures the router path with the tuning on and
off on a 1-core and a 2-core view of a machine (``taskset``).

Invariants: ``Tuning.for_cores(n)`` is the one place defaults are chosen (``for_this_process`` asks the
kernel for ``n``: the affinity mask). On the 1-core and 2-core views measured, the same choices win (the
design record has the figures), so today no default depends on ``n``; a knob whose best value does goes
here. Applying a knob that the platform lacks (no glibc, no ``SCHED_BATCH``) changes nothing.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from dataclasses import dataclass, field

from mcpcore.config import shared_env

__all__ = ["Tuning", "after_start", "available_cores", "tune_allocator"]

#: Python's own GIL hand-over interval (``sys.getswitchinterval()`` in a fresh interpreter).
PYTHON_SWITCH_INTERVAL_S = 0.005
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def available_cores() -> int:
    """The CPUs this process may run on (its affinity mask: ``taskset``, a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Tuning:
    """The knobs of the module's docstring; ``for_cores`` gives their defaults."""

    #: Once started, move everything made so far out of the collector's passes (``gc.freeze``).
    gc_freeze: bool
    #: Collect the youngest generation every this many container allocations (0: Python's 700).
    gc_young_objects: int
    #: How often a thread holding the GIL hands it over (``sys.setswitchinterval``), seconds.
    switch_interval_s: float
    #: glibc keeps buffers up to this size on its heap instead of fresh mappings (0: glibc's own).
    heap_mmap_threshold_bytes: int
    #: glibc keeps up to this much freed heap for reuse (0: glibc's own).
    heap_trim_threshold_bytes: int
    #: Run grpc's and libzmq's helper threads under ``SCHED_BATCH`` (``mcpcore.helper_threads``).
    batch_helper_threads: bool = field(metadata=shared_env("MCP_BATCH_HELPER_THREADS"))

    @classmethod
    def for_cores(cls, cores: int) -> Tuning:
        """The defaults for a process that may use ``cores`` CPUs."""
        if cores < 1:
            raise ValueError(f"cores: must be >= 1, got {cores}")
        # Measured on 1 and 2 cores (bench/tuning_probe.py): a 1 ms switch interval and batched helper
        # threads win on both, so neither follows the count (Python's 5 ms and unbatched helpers on one
        # core read 10% fewer requests a second than these).
        return cls(
            gc_freeze=True,
            gc_young_objects=20_000,
            switch_interval_s=0.001,
            batch_helper_threads=True,
            heap_mmap_threshold_bytes=32 << 20,  # glibc's own cap for the threshold
            heap_trim_threshold_bytes=256 << 20,
        )

    @classmethod
    def for_this_process(cls) -> Tuning:
        return cls.for_cores(available_cores())

    def __post_init__(self) -> None:
        if self.gc_young_objects < 0:
            raise ValueError(
                f"tuning.gc_young_objects: must be >= 0 (0: Python's), got {self.gc_young_objects}"
            )
        if not 0 < self.switch_interval_s <= 1:
            raise ValueError(f"tuning.switch_interval_s: must be in (0, 1] s, got {self.switch_interval_s}")
        if not 0 <= self.heap_mmap_threshold_bytes <= 32 << 20:
            raise ValueError(
                "tuning.heap_mmap_threshold_bytes: must be within 0..32 MiB (glibc's cap; 0: glibc's own), "
                f"got {self.heap_mmap_threshold_bytes}"
            )
        if self.heap_trim_threshold_bytes < 0:
            raise ValueError(
                f"tuning.heap_trim_threshold_bytes: must be >= 0 (0: glibc's own), "
                f"got {self.heap_trim_threshold_bytes}"
            )


def tune_allocator(tuning: Tuning) -> bool:
    """Set glibc's heap thresholds (before the service allocates its buffers); False where one was asked
    for and the C library is not glibc or refused it."""
    settings = [
        (param, value)
        for param, value in (
            (_M_MMAP_THRESHOLD, tuning.heap_mmap_threshold_bytes),
            (_M_TRIM_THRESHOLD, tuning.heap_trim_threshold_bytes),
        )
        if value
    ]
    if not settings:
        return True
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return all([bool(mallopt(param, value)) for param, value in settings])


def after_start(tuning: Tuning) -> None:
    """The collector and GIL knobs, applied once the service has started (what it made is frozen)."""
    if tuning.gc_freeze:
        gc.collect()
        gc.freeze()
    if tuning.gc_young_objects:
        gc.set_threshold(tuning.gc_young_objects, *gc.get_threshold()[1:])
    sys.setswitchinterval(tuning.switch_interval_s)
