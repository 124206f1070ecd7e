"""The producer of the NVML figures (NVML injected here: no GPU needed): a worker's load report carries its
own GPU's room (``device_room_bytes``: its total less what other processes hold) when
``place_by_gpu_memory`` is on, and leaves it out without a reading or the setting; CUDA's device index maps
to NVML's through ``CUDA_VISIBLE_DEVICES``; and its metrics export each device's utilization and memory."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mcp_worker.config import WorkerConfig
from mcp_worker.nvml import GpuSampler, Reading, nvml_index
from mcp_worker.server import Worker, device_room_bytes

GiB = 1 << 30


class FakeNvml:
    """Two devices: 0 with 20 of 80 GiB used, 1 with 70 of 80 GiB used (another process on it)."""

    used = {0: 20 * GiB, 1: 70 * GiB}

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=10)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(used=self.used[h], total=80 * GiB)


def test_device_room_is_total_less_what_other_processes_hold():
    readings = {0: Reading(0.1, 20 * GiB, 80 * GiB, 1.0), 1: Reading(0.1, 70 * GiB, 80 * GiB, 1.0)}
    assert device_room_bytes(readings, 0, own=0) == 60 * GiB
    assert device_room_bytes(readings, 0, own=15 * GiB) == 75 * GiB  # its own 15 GiB are its to place again
    assert device_room_bytes(readings, 1, own=0) == 10 * GiB
    assert device_room_bytes(readings, 1, own=90 * GiB) == 80 * GiB  # more than NVML shows: others hold 0
    assert device_room_bytes(readings, 2, own=0) is None  # no such device read
    assert device_room_bytes({}, 0, own=0) is None  # no NVML
    assert device_room_bytes({0: Reading(0.0, 81 * GiB, 80 * GiB, 1.0)}, 0, own=0) == 0  # never negative


class Uuids(FakeNvml):
    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return b"GPU-" + b"ab"[h : h + 1]


@pytest.mark.parametrize(
    ("visible", "cuda_index", "nvml"),
    [(None, 1, 1), (None, 2, None), ("1", 0, 1), ("1,0", 1, 0), ("5", 0, None), ("0", 1, None),
     ("GPU-b", 0, 1), ("GPU-a,GPU-b", 1, 1), ("GPU-zz", 0, None), ("MIG-a/1/2", 0, None)],
)  # fmt: skip
def test_cuda_indices_map_to_nvml_ones(monkeypatch, visible, cuda_index, nvml):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert nvml_index(cuda_index, Uuids(), [0, 1]) == nvml


@pytest.fixture
def sampler():
    s = GpuSampler(interval_s=60, nvml=FakeNvml())  # the first sample is taken in start
    assert s.start()
    yield s
    s.stop()


def _worker(sampler: GpuSampler, **settings: object) -> Worker:
    worker = Worker(WorkerConfig(worker_id="w1", **settings))  # type: ignore[arg-type]
    worker.gpus = sampler
    worker._nvml_index = sampler.index_of(worker.config.gpu_index)  # as start() finds it
    return worker


@pytest.mark.parametrize(("gpu_index", "room"), [(0, 60 * GiB), (1, 10 * GiB)])
async def test_the_load_report_carries_its_own_gpus_room(monkeypatch, sampler, gpu_index, room):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    worker = _worker(sampler, gpu_index=gpu_index, place_by_gpu_memory=True)
    assert worker._report()["device_room_bytes"] == room
    assert "device_room_bytes" not in _worker(sampler, gpu_index=gpu_index)._report()  # off by default


async def test_the_room_is_of_the_gpu_cuda_visible_devices_names(monkeypatch, sampler):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # CUDA's GPU 0 is NVML's 1
    assert _worker(sampler, place_by_gpu_memory=True)._report()["device_room_bytes"] == 10 * GiB


async def test_without_nvml_the_report_has_no_figure():
    class NoDriver(FakeNvml):
        def nvmlInit(self) -> None:
            raise OSError("NVML Shared Library Not Found")

    worker = Worker(WorkerConfig(worker_id="w1", place_by_gpu_memory=True))
    worker.gpus = GpuSampler(nvml=NoDriver())
    assert not worker.gpus.start()
    report = worker._report()
    assert "device_room_bytes" not in report and report["worker_id"] == "w1"


async def test_each_devices_utilization_and_memory_are_exported(sampler):
    """The NVML sampler's readings reach the worker's Prometheus metrics, one series per device."""
    worker = Worker(WorkerConfig(worker_id="w1"))
    worker.gpus = sampler
    worker._report()  # each heartbeat's report refreshes the GPU gauges
    value = worker.metrics.registry.get_sample_value
    for device, used in FakeNvml.used.items():
        labels = {"device_id": str(device)}
        assert value("mcp_gpu_utilization_ratio", labels) == pytest.approx(0.1)
        assert value("mcp_gpu_memory_used_bytes", labels) == used
