"""What the reconciler queues for each change the state mirror reports (the work queue's producer).

The mirror here is fed by hand (no etcd): these are the pure routing rules from a change to the models
to plan. The same rules run end to end in test_scheduler_scale and test_scheduler_eviction.
"""

from __future__ import annotations

import json
import time

from mcp_scheduler.actions import LoadReplica, UnloadReplica
from mcp_scheduler.config import SchedulerConfig
from mcp_scheduler.plan import plan
from mcp_scheduler.reconciler import Reconciler
from mcp_scheduler.state import ClusterState
from mcp_scheduler.view import ModelSpecDoc, TrafficDoc
from mcpcore.keys import Keyspace
from mcpcore.lifecycle import ReplicaRecord, ReplicaState

GiB = 1 << 30
K = Keyspace("/mcp")


class Cluster:
    def __init__(self) -> None:
        self.state = ClusterState(None, K)  # type: ignore[arg-type]  (never lists: fed below)
        self.revision = 0
        self.reconciler = Reconciler(
            self.state, None, K, None, SchedulerConfig(scheduler_id="s"),  # type: ignore[arg-type]
            is_leader=lambda: True, fence=None,  # type: ignore[arg-type]
        )  # fmt: skip

    def put(self, key: str, value: bytes) -> None:
        m = self.state.mirror
        self.revision += 1
        m.values[key], m.revisions[key], m.revision = value, self.revision, self.revision
        self.state._changed({key})

    def delete(self, key: str) -> None:
        m = self.state.mirror
        self.revision += 1
        m.values.pop(key, None)
        m.revisions.pop(key, None)
        m.revision = self.revision
        self.state._changed({key})

    def worker(self, w: str, capacity: int = 2 * GiB, stopped: str = "") -> None:
        record = {"worker_id": w, "grpc": "g", "zmq": "z", "memory_capacity_bytes": capacity}
        self.put(K.worker(w), json.dumps(record).encode())
        self.put(K.worker_load(w), json.dumps({"stopped": stopped, "last_beat": time.time()}).encode())

    def running(self, model: str, w: str) -> None:
        info = {"memory_bytes": GiB}
        self.put(
            K.replica(model, "1", w), ReplicaRecord(ReplicaState.RUNNING, time.time(), info=info).to_json()
        )

    def spec(self, model: str, replicas: int = 1, priority: int = 0) -> None:
        spec = ModelSpecDoc(model, ("1",), replicas=replicas, memory_bytes=GiB, priority=priority)
        self.put(K.model_spec(model), spec.to_json())

    def queued(self) -> list[str]:
        return self.reconciler.queue.take(1000)


def test_a_heartbeat_queues_nothing_and_a_stop_queues_the_workers_models():
    c = Cluster()
    c.worker("w1")
    c.spec("a")
    c.running("a", "w1")
    c.queued()
    c.worker("w1")  # the same record and a new heartbeat: nothing for the planner
    c.put(K.prefix + "/stats/r1/a", b"{}")  # a router's stats window: for the health service
    assert c.queued() == []
    c.put(K.worker_load("w1"), json.dumps({"stopped": "emergency", "last_beat": 1.0}).encode())
    assert c.queued() == ["a"]


def test_room_freed_by_an_eviction_goes_to_the_model_it_was_for():
    c = Cluster()
    for w in ("w1", "w2"):
        c.worker(w)
    c.spec("low", replicas=2)
    c.spec("fill", replicas=2, priority=1)
    for w in ("w1", "w2"):
        c.running("low", w)
        c.running("fill", w)
    for m in ("low", "fill"):
        c.put(K.model_routing(m), TrafficDoc("1").to_json())
    c.queued()
    c.spec("high", priority=5)
    assert c.queued() == ["high"]
    p = plan(c.state.view(), models=["high"])
    (evict,) = [a for a in p.actions if isinstance(a, UnloadReplica)]
    assert evict.model == "low"
    c.reconciler._unsettled.add("high")  # as publishing its pending status does
    c.delete(K.replica(evict.model, "1", evict.worker))  # the eviction lands
    batch = c.queued()
    assert batch[0] == "high"  # before low, which would take the room back
    loads = [a for a in plan(c.state.view(), models=batch[:1]).actions if isinstance(a, LoadReplica)]
    assert [(a.model, a.worker) for a in loads] == [("high", evict.worker)]
