"""Placement under the room a worker's GPU has for it (its load report's ``device_room_bytes``: the device's
total less what other processes hold): free is ``min(capacity, room) - held - reserved``, and a shortfall
says where the room, not capacity, was the limit."""

from mcp_scheduler.placement import free_bytes, place
from mcp_scheduler.view import ClusterView, ModelSpecDoc, ReplicaInfo, WorkerInfo
from mcpcore.lifecycle import ReplicaState

S = ReplicaState
GiB = 1 << 30
MiB = 1 << 20


def worker(wid, gib=8.0, room_gib=None, **kw):
    measured = None if room_gib is None else int(room_gib * GiB)
    return WorkerInfo(
        id=wid, grpc=f"{wid}:1", zmq=f"tcp://{wid}:2", capacity_bytes=int(gib * GiB),
        device_room_bytes=measured, **kw,
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


def test_a_worker_whose_gpu_others_fill_gets_no_copy_the_other_does():
    v = view([worker("w1", 8, room_gib=0.5), worker("w2", 8)])
    assert put(v).workers == ["w2"]
    assert put(v, count=2).workers == ["w2"]  # w1's capacity would fit; what others leave on its GPU does not


def test_most_room_wins_between_equal_capacities():
    v = view([worker("w1", 8, room_gib=3), worker("w2", 8, room_gib=5)])
    assert put(v).workers == ["w2"]


def test_free_is_the_least_of_capacity_and_room_less_what_it_holds_and_reservations():
    v = view([worker("w1", 4, room_gib=6)], [rep("a", "w1", gib=2)])
    assert free_bytes(v, v.workers["w1"]) == 2 * GiB  # capacity (4) is below the room: 4 - 2
    assert free_bytes(v, v.workers["w1"], reserved={"w1": GiB}) == GiB
    low = view([worker("w1", 4, room_gib=3)], [rep("a", "w1", gib=2)])
    assert free_bytes(low, low.workers["w1"]) == GiB  # the room (3) is below capacity: 3 - 2
    assert free_bytes(low, low.workers["w1"], reserved={"w1": GiB // 2}) == GiB // 2
    assert put(low, need=1).workers == ["w1"]
    assert put(low, need=1, reserved={"w1": 1}).workers == []
    # the caller's ``used`` takes the place of the recorded replicas, as the planner passes it
    assert put(low, need=2, used={"w1": 0}).workers == ["w1"]


def test_a_copy_just_loaded_is_not_counted_twice():
    """The room leaves out the worker's own replicas, so it does not move when one loads: a report from
    before the load and the replica's record together count its bytes once."""
    before = view([worker("w1", 8, room_gib=4)])
    after = view([worker("w1", 8, room_gib=4)], [rep("a", "w1", gib=3)])
    assert free_bytes(before, before.workers["w1"]) == 4 * GiB
    assert free_bytes(after, after.workers["w1"]) == GiB


def test_no_measurement_is_capacity_alone_and_zero_is_a_full_gpu():
    v = view([worker("w1", 2), worker("w2", 64, room_gib=0)])
    assert free_bytes(v, v.workers["w1"]) == 2 * GiB
    assert free_bytes(v, v.workers["w2"]) == 0
    assert put(v, count=2).workers == ["w1"]


def test_shortfall_says_where_the_room_was_the_limit():
    v = view([worker("w1", 8, room_gib=0.3), worker("w2", 8, room_gib=0.5), worker("w3", 0.7)])
    p = put(v, need=1)
    assert p.workers == []
    assert p.shortfall == (
        "cannot place m/1 (1 more copy): needs 1.0 GiB; eligible workers: w3 has 0.7 GiB free, "
        "w2 0.5 GiB (other processes leave 0.5 GiB on its GPU), w1 0.3 GiB (other processes leave 0.3 GiB "
        "on its GPU); no lower-priority replica can be evicted"
    )


def test_shortfall_names_no_room_that_was_not_the_limit():
    v = view([worker("w1", 1, room_gib=6)], [rep("a", "w1", gib=0.5)], [ModelSpecDoc("a", ("1",))])
    p = put(v, need=1)
    assert p.shortfall.endswith("w1 has 0.5 GiB free; no lower-priority replica can be evicted")


def test_shortfall_room_in_mib_for_small_amounts():
    v = view([worker("w1", 8, room_gib=40 / 1024)])
    assert "w1 has 40.0 MiB free (other processes leave 40.0 MiB on its GPU)" in put(v, need=1).shortfall


def test_eviction_frees_room_within_what_others_leave():
    # others leave 2 GiB of w1's GPU; "low" holds all of it: evicting it makes room for "big"
    specs = [ModelSpecDoc("low", ("1",)), ModelSpecDoc("big", ("1",), priority=5)]
    v = view([worker("w1", 8, room_gib=2)], [rep("low", "w1", S.READY, gib=2)], specs)
    p = put(v, "big", need=2, priority=5)
    assert (p.workers, p.evictions, p.shortfall) == ([], [("low", "1", "w1")], None)
    # if other processes hold nearly all of the GPU, evicting all there is does not make room
    crowded = view([worker("w1", 8, room_gib=1)], [rep("low", "w1", S.READY, gib=1)], specs)
    p = put(crowded, "big", need=2, priority=5)
    assert p.evictions == [] and "(other processes leave 1.0 GiB on its GPU)" in p.shortfall
