"""Safe eviction over many rounds, with an executor that is slow and fails (not one round, not a perfect one).

The executor here behaves as the real one does: a Load writes LOADING at once and READY when it finishes,
an Unload writes UNLOADING at once and removes the record when done; each action takes 0-3 rounds and may
fail (a failed Load leaves ERROR, a failed Unload leaves the replica as it was). Actions under way are
passed to the planner by kind, as the reconciler passes them.
"""

from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_scheduler.actions import (
    ForgetReplica,
    LoadReplica,
    PauseReplica,
    PublishRouting,
    ReplicaAction,
    RollbackCanary,
    StartReplica,
    UnloadReplica,
    kind_of,
)
from mcp_scheduler.placement import replica_bytes
from mcp_scheduler.plan import plan
from mcp_scheduler.view import ClusterView, ModelSpecDoc, ReplicaInfo, TrafficDoc, WorkerInfo
from mcpcore.lifecycle import ReplicaState

S = ReplicaState
GiB = 1 << 30
NOW = 1000.0


def worker(wid, gib=4):
    return WorkerInfo(id=wid, grpc=f"{wid}:1", zmq=f"tcp://{wid}:2", capacity_bytes=gib * GiB)


def rep(model, version, wid, state=S.RUNNING, gib=2, since=0.0):
    return ReplicaInfo(model, version, wid, state, since, revision=7, memory_bytes=gib * GiB)


def spec(model, priority=0, gib=2, replicas=1, versions=("1",)):
    return ModelSpecDoc(model, versions, replicas=replicas, priority=priority, memory_bytes=gib * GiB)


def view_of(workers, replicas, specs, routing=None):
    return ClusterView(
        now=NOW,
        workers={w.id: w for w in workers},
        specs={s.model: s for s in specs},
        routing=routing or {},
        replicas={r.key: r for r in replicas},
    )


def unloads(p):
    return sorted(a.key for a in p.actions if isinstance(a, UnloadReplica))


# --- the cases the round-by-round bugs came from ------------------------------------------------------


def test_a_queued_unload_does_not_make_evicting_the_other_copy_safe():
    """low/1 runs on w1 and w2, routed; the copy on w2 is being unloaded (a drain, say). Counting it as a
    copy would let big evict the one on w1, and low would be left with nothing."""
    v = view_of(
        [worker("w1"), worker("w2")],
        [rep("low", "1", "w1"), rep("low", "1", "w2")],
        [spec("low", replicas=1), spec("big", priority=5, gib=4)],
        routing={"low": TrafficDoc("1")},
    )
    assert ("low", "1", "w1") in unloads(plan(v)) or ("low", "1", "w2") in unloads(plan(v))  # one may go
    p = plan(v, in_flight={("low", "1", "w2"): "unload"})
    assert unloads(p) == []  # the copy on w1 is the last one staying: not evicted
    assert "big/1 waits for replicas unloading on w2" in p.status["big"].pending  # w2's room is coming


def test_memory_being_unloaded_counts_as_coming_free_so_no_more_is_evicted():
    """w1 is full: low-a on its way out (evicted last round for big), low-b running. big waits for low-a's
    memory; it does not evict low-b as well (the cascade), nor load before the memory is free."""
    replicas = [rep("low-a", "1", "w1", S.UNLOADING), rep("low-b", "1", "w1")]
    specs = [spec("low-a"), spec("low-b"), spec("big", priority=5)]
    v = view_of([worker("w1")], replicas, specs)
    p = plan(v)
    assert [a for a in p.actions if isinstance(a, LoadReplica | UnloadReplica)] == []
    assert "waits for replicas unloading on w1" in p.status["big"].pending
    # the same while the unload is still queued (the record still says RUNNING)
    queued = view_of([worker("w1")], [rep("low-a", "1", "w1"), rep("low-b", "1", "w1")], specs)
    p = plan(queued, in_flight={("low-a", "1", "w1"): "unload"})
    assert [a for a in p.actions if isinstance(a, LoadReplica | UnloadReplica)] == []
    # once it is gone, big loads where the room came free
    gone = view_of([worker("w1")], [rep("low-b", "1", "w1")], specs)
    assert [a.key for a in plan(gone).actions if isinstance(a, LoadReplica)] == [("big", "1", "w1")]


def test_room_held_for_a_waiting_model_is_not_given_to_another():
    replicas = [rep("low-a", "1", "w1", S.UNLOADING)]
    specs = [spec("big", priority=5), spec("mid", priority=3)]
    p = plan(view_of([worker("w1", 2)], replicas, specs))
    assert [a for a in p.actions if isinstance(a, LoadReplica)] == []  # mid does not take big's room


# --- sequences of rounds ----------------------------------------------------------------------------------

MODELS, WORKERS = ("a", "b", "c", "d"), ("w1", "w2", "w3")


@dataclass
class Pending:
    action: ReplicaAction
    rounds: int
    fails: bool


class SlowExecutor:
    """Runs the plan's replica actions the way workers do, late and sometimes not at all."""

    def __init__(self, draw):  # type: ignore[no-untyped-def]
        self.draw = draw
        self.pending: dict[tuple[str, str, str], Pending] = {}
        self.failing = True

    def in_flight(self):  # type: ignore[no-untyped-def]
        return {k: kind_of(p.action) for k, p in self.pending.items()}

    def run(self, v: ClusterView, p) -> ClusterView:  # type: ignore[no-untyped-def]
        replicas, routing = dict(v.replicas), dict(v.routing)
        for a in p.actions:
            if isinstance(a, PublishRouting):
                routing.pop(a.model, None)
                routing.update({a.model: a.routing} if a.routing else {})
                continue
            if isinstance(a, RollbackCanary) or a.key in self.pending:
                continue
            rounds = self.draw(st.integers(0, 3))
            fails = self.failing and self.draw(st.integers(0, 4)) == 0
            self.pending[a.key] = Pending(a, rounds, fails)
            r = replicas.get(a.key)
            if isinstance(a, LoadReplica):  # the worker writes LOADING as it starts
                replicas[a.key] = rep(
                    a.model, a.version, a.worker, S.LOADING, gib=_gib(v, a.model), since=v.now
                )
            elif isinstance(a, UnloadReplica) and r is not None and not fails:
                replicas[a.key] = replace(r, state=S.UNLOADING)
        for key, job in list(self.pending.items()):
            if job.rounds > 0:
                job.rounds -= 1
                continue
            del self.pending[key]
            a, r = job.action, replicas.get(key)
            if isinstance(a, LoadReplica):
                state = S.ERROR if job.fails else S.READY
                replicas[key] = rep(a.model, a.version, a.worker, state, gib=_gib(v, a.model), since=v.now)
            elif isinstance(a, StartReplica | PauseReplica) and r is not None and not job.fails:
                replicas[key] = replace(r, state=S.RUNNING if isinstance(a, StartReplica) else S.PAUSED)
            elif isinstance(a, UnloadReplica | ForgetReplica) and not job.fails:
                replicas.pop(key, None)
        return replace(v, replicas=replicas, routing=routing, now=v.now + 1)


def _gib(v: ClusterView, model: str) -> int:
    return v.specs[model].memory_bytes // GiB if model in v.specs else 1


@st.composite
def clusters(draw):
    """Workers with little room, two models running from the start, and changes arriving round by round:
    higher-priority models (which evict), replica counts going up and down, a worker drained."""
    workers = [worker(w, draw(st.integers(2, 5))) for w in WORKERS]
    first = [
        spec(
            m, priority=draw(st.integers(0, 1)), gib=draw(st.integers(1, 2)), replicas=draw(st.integers(1, 2))
        )
        for m in MODELS[:2]
    ]
    events = draw(
        st.lists(
            st.tuples(
                st.integers(1, 18),
                st.sampled_from(["add", "add", "replicas", "drain"]),
                st.sampled_from(MODELS),
                st.integers(1, 3),
            ),
            max_size=6,
        )
    )
    return view_of(workers, [], first), sorted(events)


def _change(v: ClusterView, what: str, model: str, n: int) -> ClusterView:
    specs, workers = dict(v.specs), dict(v.workers)
    if what == "add" and model not in specs:
        specs[model] = spec(model, priority=n, gib=n, replicas=1)
    elif what == "replicas" and model in specs:
        specs[model] = replace(specs[model], replicas=n)
    elif what == "drain":
        wid = WORKERS[n - 1]
        workers[wid] = replace(workers[wid], draining=True)
    return replace(v, specs=specs, workers=workers)


def _routed_running(v: ClusterView, in_flight) -> dict[tuple[str, str], int]:  # type: ignore[no-untyped-def]
    """RUNNING copies staying (no unload under way) of each routed version."""
    out = {}
    for m, t in v.routing.items():
        for version in t.versions:
            out[(m, version)] = sum(
                1
                for r in v.replicas_of(m, version)
                if r.state is S.RUNNING and in_flight.get(r.key) not in ("unload", "forget")
            )
    return out


@settings(max_examples=150, deadline=None)
@given(clusters(), st.data())
def test_rounds_with_a_slow_failing_executor_keep_memory_and_routed_copies_safe(case, data):
    v, events = case
    executor = SlowExecutor(data.draw)
    for round_no in range(60):
        for when, what, model, n in events:
            if when == round_no:
                v = _change(v, what, model, n)
        executor.failing = round_no < 20  # failures for a while, then a calm in which it must settle
        in_flight = executor.in_flight()
        p = plan(v, in_flight=in_flight)
        planned = {a.key for a in p.actions if isinstance(a, ReplicaAction)}
        assert not planned & set(in_flight), "an action for a replica with one under way"
        # an eviction never takes the last staying RUNNING copy of a routed version
        before = _routed_running(v, in_flight)
        going = {a.key for a in p.actions if isinstance(a, UnloadReplica) and "evicted" in a.reason}
        for (m, version), n in before.items():
            taken = sum(1 for k in going if k[:2] == (m, version) and v.replicas[k].state is S.RUNNING)
            assert not (n >= 1 and n - taken < 1), f"evicted the last RUNNING copy of {m}/{version}"
        v = executor.run(v, p)
        # memory: what every worker holds or is loading never exceeds what it has
        for w in v.workers.values():
            used = sum(replica_bytes(v, r) for r in v.replicas_on(w.id))
            assert used <= w.capacity_bytes, (w.id, used, sorted(k for k in v.replicas if k[2] == w.id))
    # the calm: no action left under way, and a plan with nothing to do
    assert executor.pending == {}
    assert [a for a in plan(v).actions if isinstance(a, ReplicaAction)] == []
