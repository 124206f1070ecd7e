"""The fault scenarios, defined once: ``make test`` runs each briefly (tests/integration/test_delivery.py,
thread clients on one mesh for the module) and ``make chaos`` runs them longer against SDK client
processes (tests/chaos/test_chaos.py), each writing a row to ``bench/chaos.json``.

A scenario is a fault function with its own checks; ``run`` wraps it in what every scenario checks: checked
load on an idempotent model (``demo-mlp``) and a non-idempotent one (``demo-stateful``), two copies each,
flowing before the fault; after it the mesh back at its replica counts (records matched by what the
workers hold) plus the scenario's own recovery condition, and answers flowing again. Then: idempotent
requests 0 failed and 0 wrong; ``demo-stateful`` 0 wrong, 0 run twice (every worker's execution journal,
killed ones' included), and its only failures UNAVAILABLE "may have started", each counted by a router.

Figures (one row): ``sent`` requests, ``succeeded``, ``failed`` (``may_have_started`` of them the
stateful ones a fault caught mid-execution), ``injected`` (answers that were a failing backend's injected
errors: the drill's, not failures), ``retried`` (router resends, ``mcp_router_retries_total``, plus the
clients' own resends, fallbacks and failovers), ``duplicated`` executions, and ``recovery_s``: seconds
from the end of the fault (the kill, the SIGCONT, etcd back, the link healed, the backend healed) until the
mesh is consistent, the scenario's recovery condition holds, and each load got 20 more answers.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from harness import etcd_get, etcd_put, metric, wait_for
from meshload import INJECTED, LoadResult, Mesh, SdkLoad, settle

from mcpapi.v2 import control_pb2, control_pb2_grpc, model_pb2

WANTED = {"demo-mlp": 2, "demo-stateful": 2}
FLAKY = "demo-flaky"
FAULT_RATIO_FILE = "fault_ratio"  # tools/make_models.py FAULT_RATIO_FILE
#: The default policy's levels and thresholds (DESIGN.md 8: 0.3, 0.6, 0.9); window and cool-down shorter
#: than its 30 s and 5 min, so that a drill sees the levels walk up and down within its run.
POLICY_LEVELS = [
    {"threshold": 0.3, "action": "reduce_batch_size", "params": {"ratio": 0.5}},
    {
        "threshold": 0.6,
        "action": "disable_secondary_features",
        "params": {"features": ["recommend", "ranking"]},
    },
    {"threshold": 0.9, "action": "fallback_to_static", "params": {"version": "v1.0-backup"}},
]
RSS_GROWTH_MIB = 64  # overload: what a router or worker may grow by (memory stays flat: refusals are cheap)
LoadFactory = Callable[..., Any]  # (model, clients=4, any_version=False) -> a CheckedLoad or SdkLoad


@dataclass
class Drill:
    """What a fault function acts on and reports into."""

    mesh: Mesh
    repo: Path
    load: LoadFactory
    hold_s: float  # how long a fault that has a length holds (a partition, a failing backend's plateau)
    timing: bool  # timing comparisons are checked (make chaos only; make test checks no timings)
    ended: float = 0.0  # when the fault ended (monotonic); default: when the fault function returned
    recovered: Callable[[], bool] = lambda: True  # the scenario's own "recovered" besides consistency
    lost_in_flight: int = 0  # requests a killed router held: they fail (see ``kill_router``)
    injected: int = 0
    retried: int = 0
    figures: dict[str, float] = field(default_factory=dict)
    background: tuple[Any, ...] = ()  # the loads ``run`` keeps up through every fault


@dataclass(frozen=True)
class Scenario:
    name: str
    fault: Callable[[Drill], None]
    stateful: str = "may_fail"  # "none": no stateful failure at all; "some": the fault must catch some


def breaker_policy(mesh: Mesh, window_s: float, cool_down_s: float) -> None:
    doc = {"levels": POLICY_LEVELS, "metrics_window": f"{window_s:g}s", "cool_down": f"{cool_down_s:g}s"}
    etcd_put(mesh.etcd.endpoint, mesh.keys.breaker_config(), doc)


def holder(mesh: Mesh, *models: str):  # type: ignore[no-untyped-def]
    """A live worker that holds every one of ``models``, or by default one that holds both loaded models
    (with two copies each on three workers one usually does) or else ``demo-stateful``, so the fault hits
    requests in flight on it. Never the worker behind a proxy by default: the partition drill needs it."""
    if models:
        found = [w for w in mesh.live_workers() if {(m, "1") for m in models} <= mesh.held(w)]
        return next((w for w in found if w.worker_id not in mesh.proxies), found[0])
    plain = [w for w in mesh.live_workers() if w.worker_id not in mesh.proxies]
    held = {w.worker_id: mesh.held(w) for w in plain}
    both = [w for w in plain if {(m, "1") for m in WANTED} <= held[w.worker_id]]
    return both[0] if both else next(w for w in plain if ("demo-stateful", "1") in held[w.worker_id])


def _retries(mesh: Mesh, seen: dict[str, float]) -> float:
    for router in mesh.routers:
        if router.proc is not None and router.proc.poll() is None:
            seen[router.router_id] = mesh.metric(router, "mcp_router_retries_total")
    return sum(seen.values())


def run(
    mesh: Mesh, repo: Path, scenario: Scenario, load: LoadFactory, *, hold_s: float = 2.0,
    soak_s: float = 0.0, timing: bool = False, recover_s: float = 60.0,
) -> dict[str, Any]:  # fmt: skip
    """One scenario under checked load; its row. ``soak_s``: the load runs at least that long in all."""
    wait_for(lambda: mesh.consistent(WANTED), 30, 0.1, "the mesh at its replica counts before the fault")
    d = Drill(mesh, repo, load, hold_s, timing)
    counted, retried, duplicated = mesh.may_have_started_total(), {}, len(mesh.duplicates("demo-stateful"))
    retries_before = _retries(mesh, retried)
    started = time.monotonic()
    with load("demo-mlp") as mlp, load("demo-stateful") as stateful:
        mlp.wait_ok(50)
        stateful.wait_ok(50)
        d.background = (mlp, stateful)
        scenario.fault(d)
        d.ended = d.ended or time.monotonic()
        wait_for(lambda: mesh.consistent(WANTED) and d.recovered(), recover_s, 0.1, "the mesh recovered")
        mlp.wait_ok(20)
        stateful.wait_ok(20)
        recovery_s = time.monotonic() - d.ended
        settle(max(0.0, soak_s - (time.monotonic() - started)))  # the soak's length, not a synchronisation
        mlp.wait_ok(20)
        stateful.wait_ok(20)
    a, b = mlp.result, stateful.result
    lost = [f for f in a.failures + b.failures if MAY_HAVE_STARTED_OR_LOST(f, d)]
    assert a.wrong == [] and b.wrong == [], (a.wrong[:5], b.wrong[:5])  # nothing swapped, ever
    if d.lost_in_flight and isinstance(mlp, SdkLoad):
        # the SDK sends an idempotent call a killed router held to the other router; any other fails
        # "may have started" (raised by the SDK: the router that could have counted it is gone)
        assert a.failures == [], a.failures[:5]
        assert b.not_may_have_started() == [], b.failures[:5]
    elif d.lost_in_flight:  # plain gRPC clients: a killed router's calls fail, one per client at most
        assert len(lost) == len(a.failures + b.failures) <= d.lost_in_flight, (a.failures + b.failures)[:5]
    else:
        assert a.failures == [], a.failures[:5]  # idempotent: nothing fails
        assert b.not_may_have_started() == [], b.failures[:5]
        assert mesh.may_have_started_total() - counted == len(b.failures), b.failures[:5]  # each counted
    if scenario.stateful == "none":
        assert b.failures == [], b.failures[:5]
    elif scenario.stateful == "some":
        assert b.failures, "the fault caught no demo-stateful request in flight"
    dup = len(mesh.duplicates("demo-stateful")) - duplicated
    assert dup == 0, mesh.duplicates("demo-stateful")[:5]  # at most once, across every worker
    sent = a.sent + b.sent
    return {
        "name": scenario.name, "sent": sent + d.figures.pop("extra_sent", 0),
        "succeeded": a.ok + b.ok + d.figures.pop("extra_ok", 0), "failed": len(a.failures) + len(b.failures),
        "may_have_started": sum(MAY_HAVE_STARTED in f for f in b.failures), "injected": d.injected,
        "retried": int(_retries(mesh, retried) - retries_before) + a.resent + b.resent + d.retried,
        "duplicated": dup, "recovery_s": round(recovery_s, 2), **d.figures,
    }  # fmt: skip


MAY_HAVE_STARTED = "may have started"


def MAY_HAVE_STARTED_OR_LOST(failure: str, d: Drill) -> bool:
    """A failure a fault may cause: "may have started", or (a router killed) UNAVAILABLE on its calls."""
    return MAY_HAVE_STARTED in failure or (d.lost_in_flight > 0 and failure.startswith("UNAVAILABLE"))


def _extra(d: Drill, result: LoadResult) -> None:
    """A scenario's own load: its requests join the row; wrong answers and real failures are checked by
    the scenario."""
    d.figures["extra_sent"] = d.figures.get("extra_sent", 0) + result.sent
    d.figures["extra_ok"] = d.figures.get("extra_ok", 0) + result.ok
    d.injected += result.injected
    d.retried += result.resent


# --- the faults -----------------------------------------------------------------------------------------


def kill_worker(d: Drill) -> None:
    holder(d.mesh).kill()
    d.mesh.add_worker()


def sigstop_worker(d: Drill) -> None:
    frozen = holder(d.mesh)
    d.figures["frozen_held_idempotent"] = int(("demo-mlp", "1") in d.mesh.held(frozen))
    os.kill(frozen.proc.pid, signal.SIGSTOP)
    settle(3.0)  # the fault: frozen past its 2 s lease
    os.kill(frozen.proc.pid, signal.SIGCONT)


def sigterm_worker(d: Drill) -> None:
    d.mesh.add_worker()
    holder(d.mesh).stop()  # SIGTERM: draining, then gone


def sigterm_router(d: Drill) -> None:
    router = d.mesh.routers[0]
    router.stop()  # SIGTERM: NOT_SERVING, in-flight calls finish, then it exits
    d.mesh.restart(router)


def kill_router(d: Drill) -> None:
    """kill -9 a router (a supervisor starts it again on its port). A plain gRPC channel fails the calls
    in flight on it (UNAVAILABLE, at most one per closed-loop client: it cannot know whether a model is
    idempotent); the SDK sends the idempotent ones to the other router and fails the others "may have
    started"."""
    router = d.mesh.routers[0]
    d.lost_in_flight = 64  # bounded below by the clients in flight (checked in ``run``)
    router.kill()
    d.ended = time.monotonic()
    d.mesh.restart(router)
    port = router.endpoints["grpc"]
    d.recovered = lambda: any(r.endpoints["grpc"] == port and r.proc.poll() is None for r in d.mesh.routers)


def etcd_frozen(seconds: float) -> Callable[[Drill], None]:
    def fault(d: Drill) -> None:
        os.kill(d.mesh.etcd.proc.pid, signal.SIGSTOP)
        settle(seconds)  # the fault: every lease lapses meanwhile
        os.kill(d.mesh.etcd.proc.pid, signal.SIGCONT)

    return fault


def etcd_killed(seconds: float) -> Callable[[Drill], None]:
    def fault(d: Drill) -> None:
        d.mesh.etcd.kill()
        settle(seconds)  # the fault: etcd gone
        d.mesh.etcd.start()

    return fault


def kill_leader_scheduler(d: Drill) -> None:
    """kill -9 the leader scheduler while a LoadModel (demo-onnx, two copies) is in progress: the caller
    asks the other scheduler again (LoadModel is idempotent); the new leader finishes the load."""
    mesh = d.mesh
    leader = wait_for(lambda: mesh.leader("scheduler"), 20, 0.1, "a scheduler leader")
    outcome: list[str] = []

    def call() -> None:
        spec = model_pb2.ModelSpec(model="demo-onnx", versions=["1"], replicas=2)
        try:
            control_pb2_grpc.ModelControlStub(leader.channel()).LoadModel(
                control_pb2.LoadModelRequest(spec=spec), timeout=60
            )
            outcome.append("OK")
        except grpc.RpcError as err:
            outcome.append(err.code().name)

    caller = threading.Thread(target=call)
    caller.start()
    spec_key = mesh.keys.model_spec("demo-onnx")
    wait_for(lambda: etcd_get(mesh.etcd.endpoint, spec_key) is not None, 20, 0.005, "the spec written")
    running_at_kill = _copies(mesh, "demo-onnx")
    leader.kill()
    d.ended = time.monotonic()
    caller.join(70)
    mesh.load("demo-onnx", 2)  # the caller's retry, on the scheduler left
    d.figures["copies_running_at_kill"] = running_at_kill
    d.figures["load_call_interrupted"] = int(outcome != ["OK"])
    led = lambda: mesh.leader("scheduler") is not None  # noqa: E731
    wait_for(lambda: led() and _copies(mesh, "demo-onnx") == 2, 60, 0.1, "a new leader, demo-onnx on two")
    d.figures["load_done_s"] = round(time.monotonic() - d.ended, 2)
    mesh.restart(leader)
    mesh.control.UnloadModel(control_pb2.UnloadModelRequest(model="demo-onnx"), timeout=60)
    d.recovered = led


def kill_leader_health(d: Drill) -> None:
    """kill -9 the leader health service, then kill -9 a worker: the other health service must take
    the lead and mark the dead worker's replicas, so that the scheduler recovers them."""
    mesh = d.mesh
    leader = wait_for(lambda: mesh.leader("health"), 20, 0.1, "a health leader")
    leader.kill()
    wait_for(lambda: mesh.leader("health") is not None, 30, 0.1, "a new health leader")
    holder(mesh).kill()
    d.ended = time.monotonic()
    mesh.add_worker()
    mesh.restart(leader)


def _copies(mesh: Mesh, model: str) -> int:
    try:
        return sum((model, "1") in mesh.held(w) for w in mesh.live_workers())
    except grpc.RpcError:
        return 0


def partition_worker(d: Drill) -> None:
    """Cut the routers' link to a worker (its TCP proxy drops every byte, as a partition does) for
    ``hold_s`` + 3 s; etcd, the scheduler and the health service still reach it. Heal; the routers send
    it requests again."""
    mesh = d.mesh
    worker = _partitionable_holder(mesh)
    mesh.partition(worker, cut=True)
    settle(1.5)  # the fault: past the routers' 1.2 s link timeout
    cut = _served(worker)
    settle(d.hold_s + 1.5)  # the fault's length
    served = _served(worker)
    assert served == cut, (cut, served)  # really cut off: no request reached it meanwhile
    mesh.partition(worker, cut=False)
    d.recovered = lambda: _served(worker) > served  # it answers requests again
    d.figures["partitioned_held"] = len(mesh.held(worker) & {(m, "1") for m in WANTED})


def _partitionable_holder(mesh: Mesh) -> Any:
    """A live worker behind a proxy that holds replicas; when none does any more (earlier faults moved
    them), a fresh one behind a proxy takes over what a drained holder of both models held."""
    loaded = {(m, "1") for m in WANTED}  # under load during the drill (demo-flaky is not)
    found = [w for w in mesh.live_workers() if w.worker_id in mesh.proxies and mesh.held(w) & loaded]
    if found:
        return found[0]
    fresh = mesh.add_worker(partitionable=True)
    holder(mesh).stop()  # SIGTERM: its replicas go elsewhere, the empty fresh worker first
    wait_for(lambda: mesh.consistent(WANTED) and mesh.held(fresh) & loaded, 60, 0.1, "replicas on it")
    return fresh


def _served(worker: Any) -> float:
    return metric(worker.metrics_text(), "mcp_requests_total")


def _ratio(d: Drill, ratio: float) -> None:
    (d.repo / FLAKY / "1" / FAULT_RATIO_FILE).write_text(f"{ratio}\n")


def _workers_unharmed(mesh: Mesh, before: set[str]) -> None:
    """No healthy worker ejected: the same workers live, registered, and none stopped."""
    assert {w.worker_id for w in mesh.live_workers()} == before
    for worker_id in before:
        assert etcd_get(mesh.etcd.endpoint, mesh.keys.worker(worker_id)) is not None, worker_id
        report = etcd_get(mesh.etcd.endpoint, mesh.keys.worker_load(worker_id)) or {}
        assert not report.get("stopped"), (worker_id, report.get("stopped"))


class _LevelTrace:
    """The breaker levels a model went through, with when (seconds from the start): "0@0 1@1.2 ..."."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh, self.began, self.steps = mesh, time.monotonic(), [(0, 0.0)]

    def __call__(self) -> int:
        level = self.mesh.breaker_level(FLAKY)
        if level != self.steps[-1][0]:
            self.steps.append((level, round(time.monotonic() - self.began, 1)))
        return level

    def __str__(self) -> str:
        return " ".join(f"{level}@{t:g}" for level, t in self.steps)


def flaky(ratio: float, level: int) -> Callable[[Drill], None]:
    """demo-flaky/1 (two copies, fallback version 2) fails ``ratio`` of its batches: its breaker rises to
    ``level`` through the routers' real statistics and the health service (50%: level 1 and no further;
    95%: level 3, where version 2 answers), no worker is ejected, the other models are unaffected; the
    backend heals and the levels walk down to 0, one cool-down per step."""

    def fault(d: Drill) -> None:
        mesh = d.mesh
        before = {w.worker_id for w in mesh.live_workers()}
        with d.load(FLAKY, any_version=True) as load:
            load.wait_ok(20)
            _ratio(d, ratio)
            began = time.monotonic()
            trace = _LevelTrace(mesh)
            wait_for(lambda: trace() >= level, 60, 0.1, f"{FLAKY} at level {level} ({trace})")
            d.figures["level_up_s"] = round(time.monotonic() - began, 2)
            highest = mesh.breaker_level(FLAKY)
            if level == 3:
                served = load.fallback_answers()
                wait_for(lambda: load.fallback_answers() > served, 30, 0.1, "answers from the fallback")
            deadline = time.monotonic() + d.hold_s
            while time.monotonic() < deadline:  # the plateau: the level holds (50%: never above 1)
                highest = max(highest, trace())
                time.sleep(0.1)
            d.figures["highest_level"] = highest
            assert highest == level if level < 3 else highest == 3, highest
            _workers_unharmed(mesh, before)
            _ratio(d, 0.0)
            d.ended = time.monotonic()
            wait_for(lambda: trace() == 0, 120, 0.1, f"{FLAKY} back at level 0 ({trace})")
            d.figures["levels"] = str(trace)
            load.wait_ok(20)
        result = load.result
        _extra(d, result)
        assert result.wrong == [] and result.failures == [], (result.wrong[:5], result.failures[:5])
        assert result.injected > 0
        if level == 3:
            assert result.versions["2"] > 0  # the fallback served
        _workers_unharmed(mesh, before)

    return fault


SLOW_ROUNDS = 4  # alone / beside windows of slow_beside_fast, interleaved


def slow_beside_fast(d: Drill) -> None:
    """demo-slow (50 ms a batch, 10x demo-mlp's latency and more) saturated beside demo-mlp: the fast
    model keeps answering, its p99 within 2x of its baseline (checked in make chaos; reported always).

    The baseline is measured in the same run, interleaved: the slow model's client processes are paused
    (they send nothing new) and resumed for ``SLOW_ROUNDS`` pairs of windows while the fast clients run
    throughout, and each p99 pools the answers sent and received inside its windows. A noisy machine then
    slows both sides alike; what differs is only the slow model's traffic. The drill's background load is
    paused meanwhile: on two cores it alone saturates the CPU, and the p99 would measure that."""
    mesh = d.mesh
    mesh.load("demo-slow", 1)
    windows: dict[str, list[tuple[float, float]]] = {"alone": [], "beside": []}
    slow_served = []
    with d.load("demo-mlp", clients=2) as fast, d.load("demo-slow", clients=8) as slow:
        slow.wait_ok(20)
        fast.wait_ok(50)
        for load in d.background:
            load.pause()
        for _ in range(SLOW_ROUNDS):
            for name in ("alone", "beside"):
                (slow.pause if name == "alone" else slow.resume)()
                began = time.time()
                settle(d.hold_s / SLOW_ROUNDS)  # the window's length: together, baseline and fault
                # the window's first quarter is left out: the slow clients stop or resume in it
                windows[name].append((began + d.hold_s / SLOW_ROUNDS / 4, time.time()))
            slow_served.append(slow.ok())
        for load in d.background:
            load.resume()
    for r in (slow.result, fast.result):
        _extra(d, r)
        assert r.failures == [] and r.wrong == [], (r.failures[:5], r.wrong[:5])
    assert all(b > a for a, b in itertools.pairwise([0, *slow_served])), slow_served  # it ran each round
    alone = _p99_within(fast.result.ok_samples, windows["alone"])
    beside = _p99_within(fast.result.ok_samples, windows["beside"])
    d.figures["fast_p99_ms_alone"] = round(alone, 2)
    d.figures["fast_p99_ms_beside_slow"] = round(beside, 2)
    d.figures["slow_p99_ms"] = round(_p99_within(slow.result.ok_samples, windows["beside"]), 2)
    if d.timing:
        assert beside <= 2 * alone, d.figures


def _p99_within(samples: list[tuple[float, float]], windows: list[tuple[float, float]]) -> float:
    """The p99 (ms) of the answers sent and received inside one of ``windows`` (wall-time bounds)."""
    inside = [ms for t, ms in samples if any(lo <= t and t + ms / 1e3 <= hi for lo, hi in windows)]
    assert len(inside) >= 20, f"{len(inside)} answers inside the windows {windows}"
    return float(np.percentile(inside, 99))


def overload(d: Drill) -> None:
    """10x what demo-slow sustains (one copy: 8 rows per 50 ms; 80 closed-loop clients): what the routers
    can queue (16 per copy each, max_ongoing_requests) is served, the rest refused at once ("exceeds
    maximum queue size"), nothing times out, memory stays flat; the other models are unaffected."""
    mesh = d.mesh
    mesh.load("demo-slow", 1)
    procs = [*[r for r in mesh.routers if r.proc.poll() is None], *mesh.live_workers()]
    rss = {p.name: mesh.rss_mib(p) for p in procs}
    with d.load("demo-slow", clients=80) as over:
        over.wait_ok(20)
        settle(d.hold_s + 2.0)  # the overload's length
    r = over.result
    _extra(d, r)
    assert r.wrong == [] and r.ok > 0, r.wrong[:5]
    refused = [f for f in r.failures if "exceeds maximum queue size" in f]
    assert refused and refused == r.failures, [f for f in r.failures if f not in refused][:5]
    grown = {p.name: round(mesh.rss_mib(p) - rss[p.name], 1) for p in procs if p.proc.poll() is None}
    assert max(grown.values()) < RSS_GROWTH_MIB, grown
    d.figures["refused"] = len(refused)
    d.figures["refused_p99_ms"] = round(r.refused_p99_ms, 2)
    d.figures["rss_growth_mib_max"] = max(grown.values())
    if d.timing:
        assert r.refused_p99_ms < 1000, d.figures  # refusals at once, far below the 20 s client timeout
    mesh.control.UnloadModel(control_pb2.UnloadModelRequest(model="demo-slow"), timeout=60)


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("kill_9_worker", kill_worker),
        Scenario("sigstop_worker_past_ttl", sigstop_worker, stateful="some"),
        Scenario("sigterm_worker_drain", sigterm_worker, stateful="none"),
        Scenario("sigterm_router", sigterm_router, stateful="none"),
        Scenario("kill_9_router", kill_router),
        Scenario("kill_9_leader_scheduler_mid_load", kill_leader_scheduler, stateful="none"),
        Scenario("kill_9_leader_health", kill_leader_health),
        Scenario("etcd_frozen_10s", etcd_frozen(10.0), stateful="none"),
        Scenario("etcd_killed_10s", etcd_killed(10.0), stateful="none"),
        Scenario("partition_worker", partition_worker),
        Scenario("backend_fails_50pct", flaky(0.5, 1), stateful="none"),
        Scenario("backend_fails_95pct", flaky(0.95, 3), stateful="none"),
        Scenario("slow_beside_fast", slow_beside_fast, stateful="none"),
        Scenario("overload_10x", overload, stateful="none"),
    )
}


def long_etcd_outage(seconds: float) -> Scenario:
    return Scenario(f"etcd_killed_{seconds:g}s", etcd_killed(seconds), stateful="none")


__all__ = ["INJECTED", "SCENARIOS", "WANTED", "Drill", "Scenario", "breaker_policy", "holder", "run"]
