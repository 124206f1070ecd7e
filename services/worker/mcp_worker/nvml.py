"""GPU readings from NVML (``nvidia-ml-py``), sampled in a thread: never a subprocess, never the event loop.

``GpuSampler`` reads utilization and memory of every device about once per ``interval_s`` on its own
daemon thread and keeps the latest ``Reading`` per device; the heartbeat and the metrics only look at
that. NVML calls can take milliseconds (and ``nvidia-smi`` tens of them), so none runs on a loop.

NVML numbers the GPUs physically; CUDA numbers those ``CUDA_VISIBLE_DEVICES`` shows. ``index_of`` turns a
CUDA index (the worker's ``gpu_index``) into NVML's: by position in ``CUDA_VISIBLE_DEVICES`` (indices or
``GPU-`` UUIDs); unset, they agree when ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (CUDA's default, fastest first,
differs only on a host with mixed GPU models). MIG devices are not mapped.

Invariants: without the library or a driver the sampler does not start, says why once (``reason``) and
reports no devices; a device that fails a read keeps its last reading and the thread goes on. The NVML
module is injectable, so the logic is tested on machines without a GPU.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from mcp_worker.config import device_environment

__all__ = ["GpuSampler", "Reading", "nvml_index"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reading:
    utilization: float  # 0..1, over NVML's last sample period
    memory_used_bytes: int
    memory_total_bytes: int
    at: float  # time.monotonic() of the read


def _load_nvml() -> ModuleType | None:
    try:
        import pynvml  # noqa: PLC0415  (nvidia-ml-py; only workers with GPUs use it)
    except ImportError:
        return None
    return pynvml


def nvml_index(cuda_index: int, nvml: Any, handles: list[Any], visible: str | None = None) -> int | None:
    """NVML's index of the GPU CUDA calls ``cuda_index`` (None: not visible, or not mappable), given an
    initialised NVML and its ``handles`` in NVML order; ``visible``: ``CUDA_VISIBLE_DEVICES`` (read when
    None)."""
    visible = device_environment().visible_devices if visible is None else visible
    if visible is None:
        return cuda_index if cuda_index < len(handles) else None
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if cuda_index >= len(entries):
        return None
    entry = entries[cuda_index]
    if entry.isdigit():
        return int(entry) if int(entry) < len(handles) else None
    for index, handle in enumerate(handles):
        try:
            uuid = nvml.nvmlDeviceGetUUID(handle)
        except Exception:
            return None
        if (uuid.decode() if isinstance(uuid, bytes) else str(uuid)) == entry:
            return index
    return None


class GpuSampler:
    def __init__(self, *, interval_s: float = 1.0, nvml: Any = None) -> None:
        self._nvml = nvml if nvml is not None else _load_nvml()
        self._interval = interval_s
        self._readings: dict[int, Reading] = {}
        self._handles: list[Any] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reason = ""  # why there are no readings, when there are none

    def start(self) -> bool:
        """Initialise NVML and start sampling; False (and ``reason``) without a usable NVML."""
        nvml = self._nvml
        if nvml is None:
            self.reason = "nvidia-ml-py is not installed"
            return False
        try:
            nvml.nvmlInit()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            self.reason = f"NVML is not usable here ({type(exc).__name__}: {exc})"
            return False
        if not self._handles:
            self.reason = "NVML sees no GPU"
            return False
        self._sample()
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                log.debug("nvmlShutdown failed", exc_info=True)

    def index_of(self, cuda_index: int) -> int | None:
        """NVML's index of CUDA's device ``cuda_index`` (``nvml_index``); None without NVML."""
        return nvml_index(cuda_index, self._nvml, self._handles) if self._handles else None

    def readings(self) -> dict[int, Reading]:
        return dict(self._readings)  # replaced whole by the thread: a consistent copy

    def pci_bus_id(self, index: int) -> str | None:
        """Device ``index``'s PCI bus id, for NUMA pinning (call before ``start``'s thread matters)."""
        if index >= len(self._handles):
            return None
        try:
            bus = self._nvml.nvmlDeviceGetPciInfo(self._handles[index]).busId
        except Exception:
            return None
        return bus.decode() if isinstance(bus, bytes) else str(bus)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def _sample(self) -> None:
        nvml, readings = self._nvml, dict(self._readings)
        for index, handle in enumerate(self._handles):
            try:
                util = nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception:
                log.debug("NVML read of device %d failed; keeping its last reading", index, exc_info=True)
                continue
            readings[index] = Reading(util.gpu / 100.0, int(memory.used), int(memory.total), time.monotonic())
        self._readings = readings
