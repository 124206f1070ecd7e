"""Chaos under load (``make chaos``): every scenario of tests/integration/scenarios.py, longer, against a
real cluster of two routers, two schedulers, two health services and three workers, with steady load from
SDK client processes (``mcpclient.MeshClient`` over both routers, every answer checked), each scenario
writing its row to ``bench/chaos.json``.

``MCP_CHAOS_SECONDS`` (default 40) is how long each scenario's load runs in all (the fault included) and how
long faults with a length hold their plateau; the long etcd outage lasts ``MCP_CHAOS_ETCD_OUTAGE_S``
(default 60). ``make test`` runs the same scenarios briefly (tests/integration/test_delivery.py); here the
timings are checked too (the fast model's p99 beside the slow one, fast refusals under overload).
The pytest timeouts follow these durations.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import pytest
from harness import make_demo_repository
from meshload import Mesh, SdkLoad
from scenarios import SCENARIOS, WANTED, breaker_policy, long_etcd_outage, run

pytestmark = pytest.mark.slow
SECONDS = float(os.environ.get("MCP_CHAOS_SECONDS", "40"))
OUTAGE_S = float(os.environ.get("MCP_CHAOS_ETCD_OUTAGE_S", "60"))
OUT = Path(__file__).resolve().parents[2] / "bench" / "chaos.json"
#: window and cool-down of the breaker policy (the default's thresholds): the 95% drill walks 3 levels down
BREAKER_S = max(3.0, min(10.0, SECONDS / 4))
_NAMES = list(SCENARIOS)
ORDER = [*_NAMES[:9], long_etcd_outage(OUTAGE_S).name, *_NAMES[9:]]
ROWS: dict[str, dict] = {}


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chaos")
    repo = make_demo_repository(tmp / "models")
    mesh = Mesh(tmp, repo, schedulers=2, healths=2, partitionable=1, stats_window_s=BREAKER_S)
    try:
        breaker_policy(mesh, window_s=BREAKER_S, cool_down_s=BREAKER_S)
        for model, replicas in WANTED.items():
            mesh.load(model, replicas)
        mesh.load("demo-flaky", 2, fallback="2")
        yield mesh
    finally:
        mesh.close()
        _write()


def _load(mesh: Mesh):  # type: ignore[no-untyped-def]
    def make(model: str, clients: int = 4, any_version: bool = False) -> SdkLoad:
        processes = 4 if clients > 8 else 2
        return SdkLoad(mesh, model, processes=processes, threads=max(1, clients // processes),
                       any_version=any_version, seed=len(ROWS))  # fmt: skip

    return make


def _write() -> None:
    OUT.parent.mkdir(exist_ok=True)
    doc = {
        "machine": f"{platform.node()} {os.cpu_count()} cpus", "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "seconds": SECONDS, "rows": [ROWS[n] for n in ORDER if n in ROWS],
    }  # fmt: skip
    OUT.write_text(json.dumps(doc, indent=1) + "\n")


def _budget(name: str) -> float:
    """A scenario's pytest timeout from its own durations: its soak, its fault's length, recovery."""
    fault = OUTAGE_S if name.startswith("etcd_killed_") and name != "etcd_killed_10s" else 10.0
    walk = 8 * BREAKER_S if name.startswith("backend_fails") else 0.0
    return 2 * SECONDS + fault + walk + 180


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.timeout(_budget(n))) for n in ORDER])
def test_scenario(mesh, name):
    scenario = SCENARIOS.get(name) or long_etcd_outage(OUTAGE_S)
    row = run(mesh, mesh.repo, scenario, _load(mesh), hold_s=SECONDS / 4, soak_s=SECONDS, timing=True,
              recover_s=60 + OUTAGE_S)  # fmt: skip
    ROWS[name] = row
    _write()
    print(json.dumps(row))
