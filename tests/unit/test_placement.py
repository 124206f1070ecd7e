"""Placement: spread, labels, memory, reservations, eviction rules and shortfall messages."""

from mcp_scheduler.placement import format_bytes, free_bytes, place
from mcp_scheduler.view import ClusterView, ModelSpecDoc, ReplicaInfo, TrafficDoc, WorkerInfo
from mcpcore.lifecycle import ReplicaState

S = ReplicaState
GiB = 1 << 30


def worker(wid, gib=8.0, **kw):
    return WorkerInfo(id=wid, grpc=f"{wid}:1", zmq=f"tcp://{wid}:2", capacity_bytes=int(gib * GiB), **kw)


def rep(model, version, wid, state=S.RUNNING, since=0.0, gib=0.0):
    return ReplicaInfo(model, version, wid, state, since, memory_bytes=int(gib * GiB))


def spec(model, *, priority=0, gib=0.0, **kw):
    return ModelSpecDoc(model=model, versions=("1",), priority=priority, memory_bytes=int(gib * GiB), **kw)


def view(workers, replicas=(), specs=(), routing=None):
    return ClusterView(
        now=1000.0,
        workers={w.id: w for w in workers},
        specs={s.model: s for s in specs},
        routing=routing or {},
        replicas={r.key: r for r in replicas},
    )


def put(v, model="m", version="1", *, count=1, need=1.0, priority=0, labels=None, exclude=(), reserved=None):
    return place(
        v,
        model,
        version,
        count=count,
        need_bytes=int(need * GiB),
        priority=priority,
        labels=labels or {},
        exclude=set(exclude),
        reserved=reserved or {},
    )


def test_spreads_two_copies_over_two_workers():
    p = put(view([worker("w1"), worker("w2")]), count=2)
    assert sorted(p.workers) == ["w1", "w2"]
    assert (p.evictions, p.shortfall) == ([], None)


def test_prefers_workers_without_the_model_then_most_free():
    v = view(
        [worker("w1", 16), worker("w2", 4), worker("w3", 8)],
        [rep("m", "2", "w1", gib=1)],
        [spec("m", gib=1)],
    )
    assert put(v, count=1).workers == ["w3"]  # w1 has the most free memory but already holds m/2
    assert put(v, count=3).workers == ["w3", "w2", "w1"]


def test_never_a_second_copy_on_the_same_worker():
    v = view([worker("w1")], [rep("m", "1", "w1", S.ERROR)])
    p = put(v)
    assert p.workers == []
    assert "w1 already holds a copy" in p.shortfall
    failed = ReplicaInfo("m", "1", "w1", S.ERROR, 0.0, reason="load failed: no CUDAExecutionProvider")
    p = put(view([worker("w1")], [failed]))  # the operator's LoadModel answer carries the worker's words
    assert p.workers == [] and "w1 failed to load it: load failed: no CUDAExecutionProvider" in p.shortfall


def test_labels_must_all_match():
    v = view([worker("w1", labels={"gpu": "a100"}), worker("w2", labels={"gpu": "h200", "zone": "x"})])
    assert put(v, labels={"gpu": "h200"}).workers == ["w2"]
    p = put(v, labels={"gpu": "h200", "zone": "y"})
    assert p.shortfall == "cannot place m/1 (1 more copy): no worker carries labels {gpu=h200, zone=y}"


def test_memory_counts_measured_then_declared_bytes():
    v = view(
        [worker("w1", 4)],
        [rep("a", "1", "w1", gib=1.5), rep("b", "1", "w1"), rep("c", "1", "w1")],
        [spec("b", gib=1), spec("m")],  # c has no spec and no measurement: 0 bytes
    )
    assert free_bytes(v, v.workers["w1"]) == int(1.5 * GiB)
    assert put(v, need=1.5).workers == ["w1"]
    assert put(v, need=1.6).workers == []


def test_reserved_bytes_are_not_free():
    v = view([worker("w1", 4), worker("w2", 4)])
    p = put(v, need=3, count=2, reserved={"w1": 2 * GiB})
    assert p.workers == ["w2"]
    assert "w1 0.0 GiB" not in p.shortfall and "w1 has 2.0 GiB free" in p.shortfall


def test_excluded_stopped_and_draining_workers_take_nothing():
    v = view([worker("w1"), worker("w2", stopped=True), worker("w3", draining=True), worker("w4")])
    assert put(v, count=4, exclude={"w4"}).workers == ["w1"]
    p = put(view([worker("w2", stopped=True), worker("w3", draining=True), worker("w4")]), exclude={"w4"})
    assert p.shortfall == (
        "cannot place m/1 (1 more copy): no eligible worker: w2 is stopped, w3 is draining, "
        "w4 is excluded (a recent failure there, or a load under way)"
    )


def test_no_worker_registered():
    assert put(view([]), count=2).shortfall == "cannot place m/1 (2 more copies): no worker is registered"


def test_zero_count_is_empty():
    p = put(view([]), count=0)
    assert (p.workers, p.evictions, p.shortfall) == ([], [], None)


# --- eviction --------------------------------------------------------------------------------------------


def test_evicts_least_recently_used_lower_priority_replica():
    v = view(
        [worker("w1", 4)],
        [rep("low", "1", "w1", since=20, gib=2), rep("low2", "1", "w1", since=10, gib=2)],
        [spec("low"), spec("low2"), spec("big", priority=5)],
    )
    p = put(v, "big", need=2, priority=5)
    assert (p.workers, p.evictions, p.shortfall) == ([], [("low2", "1", "w1")], None)


def test_idle_replicas_go_before_running_ones():
    v = view(
        [worker("w1", 4)],
        [rep("a", "1", "w1", S.RUNNING, since=1, gib=2), rep("b", "1", "w1", S.READY, since=9, gib=2)],
        [spec("a"), spec("b")],
    )
    assert put(v, "big", need=2, priority=1).evictions == [("b", "1", "w1")]


def test_chooses_the_worker_needing_fewest_evictions():
    v = view(
        [worker("w1", 4), worker("w2", 4)],
        [
            rep("a", "1", "w1", since=1, gib=2),
            rep("b", "1", "w1", since=2, gib=2),
            rep("c", "1", "w2", since=3, gib=4),
        ],
        [spec("a"), spec("b"), spec("c")],
    )
    assert put(v, "big", need=4, priority=1).evictions == [("c", "1", "w2")]


def test_never_evicts_for_equal_or_lower_priority():
    v = view([worker("w1", 4)], [rep("a", "1", "w1", gib=4)], [spec("a", priority=3)])
    for priority in (2, 3):
        p = put(v, "big", need=2, priority=priority)
        assert p.evictions == []
        assert p.shortfall == (
            "cannot place big/1 (1 more copy): needs 2.0 GiB; eligible workers: w1 has 0 B free; "
            "no lower-priority replica can be evicted"
        )
    assert put(v, "big", need=2, priority=4).evictions == [("a", "1", "w1")]


def test_never_evicts_the_last_running_replica_of_a_routed_version():
    specs = [spec("a"), spec("big", priority=9)]
    routing = {"a": TrafficDoc("1")}
    alone = view([worker("w1", 4), worker("w2", 4)], [rep("a", "1", "w1", gib=4)], specs, routing)
    assert put(alone, "big", need=4, priority=9).evictions == []
    # a second RUNNING copy elsewhere makes one of them evictable, but never both
    both = view(
        [worker("w1", 4), worker("w2", 4)],
        [rep("a", "1", "w1", since=1, gib=4), rep("a", "1", "w2", since=2, gib=4)],
        specs,
        routing,
    )
    p = put(both, "big", count=2, need=4, priority=9)
    assert p.evictions == [("a", "1", "w1")]
    assert p.shortfall.startswith("cannot place big/1 (1 more copy)")
    # a copy on a stopped worker does not count as the one that remains
    stopped = view(
        [worker("w1", 4), worker("w2", 4, stopped=True)],
        [rep("a", "1", "w1", gib=4), rep("a", "1", "w2", gib=4)],
        specs,
        routing,
    )
    assert put(stopped, "big", need=4, priority=9).evictions == []


def test_unrouted_versions_are_evictable_even_when_alone():
    v = view(
        [worker("w1", 4)],
        [rep("a", "2", "w1", gib=4)],
        [spec("a"), spec("big", priority=9)],
        {"a": TrafficDoc("1")},
    )
    assert put(v, "big", need=4, priority=9).evictions == [("a", "2", "w1")]


def test_loading_and_unloading_replicas_are_not_evicted():
    v = view(
        [worker("w1", 4)],
        [rep("a", "1", "w1", S.LOADING, gib=2), rep("b", "1", "w1", S.UNLOADING, gib=2)],
        [spec("a"), spec("b")],
    )
    assert put(v, "big", need=2, priority=9).evictions == []


def test_fits_first_then_evicts_for_the_rest():
    v = view(
        [worker("w1", 4), worker("w2", 4)],
        [rep("a", "1", "w2", gib=4)],
        [spec("a"), spec("big", priority=1)],
    )
    p = put(v, "big", count=2, need=2, priority=1)
    assert (p.workers, p.evictions, p.shortfall) == (["w1"], [("a", "1", "w2")], None)


def test_shortfall_message_lists_free_memory_and_labels():
    v = view(
        [
            worker("w1", 1, labels={"gpu": "h200"}),
            worker("w2", 0.5, labels={"gpu": "h200"}),
            worker("w3", 64),
        ],
    )
    p = put(v, "demo-big", need=2, labels={"gpu": "h200"})
    assert p.shortfall == (
        "cannot place demo-big/1 (1 more copy): needs 2.0 GiB with labels {gpu=h200}; eligible workers: "
        "w1 has 1.0 GiB free, w2 0.5 GiB; no lower-priority replica can be evicted"
    )


def test_format_bytes():
    assert [format_bytes(n) for n in (0, 512, 2048, 3 << 20, GiB + GiB // 2)] == [
        "0 B",
        "512 B",
        "2.0 KiB",
        "3.0 MiB",
        "1.5 GiB",
    ]


def test_shortfall_when_every_eligible_worker_already_takes_a_copy():
    v = view([worker("w1"), worker("w2"), worker("w3", draining=True)])
    p = put(v, count=3)
    assert p.workers == ["w1", "w2"]
    assert (
        p.shortfall == "cannot place m/1 (1 more copy): no other eligible worker than w1, w2: w3 is draining"
    )
