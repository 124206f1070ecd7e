"""The producer of the NVML figures (NVML injected here: no GPU needed): a worker's load report carries its
own GPU's measured free memory (``device_free_bytes``) and leaves it out without a reading, and its metrics
export each device's utilization and memory in use."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mcp_worker.config import WorkerConfig
from mcp_worker.nvml import GpuSampler, Reading
from mcp_worker.server import Worker, device_free_bytes

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


def test_device_free_bytes_is_total_less_used_of_the_given_device():
    readings = {0: Reading(0.1, 20 * GiB, 80 * GiB, 1.0), 1: Reading(0.1, 70 * GiB, 80 * GiB, 1.0)}
    assert device_free_bytes(readings, 0) == 60 * GiB
    assert device_free_bytes(readings, 1) == 10 * GiB
    assert device_free_bytes(readings, 2) is None  # no such device read
    assert device_free_bytes({}, 0) is None  # no NVML
    assert device_free_bytes({0: Reading(0.0, 81 * GiB, 80 * GiB, 1.0)}, 0) == 0  # never negative


@pytest.fixture
def sampler():
    s = GpuSampler(interval_s=60, nvml=FakeNvml())  # the first sample is taken in start
    assert s.start()
    yield s
    s.stop()


@pytest.mark.parametrize(("gpu_index", "free"), [(0, 60 * GiB), (1, 10 * GiB)])
def test_the_load_report_carries_its_own_gpus_free_memory(sampler, gpu_index, free):
    worker = Worker(WorkerConfig(worker_id="w1", gpu_index=gpu_index))
    worker.gpus = sampler
    assert worker._report()["device_free_bytes"] == free


def test_without_nvml_the_report_has_no_figure():
    class NoDriver(FakeNvml):
        def nvmlInit(self) -> None:
            raise OSError("NVML Shared Library Not Found")

    worker = Worker(WorkerConfig(worker_id="w1"))
    worker.gpus = GpuSampler(nvml=NoDriver())
    assert not worker.gpus.start()
    report = worker._report()
    assert "device_free_bytes" not in report and report["worker_id"] == "w1"


def test_each_devices_utilization_and_memory_are_exported(sampler):
    """The NVML sampler's readings reach the worker's Prometheus metrics, one series per device."""
    worker = Worker(WorkerConfig(worker_id="w1"))
    worker.gpus = sampler
    worker._report()  # each heartbeat's report refreshes the GPU gauges
    value = worker.metrics.registry.get_sample_value
    for device, used in FakeNvml.used.items():
        labels = {"device_id": str(device)}
        assert value("mcp_gpu_utilization_ratio", labels) == pytest.approx(0.1)
        assert value("mcp_gpu_memory_used_bytes", labels) == used
