"""Choosing workers for new replicas of one (model, version), by memory, labels and spread (DESIGN.md 6).

Invariants:
- Pure: reads a ``ClusterView`` and returns a ``Placement``; never mutates the view.
- A chosen worker is registered, not stopped, not draining, carries every required label, holds no record
  of the (model, version) yet, is not excluded, and has ``free >= need_bytes`` where free counts every
  recorded replica (measured bytes, else the model's declared bytes), UNLOADING ones included, and the
  caller's reservations. Where the worker's load report measured the room its GPU has for it (NVML: the
  device's total less what other processes hold), capacity counts as at most that room.
- A worker that fits only once its UNLOADING replicas are gone is ``waiting``: no load now (the memory is
  still held), and no eviction for that copy either (the room is coming: evicting more would cascade).
- Evictions only ever name replicas of models with a strictly lower spec priority, in READY, RUNNING or
  PAUSED, and never a model's last RUNNING replica of a version in its routing in force (UNLOADING
  replicas, those an unload in flight takes, and those already taken do not count as others). They free room
  for a later round: the chosen workers never count on memory an eviction has yet to release.
- ``shortfall`` is set exactly when fewer than ``count`` copies are covered, and says why in words.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from mcp_scheduler.view import ClusterView, ReplicaInfo, ReplicaKey, WorkerInfo
from mcpcore.lifecycle import ReplicaState

__all__ = [
    "EVICTABLE",
    "Placement",
    "format_bytes",
    "free_bytes",
    "place",
    "replica_bytes",
    "unloading_bytes",
]

S = ReplicaState
#: States an eviction may unload (LOADING finishes first; UNLOADING is already going).
EVICTABLE = frozenset({S.READY, S.RUNNING, S.PAUSED})


@dataclass(frozen=True)
class Placement:
    workers: list[str] = field(default_factory=list)  # load one copy on each, now
    waiting: list[str] = field(default_factory=list)  # fit once their unloads finish: load there later
    evictions: list[ReplicaKey] = field(default_factory=list)  # unload now; place next round
    shortfall: str | None = None  # why some copies could not be covered


def replica_bytes(view: ClusterView, replica: ReplicaInfo) -> int:
    """A replica's memory: measured when known, else its model's declared bytes."""
    if replica.memory_bytes:
        return replica.memory_bytes
    spec = view.specs.get(replica.model)
    return spec.memory_bytes if spec is not None else 0


def free_bytes(
    view: ClusterView,
    worker: WorkerInfo,
    reserved: Mapping[str, int] | None = None,
    used: Mapping[str, int] | None = None,
) -> int:
    """Capacity (at most its GPU's measured room) less recorded replicas (``used``: their sum per worker,
    when the caller has it) and ``reserved``."""
    room = worker.device_room_bytes
    capacity = worker.capacity_bytes if room is None or room >= worker.capacity_bytes else room
    return (
        capacity - _held(view, worker.id, used) - (reserved if reserved is not None else {}).get(worker.id, 0)
    )


def _held(view: ClusterView, worker: str, used: Mapping[str, int] | None) -> int:
    return used[worker] if used is not None else sum(replica_bytes(view, r) for r in view.replicas_on(worker))


def unloading_bytes(view: ClusterView, worker: str) -> int:
    """Memory that replicas on their way out (UNLOADING) still hold on ``worker``."""
    return sum(replica_bytes(view, r) for r in view.replicas_on(worker) if r.state is S.UNLOADING)


def format_bytes(n: int) -> str:
    for unit, size, floor in (("GiB", 1 << 30, 0.1), ("MiB", 1 << 20, 0.1), ("KiB", 1 << 10, 1.0)):
        if abs(n) >= size * floor:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def place(
    view: ClusterView,
    model: str,
    version: str,
    *,
    count: int,
    need_bytes: int,
    priority: int,
    labels: Mapping[str, str],
    exclude: Iterable[str] = (),
    reserved: Mapping[str, int] | None = None,
    used: Mapping[str, int] | None = None,
) -> Placement:
    """Up to ``count`` workers for new copies of ``model``/``version``, evictions that would make room for
    the rest, and a shortfall message for what neither covers. ``used``: memory held per worker by its
    recorded replicas, if the caller keeps it (else summed here)."""
    if count <= 0:
        return Placement()
    ask = _Ask(model, version, need_bytes, priority, labels, frozenset(exclude))
    free = _eligible_free(view, ask, reserved if reserved is not None else {}, used)
    holders = {r.worker for r in view.replicas_of(model)}
    fits = (w for w in free if free[w] >= need_bytes)
    chosen = heapq.nsmallest(count, fits, key=lambda w: (w in holders, -free[w], w))
    if len(chosen) == count:
        return Placement(workers=chosen)
    soon = {w: f + unloading_bytes(view, w) for w, f in free.items() if w not in chosen}
    waiting = sorted((w for w in soon if soon[w] >= need_bytes), key=lambda w: (-soon[w], w))
    waiting = waiting[: count - len(chosen)]
    if len(chosen) + len(waiting) == count:
        return Placement(workers=chosen, waiting=waiting)
    rest = sorted((w for w in soon if w not in waiting), key=lambda w: (-soon[w], w))
    evictions, covered = _evictions(view, ask, {w: soon[w] for w in rest}, count - len(chosen) - len(waiting))
    missing = count - len(chosen) - len(waiting) - covered
    if missing <= 0:
        return Placement(workers=chosen, waiting=waiting, evictions=evictions)
    taken = sorted({*chosen, *waiting, *(k[2] for k in evictions)})
    unused = {w: f for w, f in soon.items() if w not in taken}
    return Placement(chosen, waiting, evictions, _shortfall(view, ask, missing, unused, taken))


@dataclass(frozen=True)
class _Ask:
    """What one ``place`` call looks for."""

    model: str
    version: str
    need: int
    priority: int
    labels: Mapping[str, str]
    excluded: frozenset[str]


def _eligible_free(
    view: ClusterView, ask: _Ask, reserved: Mapping[str, int], used: Mapping[str, int] | None
) -> dict[str, int]:
    """Free bytes of every worker ``_why_not`` accepts (the same rules, inlined: it runs per worker per
    copy placed, the planner's hottest loop)."""
    labels = tuple(ask.labels.items())
    replicas, excluded = view.replicas, ask.excluded
    free: dict[str, int] = {}
    for w in view.workers.values():
        if w.stopped or w.draining or w.id in excluded:
            continue
        if labels and any(w.labels.get(k) != v for k, v in labels):
            continue
        if (ask.model, ask.version, w.id) in replicas:
            continue
        held = used[w.id] if used is not None else sum(replica_bytes(view, r) for r in view.replicas_on(w.id))
        capacity, room = w.capacity_bytes, w.device_room_bytes
        if room is not None and room < capacity:  # other processes hold memory on its GPU
            capacity = room
        free[w.id] = capacity - held - reserved.get(w.id, 0)
    return free


def _why_not(view: ClusterView, w: WorkerInfo, ask: _Ask) -> str | None:
    """Why worker ``w`` cannot take a copy (None: it can, memory permitting)."""
    if any(w.labels.get(k) != v for k, v in ask.labels.items()):
        return f"lacks labels {_labels(ask.labels)}"
    if w.stopped:
        return "is stopped"
    if w.draining:
        return "is draining"
    held = view.replicas.get((ask.model, ask.version, w.id))
    if held is not None:  # a copy that failed there says why (the worker's words), so LoadModel's answer does
        return (
            f"failed to load it: {held.reason}"
            if held.state is S.ERROR and held.reason
            else "already holds a copy"
        )
    if w.id in ask.excluded:
        return "is excluded (a recent failure there, or a load under way)"
    return None


# --- eviction --------------------------------------------------------------------------------------------


def _evictions(
    view: ClusterView, ask: _Ask, free: Mapping[str, int], missing: int
) -> tuple[list[ReplicaKey], int]:
    """Evictions for up to ``missing`` copies, each on the worker (of ``free``, most free first) that needs
    the fewest; and how many copies they cover."""
    taken: list[ReplicaKey] = []
    remaining = list(free)
    covered = 0
    while covered < missing:
        best: tuple[str, list[ReplicaKey]] | None = None
        for w in remaining:
            victims = _evict_on(view, ask, w, free[w], set(taken))
            if victims is not None and (best is None or len(victims) < len(best[1])):
                best = (w, victims)
        if best is None:
            break
        remaining.remove(best[0])
        taken.extend(best[1])
        covered += 1
    return taken, covered


def _evict_on(
    view: ClusterView, ask: _Ask, worker: str, free: int, taken: set[ReplicaKey]
) -> list[ReplicaKey] | None:
    """The replicas to evict on ``worker`` so that ``ask.need`` bytes fit (idle before RUNNING, least
    recently changed first), or None if even all evictable ones are not enough."""
    candidates = sorted(
        (r for r in view.replicas_on(worker) if _evictable(view, r, ask.priority, taken)),
        key=lambda r: (r.state is S.RUNNING, r.since, r.key),
    )
    victims: list[ReplicaKey] = []
    for r in candidates:
        if free >= ask.need:
            break
        victims.append(r.key)
        free += replica_bytes(view, r)
    return victims if free >= ask.need else None


def _evictable(view: ClusterView, r: ReplicaInfo, priority: int, taken: set[ReplicaKey]) -> bool:
    spec = view.specs.get(r.model)
    if r.state not in EVICTABLE or r.key in taken or spec is None or spec.priority >= priority:
        return False
    routing = view.routing.get(r.model)
    if routing is None or r.version not in routing.versions:
        return True
    return any(  # another RUNNING copy of the routed version stays (UNLOADING ones are not RUNNING)
        o.key != r.key and o.key not in taken and o.state is S.RUNNING and _serving(view, o.worker)
        for o in view.replicas_of(r.model, r.version)
    )


def _serving(view: ClusterView, worker: str) -> bool:
    w = view.workers.get(worker)
    return w is not None and not w.stopped


# --- shortfall -------------------------------------------------------------------------------------------


def _shortfall(
    view: ClusterView,
    ask: _Ask,
    missing: int,
    free: Mapping[str, int],
    taken: list[str],
) -> str:
    """Why ``missing`` copies found no room: ``free`` has the eligible workers not taken for other copies."""
    head = f"cannot place {ask.model}/{ask.version} ({missing} more {'copy' if missing == 1 else 'copies'})"
    if not view.workers:
        return f"{head}: no worker is registered"
    labelled = [w for w in view.workers.values() if all(w.labels.get(k) == v for k, v in ask.labels.items())]
    if not labelled:
        return f"{head}: no worker carries labels {_labels(ask.labels)}"
    if not free:
        reasons = sorted(f"{w.id} {_why_not(view, w, ask)}" for w in labelled if w.id not in taken)
        what = f"no other eligible worker than {', '.join(taken)}" if taken else "no eligible worker"
        return f"{head}: {what}" + (f": {_listing(reasons)}" if reasons else "")
    needs = f"needs {format_bytes(ask.need)}" + (f" with labels {_labels(ask.labels)}" if ask.labels else "")
    ranked = sorted(free, key=lambda w: (-free[w], w))
    listing = [f"{ranked[0]} has {format_bytes(free[ranked[0]])} free{_measured(view, ranked[0])}"]
    listing += [f"{w} {format_bytes(free[w])}{_measured(view, w)}" for w in ranked[1:]]
    return f"{head}: {needs}; eligible workers: {_listing(listing)}; no lower-priority replica can be evicted"


def _measured(view: ClusterView, worker: str) -> str:
    """`` (other processes leave N on its GPU)`` where that measured room, not capacity, limits ``worker``."""
    w = view.workers[worker]
    room = w.device_room_bytes
    if room is None or room >= w.capacity_bytes:
        return ""
    return f" (other processes leave {format_bytes(room)} on its GPU)"


def _labels(labels: Mapping[str, str]) -> str:
    return "{" + ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}"


def _listing(items: list[str], limit: int = 6) -> str:
    shown = ", ".join(items[:limit])
    return shown if len(items) <= limit else f"{shown} and {len(items) - limit} more"
