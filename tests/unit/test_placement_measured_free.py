"""Placement under a worker's measured free GPU memory (its load report's ``device_free_bytes``): free is
``min(capacity - held, measured) - reserved``, and a shortfall says where the measurement was the limit."""

from mcp_scheduler.placement import free_bytes, place
from mcp_scheduler.view import ClusterView, ModelSpecDoc, ReplicaInfo, WorkerInfo
from mcpcore.lifecycle import ReplicaState

S = ReplicaState
GiB = 1 << 30
MiB = 1 << 20


def worker(wid, gib=8.0, measured_gib=None, **kw):
    measured = None if measured_gib is None else int(measured_gib * GiB)
    return WorkerInfo(
        id=wid, grpc=f"{wid}:1", zmq=f"tcp://{wid}:2", capacity_bytes=int(gib * GiB),
        measured_free_bytes=measured, **kw,
    )  # fmt: skip


def rep(model, wid, state=S.RUNNING, since=0.0, gib=0.0):
    return ReplicaInfo(model, "1", wid, state, since, memory_bytes=int(gib * GiB))


def view(workers, replicas=(), specs=()):
    return ClusterView(
        now=1000.0,
        workers={w.id: w for w in workers},
        specs={s.model: s for s in specs},
        replicas={r.key: r for r in replicas},
    )


def put(v, model="m", *, count=1, need=1.0, priority=0, reserved=None, used=None):
    return place(
        v, model, "1", count=count, need_bytes=int(need * GiB), priority=priority, labels={},
        reserved=reserved or {}, used=used,
    )  # fmt: skip


def test_a_worker_whose_gpu_has_little_free_gets_no_copy_the_other_does():
    v = view([worker("w1", 8, measured_gib=0.5), worker("w2", 8)])
    assert put(v).workers == ["w2"]
    assert put(v, count=2).workers == ["w2"]  # w1's capacity would fit; its GPU does not


def test_most_measured_free_wins_between_equal_capacities():
    v = view([worker("w1", 8, measured_gib=3), worker("w2", 8, measured_gib=5)])
    assert put(v).workers == ["w2"]


def test_free_is_the_least_of_book_and_measurement_less_reservations():
    v = view([worker("w1", 4, measured_gib=3)], [rep("a", "w1", gib=2)])
    assert free_bytes(v, v.workers["w1"]) == 2 * GiB  # the book (4 - 2) is below the measurement
    assert free_bytes(v, v.workers["w1"], reserved={"w1": GiB}) == GiB
    low = view([worker("w1", 4, measured_gib=1)], [rep("a", "w1", gib=2)])
    assert free_bytes(low, low.workers["w1"]) == GiB  # the measurement is below the book
    assert free_bytes(low, low.workers["w1"], reserved={"w1": GiB // 2}) == GiB // 2
    assert put(low, need=1).workers == ["w1"]
    assert put(low, need=1, reserved={"w1": 1}).workers == []
    # the caller's ``used`` takes the place of the recorded replicas, as the planner passes it
    assert put(low, need=1, used={"w1": 0}).workers == ["w1"]


def test_no_measurement_is_capacity_alone_and_zero_is_a_full_gpu():
    v = view([worker("w1", 2), worker("w2", 64, measured_gib=0)])
    assert free_bytes(v, v.workers["w1"]) == 2 * GiB
    assert free_bytes(v, v.workers["w2"]) == 0
    assert put(v, count=2).workers == ["w1"]


def test_shortfall_says_where_the_measured_device_memory_was_the_limit():
    v = view([worker("w1", 8, measured_gib=0.3), worker("w2", 8, measured_gib=0.5), worker("w3", 0.7)])
    p = put(v, need=1)
    assert p.workers == []
    assert p.shortfall == (
        "cannot place m/1 (1 more copy): needs 1.0 GiB; eligible workers: w3 has 0.7 GiB free, "
        "w2 0.5 GiB (measured free on its GPU 0.5 GiB), w1 0.3 GiB (measured free on its GPU 0.3 GiB); "
        "no lower-priority replica can be evicted"
    )


def test_shortfall_names_no_measurement_that_was_not_the_limit():
    v = view([worker("w1", 1, measured_gib=6)], [rep("a", "w1", gib=0.5)], [ModelSpecDoc("a", ("1",))])
    p = put(v, need=1)
    assert p.shortfall.endswith("w1 has 0.5 GiB free; no lower-priority replica can be evicted")


def test_shortfall_measured_figure_in_mib_for_small_amounts():
    v = view([worker("w1", 8, measured_gib=40 / 1024)])
    assert "w1 has 40.0 MiB free (measured free on its GPU 40.0 MiB)" in put(v, need=1).shortfall


def test_eviction_counts_the_evicted_replica_against_the_measured_figure():
    # w1's GPU is full (its replica "low" is on it): evicting "low" frees its 2 GiB, which is then free
    specs = [ModelSpecDoc("low", ("1",)), ModelSpecDoc("big", ("1",), priority=5)]
    v = view([worker("w1", 4, measured_gib=0)], [rep("low", "w1", S.READY, gib=2)], specs)
    p = put(v, "big", need=2, priority=5)
    assert (p.workers, p.evictions, p.shortfall) == ([], [("low", "1", "w1")], None)
    # if other processes hold the rest of the GPU, evicting all there is does not make room
    crowded = view([worker("w1", 8, measured_gib=0)], [rep("low", "w1", S.READY, gib=1)], specs)
    p = put(crowded, "big", need=2, priority=5)
    assert p.evictions == [] and "w1 has 0 B free (measured free on its GPU 0 B)" in p.shortfall
