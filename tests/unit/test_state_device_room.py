"""The scheduler's mirror and a load report's ``device_room_bytes``: in the view at once, no worker change
(a heartbeat replans nothing); a figure that does not parse is the report's parse error, as for any field.

The mirror is fed by hand (no etcd), as in test_reconciler_queue.
"""

from __future__ import annotations

import json

from mcp_scheduler.state import Changes, ClusterState
from mcpcore.keys import Keyspace

GiB = 1 << 30
K = Keyspace("/mcp")
RECORD = {"worker_id": "w1", "grpc": "g", "zmq": "z", "memory_capacity_bytes": 8 * GiB}


class Mirror:
    def __init__(self) -> None:
        self.state = ClusterState(None, K)  # type: ignore[arg-type]  (never lists: fed below)
        self.changes: list[Changes] = []
        self.state.listen(self.changes.append)
        self.revision = 0

    def put(self, key: str, body: dict) -> None:
        m = self.state.mirror
        self.revision += 1
        m.values[key], m.revisions[key], m.revision = json.dumps(body).encode(), self.revision, self.revision
        self.state._changed({key})

    def beat(self, beat: float, **fields: object) -> set[str]:
        """A load report; the workers it changed for the planner."""
        self.changes.clear()
        self.put(K.worker_load("w1"), {"stopped": "", "last_beat": beat, **fields})
        return set().union(*(c.workers for c in self.changes))


def test_a_new_measured_figure_is_in_the_view_but_no_worker_change():
    m = Mirror()
    m.put(K.worker("w1"), RECORD)
    assert {"w1"} <= m.changes[-1].workers  # registered
    assert m.beat(1.0) == set()  # a heartbeat
    assert m.state.view().workers["w1"].device_room_bytes is None
    assert m.beat(2.0, device_room_bytes=3 * GiB) == set()
    assert m.state.view().workers["w1"].device_room_bytes == 3 * GiB  # the next planning reads it
    assert m.beat(3.0, device_room_bytes=GiB) == set()
    assert m.state.view().workers["w1"].device_room_bytes == GiB
    assert m.beat(4.0) == set()  # the measurement went away (NVML stopped answering): capacity alone
    assert m.state.view().workers["w1"].device_room_bytes is None
    assert m.beat(5.0, device_room_bytes=GiB, stopped="emergency") == {"w1"}  # a real change still is one


def test_a_report_with_a_hostile_figure_does_not_parse():
    m = Mirror()
    m.put(K.worker("w1"), RECORD)
    m.beat(1.0, device_room_bytes=GiB)
    assert m.beat(2.0, device_room_bytes=-5) == {"w1"}  # as any bad load report field: the worker is out
    assert "w1" not in m.state.view().workers
    assert m.beat(3.0, device_room_bytes=GiB) == {"w1"}
    assert m.state.view().workers["w1"].device_room_bytes == GiB
