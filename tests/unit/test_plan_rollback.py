"""Automatic canary rollback (DESIGN.md 7): a wanted canary goes while the model's breaker is above 0."""

from dataclasses import replace

from hypothesis import example, given, settings
from hypothesis import strategies as st

from mcp_scheduler.actions import LoadReplica, PublishRouting, RollbackCanary
from mcp_scheduler.plan import plan
from mcp_scheduler.view import ClusterView, ModelSpecDoc, ReplicaInfo, TrafficDoc, WorkerInfo
from mcpcore.lifecycle import ReplicaState

S = ReplicaState
GiB = 1 << 30
NOW = 1000.0
CANARY = TrafficDoc("1", "2", 10)


def worker(wid):
    return WorkerInfo(id=wid, grpc=f"{wid}:1", zmq=f"tcp://{wid}:2", capacity_bytes=8 * GiB)


def rep(version, wid, state=S.RUNNING, model="m"):
    return ReplicaInfo(model, version, wid, state, 0.0, revision=7)


def view(*, traffic=None, routing=None, breakers=None, replicas=None, models=("m",)):
    if replicas is None:  # both versions RUNNING: version 1 on w1, version 2 on w2
        replicas = [rep(v, w, model=m) for m in models for v, w in (("1", "w1"), ("2", "w2"))]
    return ClusterView(
        now=NOW,
        workers={w: worker(w) for w in ("w1", "w2")},
        specs={m: ModelSpecDoc(model=m, versions=("1",), memory_bytes=GiB) for m in models},
        traffic=traffic or {},
        routing=routing or {},
        replicas={r.key: r for r in replicas},
        breakers=breakers or {},
    )


def rollbacks(p):
    return [a for a in p.actions if isinstance(a, RollbackCanary)]


def test_a_canary_under_a_raised_breaker_is_rolled_back_and_routing_follows_at_once():
    p = plan(view(traffic={"m": CANARY}, routing={"m": CANARY}, breakers={"m": 2}))
    assert rollbacks(p) == [
        RollbackCanary(
            "m",
            TrafficDoc("1"),
            "breaker of m at level 2: canary version 2 (10%) rolled back to stable version 1",
        )
    ]
    # the round already plans with the stable-only traffic: version 1 runs, so routing flips now
    assert PublishRouting("m", TrafficDoc("1")) in p.actions
    assert p.actions[-1] == rollbacks(p)[0]  # a model's rollback comes last


def test_every_level_above_zero_rolls_back():
    for level in (1, 2, 3):
        p = plan(view(traffic={"m": CANARY}, routing={"m": CANARY}, breakers={"m": level}))
        assert [a.traffic for a in rollbacks(p)] == [TrafficDoc("1")]


def test_no_rollback_when_the_breaker_is_closed_or_absent():
    for breakers in ({}, {"m": 0}, {"other": 3}):
        p = plan(view(traffic={"m": CANARY}, routing={"m": CANARY}, breakers=breakers))
        assert not rollbacks(p)
        assert not [a for a in p.actions if isinstance(a, PublishRouting)]  # the canary stays in force


def test_no_rollback_without_a_wanted_canary():
    cases = [
        {},  # no traffic key: the highest spec version, no canary
        {"m": TrafficDoc("1")},
        {"m": TrafficDoc("1", "2", 0)},  # a canary named but given no traffic
    ]
    for traffic in cases:
        p = plan(view(traffic=traffic, routing={"m": TrafficDoc("1")}, breakers={"m": 3}))
        assert not rollbacks(p), traffic


def test_a_canary_in_force_but_no_longer_wanted_is_left_to_the_normal_flip():
    p = plan(view(traffic={"m": TrafficDoc("1")}, routing={"m": CANARY}, breakers={"m": 1}))
    assert not rollbacks(p)
    assert PublishRouting("m", TrafficDoc("1")) in p.actions


def test_stable_not_running_keeps_the_routing_in_force_until_it_is():
    reps = [rep("1", "w1", S.LOADING), rep("2", "w2")]
    p = plan(view(traffic={"m": CANARY}, routing={"m": CANARY}, breakers={"m": 1}, replicas=reps))
    assert [a.traffic for a in rollbacks(p)] == [TrafficDoc("1")]
    assert not [a for a in p.actions if isinstance(a, PublishRouting)]  # safe flip: v1 is not RUNNING
    assert "version 1" in p.status["m"].pending


def test_only_the_model_whose_breaker_rose_is_rolled_back():
    v = view(
        traffic={"a": CANARY, "b": CANARY},
        routing={"a": CANARY, "b": CANARY},
        breakers={"b": 1},
        models=("a", "b"),
    )
    assert [a.model for a in rollbacks(plan(v))] == ["b"]


# --- properties -------------------------------------------------------------------------------------------

SPLITS = st.sampled_from(
    [
        TrafficDoc("1"),
        TrafficDoc("2"),
        TrafficDoc("1", "2", 0),
        TrafficDoc("1", "2", 10),
        TrafficDoc("2", "1", 50),
    ]
)
MODELS = ("a", "b")


@st.composite
def views(draw):
    reps = [
        rep(v, w, draw(st.sampled_from([S.RUNNING, S.READY, S.LOADING])), model=m)
        for m in MODELS
        for v, w in (("1", "w1"), ("2", "w2"))
        if draw(st.booleans())
    ]
    return view(
        traffic=draw(st.dictionaries(st.sampled_from(MODELS), SPLITS)),
        routing=draw(st.dictionaries(st.sampled_from(MODELS), SPLITS)),
        breakers=draw(st.dictionaries(st.sampled_from(MODELS), st.integers(0, 3))),
        replicas=reps,
        models=MODELS,
    )


@settings(max_examples=300, deadline=None)
@given(views())
def test_rollback_exactly_when_a_breaker_is_up_and_a_canary_is_wanted(v):
    p = plan(v)
    assert p == plan(v)  # deterministic
    expected = {
        m: TrafficDoc(t.stable)
        for m, t in v.traffic.items()
        if v.breakers.get(m, 0) > 0 and t.canary is not None and t.canary_percent > 0
    }
    assert {a.model: a.traffic for a in rollbacks(p)} == expected
    for a in p.actions:
        if isinstance(a, PublishRouting) and a.model in expected and a.routing is not None:
            assert a.routing == expected[a.model], a  # a flip goes to the stable-only traffic, or none


def _apply(v, p):
    """A perfect executor: loads land RUNNING, routing and rollbacks are written; loads under way finish."""
    replicas, routing, traffic = dict(v.replicas), dict(v.routing), dict(v.traffic)
    for key, r in replicas.items():
        if r.state is S.LOADING:
            replicas[key] = ReplicaInfo(*key, S.READY, NOW)
    for a in p.actions:
        if isinstance(a, RollbackCanary):
            traffic[a.model] = a.traffic
        elif isinstance(a, PublishRouting):
            routing.pop(a.model, None)
            routing.update({a.model: a.routing} if a.routing else {})
        elif isinstance(a, LoadReplica):
            replicas[(a.model, a.version, a.worker)] = ReplicaInfo(
                a.model, a.version, a.worker, S.RUNNING, NOW
            )
        else:
            key = (a.model, a.version, a.worker)
            if type(a).__name__ == "StartReplica":
                replicas[key] = ReplicaInfo(*key, S.RUNNING, NOW)
            else:
                replicas.pop(key, None)
    return replace(v, replicas=replicas, routing=routing, traffic=traffic)


@settings(max_examples=200, deadline=None)
@given(views())
@example(  # found by hypothesis: the stable version still LOADING when the rounds begin
    view(
        routing={"a": CANARY},
        breakers={"a": 1},
        replicas=[
            rep("1", "w1", S.LOADING, "a"),
            rep("2", "w2", S.RUNNING, "a"),
            rep("1", "w1", S.LOADING, "b"),
        ],
        models=MODELS,
    )
)
def test_after_a_rollback_no_canary_is_routed_while_the_breaker_is_up(v):
    for _ in range(20):
        p = plan(v)
        after = _apply(v, p)
        if after == v:  # nothing to do, and no load still under way (those finish between rounds)
            break
        v = after
    else:
        raise AssertionError(f"still acting after 20 rounds: {p.actions}")
    for m, level in v.breakers.items():
        if level and m in v.routing:
            assert v.routing[m].canary_percent == 0, (m, v.routing[m])
