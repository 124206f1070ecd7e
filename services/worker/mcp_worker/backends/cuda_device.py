"""The GPU side of the cuda backend that is not a model: pycuda, the kernels file, and each GPU's context.

Invariants:
- pycuda is imported on first use, never at module import: this module imports on machines without CUDA,
  and ``probe()`` says in words why the cuda backend cannot run there (no pycuda, kernels not built, no
  device), for ``CudaBackend.available()``.
- Every model on a GPU shares that GPU's primary context (the one the CUDA runtime, PyTorch and CuPy use
  too), retained once per process on first use and never released: a release of the last reference would
  reset the device under the other models. The driver is initialised explicitly (``init()``), never
  through ``pycuda.autoinit``, which would make a context of its own.
- CUDA calls run inside ``CudaDevice.active()``: the context is pushed on the calling thread and popped
  after, because ``infer`` runs on executor threads and ``close`` may run on the event loop's. pycuda
  frees an allocation, stream or module through the context it was made in, so objects are freed inside
  ``active()`` too, never left to the garbage collector on some other thread.

Environment, read when asked (never at import) through ``mcp_worker.config.device_environment``:
``MCP_CUDA_FATBIN`` (the kernels, default ``libs/native/build/mcp_kernels.fatbin`` in this checkout) and
``MCP_CUDA_DEVICE`` (device index, default 0; ``CUDA_VISIBLE_DEVICES`` chooses among the physical GPUs)
for a backend made without a device; a worker passes its own ``gpu_index``.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from mcp_worker.backends.base import short_error
from mcp_worker.config import DEVICE_ENV, FATBIN_ENV, device_environment

__all__ = [
    "DEFAULT_FATBIN",
    "DEVICE_ENV",
    "FATBIN_ENV",
    "CudaDevice",
    "device_context",
    "device_index",
    "device_memory_info",
    "get_device",
    "kernels_path",
    "probe",
]

log = logging.getLogger(__name__)

DEFAULT_FATBIN = Path(__file__).resolve().parents[4] / "libs" / "native" / "build" / "mcp_kernels.fatbin"


def kernels_path() -> Path:
    """The fatbin to load: ``$MCP_CUDA_FATBIN`` or ``libs/native/build/mcp_kernels.fatbin``."""
    return Path(device_environment().fatbin or DEFAULT_FATBIN)


def device_index() -> int:
    """The GPU to use, ``$MCP_CUDA_DEVICE`` (default 0); ``ValueError`` names the variable when it is bad."""
    raw = (device_environment().device or "0").strip() or "0"
    if not raw.isdigit():
        raise ValueError(f"{DEVICE_ENV} must be a device index (0, 1, ...), got {raw!r}")
    return int(raw)


def probe() -> tuple[bool, str]:
    """Whether the cuda backend can run here, and why not in words a person can act on."""
    try:
        cuda = importlib.import_module("pycuda.driver")
    except Exception as err:  # ImportError, or OSError from a missing libcuda
        return False, (
            f"pycuda is not importable ({short_error(err)}); the cuda backend needs pycuda and the NVIDIA"
            " driver (tools/prepare_gpu_wheels.sh packs pycuda for a GPU machine)"
        )
    fatbin = kernels_path()
    if not fatbin.is_file():
        return False, (
            f"the CUDA kernels are not built: {fatbin} is missing; run libs/native/cuda/build.sh"
            " (make native) where nvcc is installed"
        )
    try:
        index = device_index()
    except ValueError as err:
        return False, str(err)
    try:
        cuda.init()
        count = cuda.Device.count()
    except Exception as err:
        return False, f"the CUDA driver did not start: {short_error(err)}"
    if count == 0:
        return False, "no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)"
    if index >= count:
        return False, f"{DEVICE_ENV}={index} but only {count} CUDA device(s) are visible"
    return True, ""


class CudaDevice:
    """One GPU and its primary context, retained once and held for the life of the process."""

    def __init__(self, cuda: ModuleType, index: int) -> None:
        self.cuda = cuda
        self.index = index
        device: Any = cuda.Device(index)
        self.name = str(device.name())
        self.pci_bus_id = str(device.pci_bus_id())
        self.context: Any = device.retain_primary_context()

    @contextmanager
    def active(self) -> Iterator[ModuleType]:
        """The context pushed on this thread for the block (nesting is fine); yields ``pycuda.driver``."""
        self.context.push()
        try:
            yield self.cuda
        finally:
            self.cuda.Context.pop()


_devices: dict[int, CudaDevice] = {}  # the driver's per-process primary contexts, mirrored
_devices_lock = threading.Lock()


def get_device(index: int | None = None) -> CudaDevice:
    """GPU ``index`` (default ``device_index()``), its primary context retained on first use."""
    index = device_index() if index is None else index
    with _devices_lock:
        dev = _devices.get(index)
        if dev is None:
            cuda = importlib.import_module("pycuda.driver")
            cuda.init()
            dev = _devices[index] = CudaDevice(cuda, index)
            log.info(
                "cuda: device %d is %s at PCI %s; primary context retained", index, dev.name, dev.pci_bus_id
            )
        return dev


@contextmanager
def device_context(index: int | None = None) -> Iterator[ModuleType]:
    """``pycuda.driver`` with the GPU's shared primary context pushed: for tests, checks and benchmarks."""
    with get_device(index).active() as cuda:
        yield cuda


def device_memory_info(index: int | None = None) -> tuple[int, int]:
    """``(free, total)`` device bytes, from ``mem_get_info`` in the shared context."""
    with device_context(index) as cuda:
        free, total = cuda.mem_get_info()
        return int(free), int(total)
