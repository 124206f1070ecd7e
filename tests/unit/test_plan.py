"""The reconcile planner, round by round: loads, starts, safe flips, failures, drains, scale and demand."""

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_scheduler.actions import (
    ForgetReplica,
    LoadReplica,
    ModelStatus,
    PauseReplica,
    PublishRouting,
    StartReplica,
)
from mcp_scheduler.placement import replica_bytes
from mcp_scheduler.plan import plan
from mcp_scheduler.view import ClusterView, Demand, ModelSpecDoc, ReplicaInfo, TrafficDoc, WorkerInfo
from mcpcore.lifecycle import ReplicaState

S = ReplicaState
GiB = 1 << 30
NOW = 1000.0


def worker(wid, gib=8, **kw):
    return WorkerInfo(id=wid, grpc=f"{wid}:1", zmq=f"tcp://{wid}:2", capacity_bytes=gib * GiB, **kw)


def rep(version, wid, state=S.RUNNING, *, model="m", since=0.0, revision=7):
    return ReplicaInfo(model, version, wid, state, since, revision=revision)


def spec(versions=("1",), model="m", **kw):
    kw.setdefault("memory_bytes", GiB)
    return ModelSpecDoc(model=model, versions=tuple(versions), **kw)


def cluster(workers, replicas=(), specs=None, *, traffic=None, routing=None, demand=None):
    return ClusterView(
        now=NOW,
        workers={w.id: w for w in workers},
        specs={s.model: s for s in (specs if specs is not None else [spec()])},
        traffic=traffic or {},
        routing=routing or {},
        replicas={r.key: r for r in replicas},
        demand=demand or {},
    )


def brief(p):
    """Actions without their reasons, for comparison."""
    out = []
    for a in p.actions:
        if isinstance(a, PublishRouting):
            out.append(("route", a.model, a.routing))
        else:
            out.append((type(a).__name__.removesuffix("Replica").lower(), a.model, a.version, a.worker))
    return out


W2 = [worker("w1"), worker("w2")]


# --- a model's first life --------------------------------------------------------------------------------


def test_first_load_of_two_replicas_on_two_workers():
    p = plan(cluster(W2, specs=[spec(replicas=2)]))
    assert brief(p) == [("load", "m", "1", "w1"), ("load", "m", "1", "w2")]
    assert p.actions[0] == LoadReplica("m", "1", "w1", "0/2 copies of m/1")
    assert p.status["m"] == ModelStatus("m", {"1": (0, 2)}, pending="loading version 1 on 0/2 replicas")


def test_ready_replicas_are_started():
    p = plan(cluster(W2, [rep("1", "w1", S.READY), rep("1", "w2", S.LOADING)], [spec(replicas=2)]))
    assert brief(p) == [("start", "m", "1", "w1")]


def test_all_running_publishes_routing_then_nothing():
    view = cluster(W2, [rep("1", "w1"), rep("1", "w2")], [spec(replicas=2)])
    p = plan(view)
    assert brief(p) == [("route", "m", TrafficDoc("1"))]
    assert p.status["m"] == ModelStatus("m", {"1": (2, 2)})
    steady = replace(view, routing={"m": TrafficDoc("1")})
    assert plan(steady).actions == ()


def test_default_traffic_is_the_highest_version():
    view = cluster(W2, [rep(v, "w1") for v in ("2", "10")], [spec(("2", "10"))])
    assert brief(plan(view))[-1] == ("route", "m", TrafficDoc("10"))


# --- safe version flips -------------------------------------------------------------------------------------


def test_flip_to_version_2_waits_for_its_replicas():
    specs = [spec(("2",), replicas=2)]
    traffic, routing = {"m": TrafficDoc("2")}, {"m": TrafficDoc("1")}
    v1 = [rep("1", "w1"), rep("1", "w2")]
    p = plan(cluster(W2, v1, specs, traffic=traffic, routing=routing))
    assert brief(p) == [("load", "m", "2", "w1"), ("load", "m", "2", "w2")]  # version 1 stays routed
    assert p.status["m"].pending == "pending: version 2 loading on 0/2 replicas"
    assert p.status["m"].versions == {"1": (2, 2), "2": (0, 2)}

    half = [*v1, rep("2", "w1"), rep("2", "w2", S.LOADING)]
    p = plan(cluster(W2, half, specs, traffic=traffic, routing=routing))
    assert brief(p) == []
    assert p.status["m"].pending == "pending: version 2 loading on 1/2 replicas"

    full = [*v1, rep("2", "w1"), rep("2", "w2")]
    p = plan(cluster(W2, full, specs, traffic=traffic, routing=routing))
    assert brief(p) == [("route", "m", TrafficDoc("2"))]  # version 1 is unloaded only once 2 is in force

    p = plan(cluster(W2, full, specs, traffic=traffic, routing={"m": TrafficDoc("2")}))
    assert brief(p) == [("unload", "m", "1", "w1"), ("unload", "m", "1", "w2")]
    assert p.actions[0].reason == "version 1 of m is no longer needed"


def test_canary_needs_both_versions_running():
    specs = [spec(("1", "2"))]
    traffic = {"m": TrafficDoc("1", "2", 10)}
    p = plan(cluster(W2, [rep("1", "w1"), rep("2", "w2", S.READY)], specs, traffic=traffic))
    assert brief(p) == [("start", "m", "2", "w2")]
    assert p.status["m"].pending == "loading version 2 on 0/1 replicas"
    p = plan(cluster(W2, [rep("1", "w1"), rep("2", "w2")], specs, traffic=traffic))
    assert brief(p) == [("route", "m", TrafficDoc("1", "2", 10))]


def test_degraded_routing_stays_and_says_so():
    p = plan(cluster([worker("w1")], [], [spec()], routing={"m": TrafficDoc("1")}))
    assert brief(p) == [("load", "m", "1", "w1")]
    assert p.status["m"].pending == "degraded: version 1 RUNNING on 0/1 replicas"


# --- failures --------------------------------------------------------------------------------------------


def test_dead_worker_replica_is_forgotten_and_replaced():
    view = cluster(W2, [rep("1", "w9", revision=42)], [spec()])
    p = plan(view)
    assert brief(p) == [("load", "m", "1", "w1"), ("forget", "m", "1", "w9")]
    assert p.actions[1] == ForgetReplica("m", "1", "w9", 42, "worker w9 is gone")


def test_error_replica_is_forgotten_and_placed_elsewhere():
    bad = ReplicaInfo("m", "1", "w1", S.ERROR, 5.0, reason="load failed: OOM", revision=3)
    p = plan(cluster(W2, [bad], [spec()]))
    assert brief(p) == [("forget", "m", "1", "w1"), ("load", "m", "1", "w2")]
    assert p.actions[0].reason == "failed: load failed: OOM"


def test_backoff_keeps_a_failed_key_off_its_worker_until_it_expires():
    view = cluster(W2, [], [spec()])  # the ERROR record of m/1@w1 was forgotten last round
    assert brief(plan(view, backoff={("m", "1", "w1"): NOW + 10})) == [("load", "m", "1", "w2")]
    assert brief(plan(view, backoff={("m", "1", "w1"): NOW - 1})) == [("load", "m", "1", "w1")]


def test_idle_records_are_forgotten_unless_a_load_is_under_way():
    routing = {"m": TrafficDoc(stable="1")}
    view = cluster(W2, [rep("1", "w1", S.IDLE), rep("1", "w2")], [spec()], routing=routing)
    assert brief(plan(view)) == [("forget", "m", "1", "w1")]
    assert brief(plan(view, in_flight={("m", "1", "w1"): "load"})) == []
    assert brief(plan(cluster(W2, [rep("1", "w1", S.IDLE)], specs=[]))) == [("forget", "m", "1", "w1")]


def test_an_idle_record_being_forgotten_is_a_wait_not_a_failure():
    # LoadModel at once after an unload by hand: the only worker's idle record is still being forgotten;
    # the status must say pending (LoadModel waits), not RESOURCE_EXHAUSTED
    view = cluster([worker("w1")], [rep("1", "w1", S.IDLE)], [spec()])
    p = plan(view, in_flight={("m", "1", "w1"): "forget"})
    assert brief(p) == []
    status = p.status["m"]
    assert not status.error and "waits for its old record on w1 to be cleared" in status.pending


def test_an_idle_record_on_a_draining_worker_is_a_shortfall_not_a_wait():
    view = cluster([worker("w1", draining=True)], [rep("1", "w1", S.IDLE)], [spec()])
    p = plan(view, in_flight={("m", "1", "w1"): "forget"})
    assert p.status["m"].error_code == "RESOURCE_EXHAUSTED"


def test_an_idle_record_is_no_obstacle_a_load_goes_there_again():
    # unloaded (by hand or by the scheduler) and asked for again at once: the only worker must not
    # count as "already holds a copy"; the load takes the record instead of a forget
    view = cluster([worker("w1")], [rep("1", "w1", S.IDLE)], [spec()])
    p = plan(view)
    assert brief(p) == [("load", "m", "1", "w1")]
    assert not p.status["m"].error


def test_in_flight_loads_count_and_are_never_repeated():
    view = cluster(W2, [], [spec(replicas=2)])
    p = plan(view, in_flight={("m", "1", "w1"): "load"})
    assert brief(p) == [("load", "m", "1", "w2")]


def test_shortfall_is_a_resource_exhausted_status():
    p = plan(cluster([worker("w1", 1)], [], [spec(memory_bytes=2 * GiB)]))
    assert p.actions == ()
    assert p.status["m"].error_code == "RESOURCE_EXHAUSTED"
    assert p.status["m"].error.startswith("cannot place m/1 (1 more copy): needs 2.0 GiB")


def test_eviction_makes_room_for_a_higher_priority_model():
    low = spec(model="low", priority=0, memory_bytes=4 * GiB)
    big = spec(model="big", priority=5, memory_bytes=4 * GiB)
    view = cluster([worker("w1", 4)], [rep("1", "w1", model="low")], [low, big])
    p = plan(view)
    assert brief(p) == [("unload", "low", "1", "w1")]  # and low is not routed to a copy on its way out
    assert p.actions[0].reason == "evicted to make room for big/1 (priority 5)"
    assert p.status["big"].error == ""  # room is on its way
    assert p.status["low"].error_code == "RESOURCE_EXHAUSTED"


def test_room_freed_by_an_eviction_is_kept_for_the_model_it_is_for():
    low = spec(("1", "2"), model="low", priority=0)
    big = spec(model="big", priority=1, memory_bytes=2 * GiB)
    p = plan(cluster([worker("w1", 2)], [rep("1", "w1", S.READY, model="low")], [low, big]))
    assert brief(p) == [("unload", "low", "1", "w1")]  # not a load of low/2 into the freed room
    assert p.status["low"].error_code == "RESOURCE_EXHAUSTED"


# --- scale, orphans, pause -------------------------------------------------------------------------------


def test_excess_after_scale_down_unloads_the_newest():
    view = cluster(W2, [rep("1", "w1", since=1), rep("1", "w2", since=5)], [spec(replicas=1)])
    p = plan(view)
    assert brief(p) == [("unload", "m", "1", "w2"), ("route", "m", TrafficDoc("1"))]
    assert p.actions[0].reason == "excess copy: 2 settled copies of m/1, 1 required"


def test_excess_prefers_not_running_copies_and_keeps_required_running():
    replicas = [rep("1", "w1", since=9), rep("1", "w2", S.READY, since=1), rep("1", "w3", S.LOADING)]
    p = plan(cluster([*W2, worker("w3")], replicas, [spec(replicas=1)]))
    assert brief(p)[:1] == [("unload", "m", "1", "w2")]  # the LOADING one is left to finish
    assert ("unload", "m", "1", "w1") not in brief(p)


def test_models_without_a_spec_are_unloaded_and_unrouted():
    replicas = [rep("1", "w1", model="ghost"), rep("1", "w2", S.LOADING, model="ghost")]
    p = plan(cluster(W2, replicas, [], routing={"ghost": TrafficDoc("1")}))
    assert brief(p) == [("unload", "ghost", "1", "w1"), ("route", "ghost", None)]
    assert p.status == {}


def test_pause_and_resume_versions():
    paused = [spec(("1", "2"), paused_versions=("1",))]
    replicas = [rep("1", "w1"), rep("2", "w1", S.PAUSED), rep("1", "w2", S.READY)]
    p = plan(cluster(W2, replicas, paused, routing={"m": TrafficDoc("2")}))
    # a READY copy of a paused version is not started (it would take traffic); here it is excess anyway
    assert brief(p) == [("pause", "m", "1", "w1"), ("unload", "m", "1", "w2"), ("start", "m", "2", "w1")]
    assert PauseReplica("m", "1", "w1") in p.actions and StartReplica("m", "2", "w1") in p.actions
    p = plan(cluster(W2, [rep("1", "w2", S.READY)], paused, routing={"m": TrafficDoc("2")}))
    assert ("start", "m", "1", "w2") not in brief(p)


def test_paused_copies_count_as_settled_for_excess():
    paused = [spec(paused_versions=("1",))]
    p = plan(cluster(W2, [rep("1", "w1", S.PAUSED, since=1), rep("1", "w2", S.PAUSED, since=2)], paused))
    assert brief(p) == [("unload", "m", "1", "w2")]
    assert p.status["m"].pending == "loading version 1 on 0/1 replicas (paused)"


# --- demand and hot models -------------------------------------------------------------------------------


def test_load_on_demand_waits_for_a_request():
    lod = [spec(("1", "2"), replicas=0, load_on_demand=True)]
    p = plan(cluster(W2, [], lod))
    assert p.actions == ()
    assert p.status["m"].pending == "not loaded: loads on demand, when a request asks for it"
    asked = {"m": (Demand("m", "r1", requests=0), Demand("m", "r2", requests=3))}
    assert brief(plan(cluster(W2, [], lod, demand=asked))) == [("load", "m", "2", "w1")]


def test_load_on_demand_keeps_its_copy_once_asked_for():
    lod = [spec(replicas=0, load_on_demand=True)]
    p = plan(cluster(W2, [rep("1", "w1")], lod))  # the router stopped asking: it found a copy
    assert brief(p) == [("route", "m", TrafficDoc("1"))]


def test_a_quiet_model_shrinks_to_min_replicas_and_no_further():
    workers = [worker(f"w{i}") for i in range(1, 4)]
    running = [rep("1", f"w{i}", since=float(i)) for i in range(1, 4)]
    view = cluster(workers, running, [spec(replicas=3, min_replicas=1)], routing={"m": TrafficDoc("1")})
    assert [a for a in brief(plan(view, extra_copies={"m": -1})) if a[0] == "unload"] == [
        ("unload", "m", "1", "w3")
    ]
    assert [a for a in brief(plan(view, extra_copies={"m": -5})) if a[0] == "unload"] == [
        ("unload", "m", "1", "w2"),
        ("unload", "m", "1", "w3"),
    ]  # min_replicas 1: the oldest copy stays
    no_min = cluster(workers, running, [spec(replicas=3)], routing={"m": TrafficDoc("1")})
    assert [a for a in brief(plan(no_min, extra_copies={"m": -2})) if a[0] == "unload"] == []  # 0: replicas


def test_extra_copies_for_hot_models_are_capped_by_max_replicas():
    workers = [worker(f"w{i}") for i in range(1, 6)]
    p = plan(cluster(workers, [], [spec(replicas=1, max_replicas=3)]), extra_copies={"m": 5})
    assert [a[3] for a in brief(p)] == ["w1", "w2", "w3"]
    p = plan(cluster(workers, [], [spec(replicas=1)]), extra_copies={"m": 5})  # max_replicas 0: no extras
    assert len(p.actions) == 1


def test_fallback_version_is_kept_loaded():
    p = plan(cluster(W2, [], [spec(("2",), fallback_version="1")]))
    assert brief(p) == [("load", "m", "1", "w1"), ("load", "m", "2", "w2")]


# --- drains ----------------------------------------------------------------------------------------------


def test_drain_places_the_replacement_first_and_unloads_after_it_runs():
    workers = [worker("w1", draining=True), worker("w2")]
    routing = {"m": TrafficDoc("1")}
    p = plan(cluster(workers, [rep("1", "w1")], [spec()], routing=routing))
    assert brief(p) == [("load", "m", "1", "w2")]
    p = plan(cluster(workers, [rep("1", "w1"), rep("1", "w2", S.READY)], [spec()], routing=routing))
    assert brief(p) == [("start", "m", "1", "w2")]
    p = plan(cluster(workers, [rep("1", "w1"), rep("1", "w2")], [spec()], routing=routing))
    assert brief(p) == [("unload", "m", "1", "w1")]
    assert p.actions[0].reason.startswith("worker w1 is draining")


def test_stopped_workers_get_no_actions_but_forgets():
    workers = [worker("w1", stopped=True), worker("w2")]
    replicas = [rep("1", "w1", S.READY), rep("2", "w1", S.ERROR)]
    p = plan(cluster(workers, replicas, [spec(("1", "2"))]))
    assert brief(p) == [("load", "m", "1", "w2"), ("forget", "m", "2", "w1"), ("load", "m", "2", "w2")]


# --- determinism -----------------------------------------------------------------------------------------


def test_same_view_same_plan_whatever_the_order():
    specs = [spec(model=f"m{i}", replicas=2) for i in range(4)]
    workers = [worker(f"w{i}", 4) for i in range(4)]
    replicas = [rep("1", "w0", model="m1"), rep("1", "w3", S.READY, model="m2"), rep("1", "w7", model="m3")]
    one = plan(cluster(workers, replicas, specs))
    two = plan(cluster(workers[::-1], replicas[::-1], specs[::-1]))
    assert one == two
    keys = [(a.model, a.version, a.worker) for a in one.actions if not isinstance(a, PublishRouting)]
    assert keys == sorted(keys)


# --- properties ------------------------------------------------------------------------------------------

MODELS, VERSIONS, WORKERS = ("a", "b", "c"), ("1", "2", "3"), ("w1", "w2", "w3", "w4")


KEYS = st.tuples(
    st.sampled_from((*MODELS, "ghost")), st.sampled_from(VERSIONS), st.sampled_from((*WORKERS, "w9"))
)
SPLITS = st.sampled_from(VERSIONS).map(TrafficDoc) | st.sampled_from(
    [TrafficDoc("1", "2", 10), TrafficDoc("3", "1")]
)
GPU = st.sampled_from([{}, {"gpu": "h200"}])


@st.composite
def model_spec(draw, model):
    versions = draw(st.lists(st.sampled_from(VERSIONS), min_size=1, max_size=3, unique=True))
    replicas = draw(st.integers(0, 3))
    return ModelSpecDoc(
        model=model,
        versions=tuple(versions),
        replicas=replicas,
        load_on_demand=replicas == 0 or draw(st.booleans()),
        max_replicas=draw(st.sampled_from([0, 3, 4])),
        priority=draw(st.integers(0, 2)),
        memory_bytes=draw(st.integers(1, 4)) * GiB,
        labels=draw(GPU),
        fallback_version=draw(st.none() | st.sampled_from(VERSIONS)),
        paused_versions=tuple(draw(st.lists(st.sampled_from(versions), unique=True, max_size=1))),
    )


@st.composite
def views(draw):
    """A small random cluster, and random in-flight loads, backoffs and hot-model copies."""
    flags = st.fixed_dictionaries({"stopped": st.booleans(), "draining": st.booleans(), "labels": GPU})
    workers = [worker(w, draw(st.integers(0, 8)), **draw(flags)) for w in WORKERS if draw(st.booleans())]
    specs = [draw(model_spec(m)) for m in draw(st.lists(st.sampled_from(MODELS), unique=True))]
    replicas = {
        k: ReplicaInfo(*k, draw(st.sampled_from(list(S))), draw(st.floats(0, 100)))
        for k in draw(st.lists(KEYS, max_size=10))
    }
    view = ClusterView(
        now=NOW,
        workers={w.id: w for w in workers},
        specs={s.model: s for s in specs},
        traffic=draw(st.dictionaries(st.sampled_from(MODELS), SPLITS, max_size=2)),
        routing=draw(st.dictionaries(st.sampled_from((*MODELS, "ghost")), SPLITS, max_size=2)),
        replicas=replicas,
        demand={m: (Demand(m, "r1", requests=1),) for m in draw(st.lists(st.sampled_from(MODELS)))},
    )
    in_flight = draw(
        st.dictionaries(KEYS, st.sampled_from(["load", "start", "pause", "unload", "forget"]), max_size=3)
    )
    backoff = draw(st.dictionaries(KEYS, st.floats(NOW - 10, NOW + 10), max_size=3))
    extra = draw(st.dictionaries(st.sampled_from(MODELS), st.integers(0, 3), max_size=2))
    return view, in_flight, backoff, extra


@settings(max_examples=200, deadline=None)
@given(views())
def test_plan_properties(case):
    view, in_flight, backoff, extra = case
    p = plan(view, in_flight=in_flight, backoff=backoff, extra_copies=extra)
    keyed = [(a.model, a.version, a.worker) for a in p.actions if not isinstance(a, PublishRouting)]
    assert not [k for k, n in Counter(keyed).items() if n > 1], "two actions for one replica"
    assert not set(keyed) & set(in_flight), "an action for a replica with one in flight"
    loads: Counter[str] = Counter()
    for a in p.actions:
        if isinstance(a, LoadReplica):
            w = view.workers.get(a.worker)
            assert w is not None and not w.stopped and not w.draining
            assert all(w.labels.get(k) == v for k, v in view.specs[a.model].labels.items())
            held = view.replicas.get((a.model, a.version, a.worker))
            assert held is None or held.state is S.IDLE  # an idle record holds nothing: loaded again
            if backoff.get((a.model, a.version, a.worker), 0) > view.now:
                raise AssertionError(f"load during backoff: {a}")
            loads[a.worker] += view.specs[a.model].memory_bytes
        if isinstance(a, PublishRouting) and a.routing is not None:
            for v in a.routing.versions:
                assert any(
                    r.state is S.RUNNING and r.worker in view.workers and not view.workers[r.worker].stopped
                    for r in view.replicas_of(a.model, v)
                ), f"routing to version {v} of {a.model} with no RUNNING copy"
    for wid, planned in loads.items():
        used = sum(replica_bytes(view, r) for r in view.replicas_on(wid) if r.state is not S.IDLE)
        flying = sum(
            view.specs[m].memory_bytes
            for (m, v, w), kind in in_flight.items()
            if kind == "load" and w == wid and m in view.specs and (m, v, w) not in view.replicas
        )
        assert used + flying + planned <= view.workers[wid].capacity_bytes


def _apply(view, p):
    """A perfect executor: every action succeeds at once (loads land READY)."""
    replicas, routing = dict(view.replicas), dict(view.routing)
    for a in p.actions:
        if isinstance(a, PublishRouting):
            routing.pop(a.model, None)
            routing.update({a.model: a.routing} if a.routing else {})
            continue
        key = (a.model, a.version, a.worker)
        if isinstance(a, LoadReplica):
            replicas[key] = ReplicaInfo(*key, S.READY, view.now)
        elif isinstance(a, (StartReplica, PauseReplica)):
            state = S.RUNNING if isinstance(a, StartReplica) else S.PAUSED
            replicas[key] = ReplicaInfo(*key, state, view.now)
        else:
            del replicas[key]
    return replace(view, replicas=replicas, routing=routing, now=view.now + 1)


@settings(max_examples=150, deadline=None)
@given(views())
def test_plans_reach_a_fixed_point(case):
    view, _, _, extra = case
    for _ in range(30):
        p = plan(view, extra_copies=extra)
        if not p.actions:
            return
        view = _apply(view, p)
    raise AssertionError(f"still acting after 30 rounds: {brief(p)}")


def test_a_record_of_an_earlier_incarnation_is_forgotten_and_not_a_copy():
    """worker-1 restarted under its id: its old process's RUNNING record claims what nobody holds."""
    now = worker("w1", incarnation="new")
    stale = ReplicaInfo("m", "1", "w1", S.RUNNING, 0.0, revision=9, incarnation="old")
    p = plan(cluster([now, worker("w2")], [stale], [spec(replicas=1)]))
    forget = [a for a in p.actions if isinstance(a, ForgetReplica)]
    assert [(a.worker, a.revision) for a in forget] == [("w1", 9)] and "stale" in forget[0].reason
    assert p.status["m"].versions == {"1": (0, 1)}  # not a copy: the next round places one again
    current = ReplicaInfo("m", "1", "w1", S.RUNNING, 0.0, revision=9, incarnation="new")
    assert not [a for a in plan(cluster([now], [current], [spec()])).actions if isinstance(a, ForgetReplica)]


# --- batches: a plan of some models, and a bounded one ----------------------------------------------------
def test_a_plan_of_some_models_touches_only_them():
    view = ClusterView(
        now=NOW,
        workers={"w1": WorkerInfo("w1", "g", "z", 10 * GiB)},
        specs={m: ModelSpecDoc(m, ("1",), memory_bytes=GiB) for m in ("a", "b")},
        replicas={("gone", "1", "w9"): ReplicaInfo("gone", "1", "w9", S.RUNNING, NOW)},
    )
    p = plan(view, models=["a"])
    assert {a.model for a in p.actions} == {"a"} and set(p.status) == {"a"}
    assert {a.model for a in plan(view).actions} == {"a", "b", "gone"}  # all: b placed, gone's forgotten


def test_a_placement_budget_defers_the_rest_of_the_batch_and_nothing_of_it_is_lost():
    view = ClusterView(
        now=NOW,
        workers={"w1": WorkerInfo("w1", "g", "z", 10 * GiB)},
        specs={m: ModelSpecDoc(m, ("1",), memory_bytes=GiB) for m in ("a", "b", "c")},
    )
    p = plan(view, placement_budget=2)
    assert p.deferred == ("c",)  # in priority, then name, order: a and b were placed
    assert {a.model for a in p.actions if isinstance(a, LoadReplica)} == {"a", "b"}
    assert "c" not in p.status  # no status for a model not planned
    assert [a.model for a in plan(view, models=p.deferred, placement_budget=2).actions] == ["c"]
