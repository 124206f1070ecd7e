"""The reconcile planner: a ``ClusterView`` in, idempotent actions and per-model status out (DESIGN.md 6).

Each planned model goes through one round: forget records nobody holds, work out the copies each version
needs (spec, hot-copy signal, load on demand, fallback), unload the excess, place the missing, start or
pause to match the spec, then route (``rollout``). ``plan_ledger`` holds what the plan changed of the view;
``actions`` what it emits.

Invariants:
- Pure and deterministic: the same inputs give the same ``Plan``; actions are sorted by model, version,
  worker (a model's ``PublishRouting`` after its replica actions, its ``RollbackCanary`` last).
- ``models`` names the models to plan (default: every model the view knows); only their records are
  forgotten, only they get status, and only their copies are added or removed (an eviction may still
  unload another model's replica to make room). Planning a batch costs what its models have plus, per
  copy to place, one pass over the workers: never a scan of every replica in the cluster.
- At most one action per replica key, and none for a key with an action in flight (``in_flight`` names
  each one's kind). Never a ``LoadReplica`` onto a worker that is dead, stopped or draining, nor past a
  worker's memory (placement counts recorded replicas, loads in flight and the loads planned earlier in
  the same plan).
- A replica with an unload (or forget) in flight, or in UNLOADING, is gone for planning: never a copy,
  never the "other copy" that makes an eviction safe, and its memory is freed for deciding whether more
  evictions are needed (a worker that fits once its unloads finish gets the load then: the round waits,
  with the room held, rather than evicting more).
- Safe flips and canary rollback as ``rollout`` states them: routing follows only versions RUNNING on
  ``max(1, required)`` replicas on live, not-stopped workers.
- A record written by another incarnation of its worker than the one registered now is stale: never a
  copy, forgotten (the process that wrote it is gone; routers do not follow it either).
- Never unloads below the required RUNNING copies: a drained or excess copy goes only once enough RUNNING
  copies on usable workers remain; an eviction never takes the last RUNNING copy of a routed version
  (copies on their way out do not count). A LOADING replica is left to finish; a stopped worker gets no
  actions but ``ForgetReplica`` (an emergency stop releases its replicas itself).
- The models of one plan are planned by descending priority, so higher-priority ones claim memory
  first (across batches the reconciler queues the models waiting for room first when room frees).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import replace

from mcp_scheduler.actions import (
    Action,
    ForgetReplica,
    InFlight,
    InFlightActions,
    LoadReplica,
    ModelStatus,
    PauseReplica,
    Plan,
    PublishRouting,
    ReplicaAction,
    RollbackCanary,
    StartReplica,
    UnloadReplica,
)
from mcp_scheduler.placement import place
from mcp_scheduler.plan_ledger import HEALTHY, PlanReplicas, Reserved, Used
from mcp_scheduler.rollout import route, without_canary
from mcp_scheduler.view import ClusterView, ModelSpecDoc, ReplicaInfo, ReplicaKey, TrafficDoc
from mcpcore.lifecycle import ReplicaState

__all__ = ["plan"]

S = ReplicaState
UNLOADABLE = frozenset({S.READY, S.RUNNING, S.PAUSED})


def plan(
    view: ClusterView,
    *,
    models: Collection[str] | None = None,
    in_flight: Mapping[ReplicaKey, InFlight] | None = None,
    backoff: Mapping[ReplicaKey, float] | None = None,
    extra_copies: Mapping[str, int] | None = None,
    placement_budget: int | None = None,
) -> Plan:
    """The actions that move ``models`` of ``view`` (default: all) toward their specs and traffic, and their
    status.

    ``in_flight``: actions under way, by kind (loads count as copies, unloads as gone); ``backoff``: no new
    load of a key before its time; ``extra_copies``: copies more (hot models, capped by ``max_replicas``)
    or fewer (quiet ones, down to ``min_replicas``) than the spec's ``replicas``; ``placement_budget``:
    once this many placements (each a pass over the workers) are done, the models not yet planned are
    ``deferred`` (no actions, no status), so one plan's cost stays bounded.
    """
    chosen = view.models() if models is None else set(models)
    planner = _Planner(view, in_flight or {}, backoff or {}, extra_copies or {})
    planner.budget = placement_budget
    return planner.run(chosen)


def _order(action: Action) -> tuple[str, int, int, str, str]:
    if isinstance(action, PublishRouting):
        return (action.model, 1, 0, "", "")
    if isinstance(action, RollbackCanary):
        return (action.model, 2, 0, "", "")
    return (action.model, 0, int(action.version), action.worker, type(action).__name__)


class _Planner:
    def __init__(
        self,
        view: ClusterView,
        in_flight: Mapping[ReplicaKey, InFlight],
        backoff: Mapping[ReplicaKey, float],
        extra: Mapping[str, int],
    ) -> None:
        self.view = view
        self.in_flight = in_flight if isinstance(in_flight, InFlightActions) else InFlightActions(in_flight)
        self.backoff = backoff
        self.extra = extra
        self.resting: dict[tuple[str, str], set[str]] = defaultdict(set)  # per (model, version): in backoff
        for (m, v, w), until in backoff.items():
            if until > view.now:
                self.resting[(m, v)].add(w)
        self.actions: dict[ReplicaKey, ReplicaAction] = {}
        self.publish: list[PublishRouting | RollbackCanary] = []
        self.errors: dict[str, list[str]] = defaultdict(list)
        self.waiting: dict[str, list[str]] = defaultdict(list)
        self.status: dict[str, ModelStatus] = {}
        # evicted ones, and those an unload in flight takes away, become UNLOADING: gone for planning
        self.replicas = PlanReplicas(view.replicas, self.in_flight)
        self.placing = view.with_replicas(self.replicas)  # what placement reads: this plan's replicas
        self.stale: dict[str, list[ReplicaInfo]] = defaultdict(list)  # worker -> records taken away
        self.idle: set[ReplicaKey] = set()  # idle records taken away: to forget, unless loaded again
        self.used = Used(view, self.stale)
        self.reserved = Reserved(view, self.in_flight, self._need_bytes)
        self.budget: int | None = None  # placements allowed (None: no limit)
        self.placements = 0

    def run(self, models: set[str]) -> Plan:
        self._forget(models)
        specs = [self.view.specs[m] for m in models if m in self.view.specs]
        deferred = []
        for spec in sorted(specs, key=lambda s: (-s.priority, s.model)):
            if self.budget is not None and self.placements >= self.budget:
                deferred.append(spec.model)
            else:
                self._model(spec)
        for model in sorted(m for m in models if m not in self.view.specs):
            self._orphan(model)
        actions = sorted([*self.actions.values(), *self.publish], key=_order)
        return Plan(tuple(actions), dict(sorted(self.status.items())), tuple(deferred))

    # -- helpers ---------------------------------------------------------------------------------------
    def _add(self, action: ReplicaAction) -> bool:
        key = action.key
        if key in self.in_flight:
            return False
        if key in self.actions:
            if not (isinstance(action, LoadReplica) and key in self.idle):
                return False
            self.idle.discard(key)  # an idle record loaded again instead of forgotten (the load takes it)
        self.actions[key] = action
        return True

    def _usable(self, worker: str) -> bool:
        w = self.view.workers.get(worker)
        return w is not None and not w.stopped and not w.draining

    def _serving(self, worker: str) -> bool:
        w = self.view.workers.get(worker)
        return w is not None and not w.stopped

    def _copies(self, model: str, version: str) -> list[ReplicaInfo]:
        """Healthy replicas of ``model``/``version`` on live workers, by worker."""
        return sorted(
            (
                r
                for r in self.placing.replicas_of(model, version)
                if r.state in HEALTHY and r.worker in self.view.workers
            ),
            key=lambda r: r.worker,
        )

    def _running(self, model: str, version: str) -> int:
        return sum(
            1 for r in self._copies(model, version) if r.state is S.RUNNING and self._serving(r.worker)
        )

    def _need_bytes(self, model: str, version: str) -> int:
        spec = self.view.specs.get(model)
        if spec is not None and spec.memory_bytes:
            return spec.memory_bytes
        return max((r.memory_bytes for r in self.view.replicas_of(model, version)), default=0)

    def _unload(self, r: ReplicaInfo, reason: str) -> None:
        if r.state in UNLOADABLE and self._serving(r.worker):
            self._add(UnloadReplica(r.model, r.version, r.worker, reason))

    # -- records to forget -----------------------------------------------------------------------------
    def _forget(self, models: set[str]) -> None:
        keys = [k for m in models for k in self.view.by_model.get(m, ()) if k in self.view.replicas]
        for key in sorted(keys):
            r = self.view.replicas[key]
            w = self.view.workers.get(r.worker)
            if w is None:
                reason = f"worker {r.worker} is gone"
            elif r.incarnation and w.incarnation and r.incarnation != w.incarnation:
                reason = f"stale: written by an earlier process under worker id {r.worker}"
                self.replicas.pop(key, None)  # a claim nobody holds: not a copy, not memory in use
                self.stale[r.worker].append(r)
            elif r.state is S.ERROR:
                reason = f"failed: {r.reason}" if r.reason else "failed"
            elif r.state is S.IDLE and key not in self.in_flight:
                reason = "idle record (unloaded, or a load that never started)"
                # it holds nothing: placement may load there again (which replaces this forget)
                self.replicas.pop(key, None)
                self.stale[r.worker].append(r)
                self.idle.add(key)
            else:
                continue
            self._add(ForgetReplica(r.model, r.version, r.worker, r.revision, reason))

    # -- one model ---------------------------------------------------------------------------------------
    def _model(self, spec: ModelSpecDoc) -> None:
        m = spec.model
        wanted = self.view.traffic.get(m) or TrafficDoc(stable=max(spec.versions, key=int))
        wanted, rollback = without_canary(self.view, m, wanted)
        if rollback is not None:
            self.publish.append(rollback)
        required = self._required(spec, wanted)
        for v in sorted(required, key=int):
            copies = self._copies(m, v)
            self._excess(spec, v, required[v], copies)
            self._fill(spec, v, required[v])
            self._lifecycle(spec, v, copies)
        for r in sorted(self.view.replicas_of(m), key=lambda r: r.key):
            if r.version not in required:
                self._unload(r, f"version {r.version} of {m} is no longer needed")
        self._route(spec, wanted, required)

    def _required(self, spec: ModelSpecDoc, wanted: TrafficDoc) -> dict[str, int]:
        """Copies required of each needed version."""
        routed = self.view.routing.get(spec.model)
        in_play = set(wanted.versions) | set(routed.versions if routed else ())
        needed = set(spec.versions) | in_play
        if spec.load_on_demand and spec.replicas == 0:
            one = self._with_extra(spec, 1) if self._demanded(spec.model, in_play) else 0
            out = {v: one if v in in_play else 0 for v in needed}
        else:
            out = dict.fromkeys(needed, self._with_extra(spec, spec.replicas))
        if spec.fallback_version is not None:
            out[spec.fallback_version] = max(1, out.get(spec.fallback_version, 0))
        return out

    def _with_extra(self, spec: ModelSpecDoc, base: int) -> int:
        """``base`` copies moved by the hot-copy signal, within [min_replicas, max_replicas] (0: base)."""
        cap = spec.max_replicas or base  # max_replicas 0: no extra copies
        floor = spec.min_replicas if 0 < spec.min_replicas < base else base
        return max(floor, min(base + self.extra.get(spec.model, 0), cap))

    def _demanded(self, model: str, in_play: set[str]) -> bool:
        """A load-on-demand model is wanted once asked for, and stays while it has copies (the router
        stops asking once a copy exists: dropping it then would make loads flap)."""
        if any(d.requests > 0 for d in self.view.demand.get(model, ())):
            return True
        if any("load" in self.in_flight.of(model, v).values() for v in in_play):
            return True
        return any(self._copies(model, v) for v in in_play)

    def _excess(self, spec: ModelSpecDoc, version: str, required: int, copies: list[ReplicaInfo]) -> None:
        """Unload copies beyond ``required`` once that many settled copies sit on usable workers: drained
        ones first, then the not yet RUNNING, then the newest."""
        settled = {S.RUNNING, S.PAUSED} if version in spec.paused_versions else {S.RUNNING}
        good = [r for r in copies if r.state in settled and self._usable(r.worker)]
        if len(good) < required:
            return
        keep = {r.key for r in sorted(good, key=lambda r: (r.since, r.worker))[:required]}
        for r in copies:
            if r.key in keep:
                continue
            w = self.view.workers[r.worker]
            why = f"worker {r.worker} is draining" if w.draining else "excess copy"
            self._unload(r, f"{why}: {len(good)} settled copies of {r.model}/{version}, {required} required")

    def _fill(self, spec: ModelSpecDoc, version: str, required: int) -> None:
        m = spec.model
        counted = {r.key for r in self._copies(m, version) if self._usable(r.worker)}
        counted |= {
            (m, version, w)
            for w, kind in self.in_flight.of(m, version).items()
            if kind == "load" and self._in_flight_counts((m, version, w))
        }
        missing = required - len(counted)
        if missing <= 0:
            return
        exclude = self.resting.get((m, version), set()) | set(self.in_flight.of(m, version))  # busy: counted
        need = self._need_bytes(m, version)
        self.placements += 1
        p = place(
            self.placing,
            m,
            version,
            count=missing,
            need_bytes=need,
            priority=spec.priority,
            labels=spec.labels,
            exclude=exclude,
            reserved=self.reserved,
            used=self.used,
        )
        reason = f"{len(counted)}/{required} copies of {m}/{version}"
        for w in p.workers:
            if self._add(LoadReplica(m, version, w, reason)):
                self.reserved[w] += need
        for w in p.waiting:  # fits once its unloads finish: the room is held for this model meanwhile
            self.reserved[w] += need
            self.waiting[m].append(f"{m}/{version} waits for replicas unloading on {w}")
        self._evict(p.evictions, need, f"{m}/{version} (priority {spec.priority})")
        if p.shortfall:
            # a worker whose idle record of this version is being forgotten can take the copy once it is
            # gone: a wait, not a failure (a copy unloading or evicted stays a shortfall: it is not coming
            # back)
            leaving = sorted(
                r.worker
                for r in self.placing.replicas_of(m, version)
                if r.state is S.IDLE
                and self.in_flight.get(r.key) == "forget"
                and self._usable(r.worker)
                and r.worker not in self.resting.get((m, version), ())
            )
            if leaving:
                self.waiting[m].append(
                    f"{m}/{version} waits for its old record on {', '.join(leaving)} to be cleared"
                )
            else:
                self.errors[m].append(p.shortfall)

    def _in_flight_counts(self, key: ReplicaKey) -> bool:
        r = self.replicas.get(key)
        return self._usable(key[2]) and (r is None or r.state in HEALTHY or r.state is S.IDLE)

    def _evict(self, keys: list[ReplicaKey], need: int, room_for: str) -> None:
        """Unload ``keys``; the room they free stays reserved for ``room_for`` for the rest of this plan, so a
        lower-priority model cannot take it (and be evicted again next round)."""
        for key in keys:
            r = self.replicas[key]
            if self._add(UnloadReplica(*key, reason=f"evicted to make room for {room_for}")):
                self.replicas[key] = replace(r, state=S.UNLOADING)
        for worker in sorted({k[2] for k in keys}):
            self.reserved[worker] += need

    def _lifecycle(self, spec: ModelSpecDoc, version: str, copies: list[ReplicaInfo]) -> None:
        paused = version in spec.paused_versions
        for r in copies:
            if not self._serving(r.worker):
                continue  # an emergency stop releases its replicas itself
            if r.state in (S.READY, S.PAUSED) and not paused:
                self._add(StartReplica(r.model, r.version, r.worker))
            elif r.state is S.RUNNING and paused:
                self._add(PauseReplica(r.model, r.version, r.worker))

    # -- routing and status ----------------------------------------------------------------------------
    def _route(self, spec: ModelSpecDoc, wanted: TrafficDoc, required: Mapping[str, int]) -> None:
        m = spec.model
        publish, self.status[m] = route(
            spec,
            wanted=wanted,
            current=self.view.routing.get(m),
            running={v: self._running(m, v) for v in required},
            required=required,
            errors=self.errors.get(m, []),
            waiting=self.waiting.get(m, []),
        )
        if publish is not None:
            self.publish.append(publish)

    def _orphan(self, model: str) -> None:
        for r in sorted(self.view.replicas_of(model), key=lambda r: r.key):
            self._unload(r, f"model {model} has no spec")
        if model in self.view.routing:
            self.publish.append(PublishRouting(model, None))
