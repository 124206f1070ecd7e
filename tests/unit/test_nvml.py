"""The NVML sampler with an injected NVML module (no GPU here): readings on a thread, reasons without one."""

from __future__ import annotations

from types import SimpleNamespace

from mcp_worker.nvml import GpuSampler


class FakeNvml:
    def __init__(self, devices: int = 2) -> None:
        self.devices, self.shut = devices, False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return self.devices

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=40 + h)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        if h == 1:
            raise RuntimeError("device fell off the bus")
        return SimpleNamespace(used=1 << 30, total=80 << 30)

    def nvmlDeviceGetPciInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(busId=b"00000000:3B:00.0")


def test_readings_come_from_nvml_and_a_failing_device_is_skipped() -> None:
    nvml = FakeNvml()
    sampler = GpuSampler(interval_s=0.01, nvml=nvml)
    assert sampler.start()
    try:
        readings = sampler.readings()
        assert set(readings) == {0}  # device 1 fails its reads: no made-up figure for it
        assert readings[0].utilization == 0.4 and readings[0].memory_total_bytes == 80 << 30
        assert sampler.pci_bus_id(0) == "00000000:3B:00.0" and sampler.pci_bus_id(5) is None
    finally:
        sampler.stop()
    assert nvml.shut


def test_without_nvml_it_says_why_and_reports_nothing() -> None:
    class Broken(FakeNvml):
        def nvmlInit(self) -> None:
            raise OSError("NVML Shared Library Not Found")

    sampler = GpuSampler(nvml=Broken())
    assert not sampler.start() and "NVML Shared Library Not Found" in sampler.reason
    assert sampler.readings() == {}
    none = GpuSampler(nvml=FakeNvml(devices=0))
    assert not none.start() and none.reason == "NVML sees no GPU"
