"""Pin the worker to the CPUs of its GPU's NUMA node (DESIGN section 9), as sysfs describes them.

A GPU sits on one NUMA node; host buffers filled by threads on that node's CPUs reach the GPU without
crossing the socket interconnect. sysfs says where it sits: ``/sys/bus/pci/devices/<bus id>/numa_node``
(-1 when the platform does not say), and ``/sys/devices/system/node/node<N>/cpulist`` lists the node's
CPUs as ranges (``0-15,32-47``).

Invariants:
- Reading is separate from applying: ``plan_pinning`` only reads files under ``sysfs_root`` (tests point it
  at a fake tree) and decides; ``pin_to_gpu_numa_node`` applies the plan with ``os.sched_setaffinity``.
- A machine that cannot say (files absent, node -1, no CPU of the node allowed to this process) is not an
  error: nothing changes and one log line says why. A malformed bus id or cpulist is a ``ValueError``.
- Only CPUs this process may already use are chosen (the node's CPUs intersected with the current
  affinity), so pinning never widens what a container or cgroup granted.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "NumaPlan",
    "gpu_numa_node",
    "node_cpus",
    "normalize_pci_bus_id",
    "parse_cpulist",
    "pin_to_gpu_numa_node",
    "plan_pinning",
]

log = logging.getLogger(__name__)

_BUS_ID = re.compile(r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])")


@dataclass(frozen=True)
class NumaPlan:
    """What pinning would do: ``cpus`` empty means leave the affinity alone, for ``reason``."""

    pci_bus_id: str
    node: int | None
    cpus: frozenset[int]
    reason: str


def normalize_pci_bus_id(bus_id: str) -> str:
    """sysfs's spelling ``dddd:bb:dd.f`` (lower case, 4-digit domain) of a bus id from CUDA or nvidia-smi,
    which write ``00000000:3B:00.0``; a bare ``3b:00.0`` gets domain 0."""
    match = _BUS_ID.fullmatch(bus_id.strip())
    if match is None:
        raise ValueError(f"not a PCI bus id: {bus_id!r} (expected like 0000:3b:00.0)")
    domain, bus, dev, fn = match.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{fn}"


def parse_cpulist(text: str) -> frozenset[int]:
    """The CPUs of a sysfs cpulist: comma-separated numbers and inclusive ranges; empty text, no CPU."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"not a cpulist: {text.strip()!r} (expected like 0-15,32-47)")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"not a cpulist: {text.strip()!r} (range {part} runs backwards)")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def gpu_numa_node(pci_bus_id: str, *, sysfs_root: str | Path = "/sys") -> int | None:
    """The NUMA node of the PCI device, or None when sysfs has no answer (file absent, or -1)."""
    path = Path(sysfs_root) / "bus" / "pci" / "devices" / normalize_pci_bus_id(pci_bus_id) / "numa_node"
    try:
        raw = path.read_text().strip()
    except OSError:
        return None
    try:
        node = int(raw)
    except ValueError:
        raise ValueError(f"{path}: expected a node number, got {raw!r}") from None
    return node if node >= 0 else None


def node_cpus(node: int, *, sysfs_root: str | Path = "/sys") -> frozenset[int] | None:
    """The CPUs of NUMA node ``node``, or None when sysfs does not list them."""
    path = Path(sysfs_root) / "devices" / "system" / "node" / f"node{node}" / "cpulist"
    try:
        return parse_cpulist(path.read_text())
    except OSError:
        return None


def plan_pinning(pci_bus_id: str, allowed: Iterable[int], *, sysfs_root: str | Path = "/sys") -> NumaPlan:
    """Which CPUs to pin to: the GPU's node's CPUs among ``allowed`` (the current affinity)."""
    bus_id = normalize_pci_bus_id(pci_bus_id)
    node = gpu_numa_node(bus_id, sysfs_root=sysfs_root)
    if node is None:
        return NumaPlan(bus_id, None, frozenset(), f"sysfs gives no NUMA node for GPU {bus_id}")
    cpus = node_cpus(node, sysfs_root=sysfs_root)
    if cpus is None:
        return NumaPlan(bus_id, node, frozenset(), f"sysfs lists no CPUs for NUMA node {node}")
    chosen = cpus & frozenset(allowed)
    if not chosen:
        why = f"none of NUMA node {node}'s CPUs is allowed to this process"
        return NumaPlan(bus_id, node, frozenset(), why)
    return NumaPlan(bus_id, node, chosen, f"GPU {bus_id} is on NUMA node {node}")


def pin_to_gpu_numa_node(
    pci_bus_id: str,
    *,
    sysfs_root: str | Path = "/sys",
    get_affinity: Callable[[int], Iterable[int]] = os.sched_getaffinity,
    set_affinity: Callable[[int, Iterable[int]], None] = os.sched_setaffinity,
) -> NumaPlan:
    """Pin this process to the CPUs of the GPU's NUMA node when sysfs says which; log what was done."""
    plan = plan_pinning(pci_bus_id, get_affinity(0), sysfs_root=sysfs_root)
    if not plan.cpus:
        log.info("numa: not pinning: %s", plan.reason)
        return plan
    set_affinity(0, plan.cpus)
    log.info("numa: pinned to %d CPUs (%s): %s", len(plan.cpus), _ranges(plan.cpus), plan.reason)
    return plan


def _ranges(cpus: Iterable[int]) -> str:
    ordered = sorted(cpus)
    spans: list[str] = []
    start = prev = ordered[0]
    for cpu in [*ordered[1:], None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        spans.append(f"{start}-{prev}" if prev != start else str(start))
        if cpu is not None:
            start = prev = cpu
    return ",".join(spans)
