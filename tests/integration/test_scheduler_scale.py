"""The controller shape, end to end at a small scale: the bench's own run (``scale_run``), judged here on
what it did, not how fast: real etcd, two real scheduler processes, simulated workers in a helper process.

- A new leader's full pass over a converged cluster writes nothing (no replica, routing or status key):
  ``scale_run`` raises if it did.
- 1,000 models written at once are all placed, RUNNING and routed (``scale_run`` waits for each), with
  exactly one load each.
- In steady state the workers' heartbeats are the only etcd writes, and they queue no model: load reports
  do not trigger replans.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from scheduler_scale_bench import scale_run  # noqa: E402


def test_a_new_leader_changes_nothing_places_everything_and_heartbeats_replan_nothing():
    figures = scale_run(200, 20, steady_s=2.0)
    assert figures["placements_per_s_200_models"] > 0
    assert figures["loads_per_new_model_200_models"] == 1.0  # none loaded twice while the watch caught up
    assert figures["etcd_heartbeats_per_s_200_models"] > 0  # the producer: workers did beat meanwhile
    assert figures["etcd_writes_per_s_steady_200_models"] == figures["etcd_heartbeats_per_s_200_models"]
    assert figures["reconciles_steady_200_models"] == 0
