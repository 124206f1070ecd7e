"""NUMA pinning against a fake sysfs tree in tmp_path: cpulist parsing, bus ids, node -1, missing files, and
pinning applied to this process within the CPUs it already has."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from mcp_worker import numa

BUS = "0000:3b:00.0"


def _sysfs(root: Path, *, node: str | None = "1", cpulists: dict[int, str] | None = None) -> Path:
    """A fake /sys with one GPU at BUS on ``node`` (None: no numa_node file) and the given node cpulists."""
    dev = root / "bus" / "pci" / "devices" / BUS
    dev.mkdir(parents=True)
    if node is not None:
        (dev / "numa_node").write_text(f"{node}\n")
    for n, text in (cpulists or {}).items():
        path = root / "devices" / "system" / "node" / f"node{n}"
        path.mkdir(parents=True)
        (path / "cpulist").write_text(f"{text}\n")
    return root


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0-3", {0, 1, 2, 3}),
        ("0-1,4,6-7\n", {0, 1, 4, 6, 7}),
        ("0-15,32-47", set(range(16)) | set(range(32, 48))),
        ("5", {5}),
        ("", set()),
        ("\n", set()),
    ],
)
def test_parse_cpulist(text: str, want: set[int]) -> None:
    assert numa.parse_cpulist(text) == want


@pytest.mark.parametrize("text", ["a-b", "3-1", "1,,x", "-3", "0-"])
def test_parse_cpulist_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="not a cpulist"):
        numa.parse_cpulist(text)


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("00000000:3B:00.0", BUS),  # nvidia-smi
        ("0000:3B:00.0", BUS),  # CUDA's cuDeviceGetPCIBusId
        ("3b:00.0", BUS),
        (" 0000:3b:00.0\n", BUS),
    ],
)
def test_bus_ids_take_sysfs_spelling(raw: str, want: str) -> None:
    assert numa.normalize_pci_bus_id(raw) == want


def test_bad_bus_id_is_an_error() -> None:
    with pytest.raises(ValueError, match="not a PCI bus id"):
        numa.normalize_pci_bus_id("GPU-1234")


def test_node_and_cpus_from_sysfs(tmp_path: Path) -> None:
    root = _sysfs(tmp_path, node="1", cpulists={0: "0-7", 1: "8-15"})
    assert numa.gpu_numa_node("00000000:3B:00.0", sysfs_root=root) == 1
    assert numa.node_cpus(1, sysfs_root=root) == set(range(8, 16))
    plan = numa.plan_pinning(BUS, range(32), sysfs_root=root)
    assert (plan.node, plan.cpus) == (1, frozenset(range(8, 16)))
    assert "NUMA node 1" in plan.reason


def test_only_cpus_already_allowed_are_chosen(tmp_path: Path) -> None:
    root = _sysfs(tmp_path, cpulists={1: "8-15"})
    assert numa.plan_pinning(BUS, {9, 10, 20}, sysfs_root=root).cpus == {9, 10}
    plan = numa.plan_pinning(BUS, {0, 1}, sysfs_root=root)
    assert not plan.cpus and "allowed" in plan.reason


@pytest.mark.parametrize(
    ("node", "cpulists", "why"),
    [
        ("-1", {0: "0-7"}, "no NUMA node"),  # the platform does not say
        (None, {0: "0-7"}, "no NUMA node"),  # no numa_node file
        ("2", {0: "0-7"}, "no CPUs for NUMA node 2"),  # the node has no cpulist
    ],
)
def test_unknown_placement_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, node: str | None, cpulists: dict[int, str], why: str
) -> None:
    root = _sysfs(tmp_path, node=node, cpulists=cpulists)
    calls: list[object] = []
    with caplog.at_level(logging.INFO, logger="mcp_worker.numa"):
        plan = numa.pin_to_gpu_numa_node(
            BUS, sysfs_root=root, get_affinity=lambda pid: {0, 1}, set_affinity=lambda *a: calls.append(a)
        )
    assert not plan.cpus and why in plan.reason
    assert calls == []
    assert f"not pinning: {plan.reason}" in caplog.text


def test_missing_gpu_directory_is_no_node(tmp_path: Path) -> None:
    assert numa.gpu_numa_node("0000:99:00.0", sysfs_root=tmp_path) is None


def test_malformed_numa_node_is_an_error(tmp_path: Path) -> None:
    root = _sysfs(tmp_path, node="banana")
    with pytest.raises(ValueError, match="expected a node number"):
        numa.gpu_numa_node(BUS, sysfs_root=root)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
def test_pins_this_process_within_its_current_cpus(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The real call, on a node that holds every CPU this process has: the affinity is applied, unchanged."""
    before = os.sched_getaffinity(0)
    root = _sysfs(tmp_path, node="0", cpulists={0: f"0-{max(before) + 8}"})
    try:
        with caplog.at_level(logging.INFO, logger="mcp_worker.numa"):
            plan = numa.pin_to_gpu_numa_node(BUS, sysfs_root=root)
        assert plan.cpus == before
        assert os.sched_getaffinity(0) == before
        assert "pinned to" in caplog.text
    finally:
        os.sched_setaffinity(0, before)


def test_pins_to_the_intersection(tmp_path: Path) -> None:
    root = _sysfs(tmp_path, cpulists={1: "2-3,6"})
    applied: list[tuple[int, frozenset[int]]] = []
    plan = numa.pin_to_gpu_numa_node(
        BUS,
        sysfs_root=root,
        get_affinity=lambda pid: set(range(5)),
        set_affinity=lambda pid, cpus: applied.append((pid, frozenset(cpus))),
    )
    assert applied == [(0, frozenset({2, 3}))] and plan.cpus == {2, 3}
