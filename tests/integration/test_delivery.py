"""Every client gets its own answer, exactly once, through every fault (the request-path issue's table),
and the short version of every ``make chaos`` scenario (tests/integration/scenarios.py defines each once).

One mesh for the module, as ``make up`` runs it (etcd, three workers, two schedulers, two health services,
two routers; clients connect to both routers), carrying an idempotent model (``demo-mlp``) and one that is
not (``demo-stateful``), two replicas each, and ``demo-flaky`` (its fault layer idle) for the breaker
drills, under checked load while each fault strikes:

- kill -9, SIGSTOP past its lease, SIGTERM of a worker; SIGTERM and kill -9 of a router; kill -9 of the
  leader scheduler mid-LoadModel and of the leader health service; etcd frozen for 10 s; etcd killed and
  restarted after 10 s; a worker partitioned from the routers and healed; a backend failing 50% and 95%
  of its requests, then healing; a slow model beside a fast one; 10x overload; etcd restored from an
  older snapshot; a worker restarted under its own id.

After each: idempotent requests 0 failed; ``demo-stateful`` 0 run twice (counted over every worker's
execution journal, the killed ones' too), and its only failures are UNAVAILABLE "may have started" for
requests its killed or frozen worker held, each counted by the routers; and the mesh is back at its
replica counts with records that match what the workers hold. No timing is checked here; ``make chaos``
runs the same scenarios longer, with timings, and the 60 s etcd outage.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from harness import metric, wait_for
from meshload import CheckedLoad, Mesh
from scenarios import SCENARIOS, WANTED, Scenario, breaker_policy, holder, run

from mcpapi.v2 import control_pb2

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def mesh(tmp_path_factory, repo):
    mesh = Mesh(
        tmp_path_factory.mktemp("mesh"), repo, schedulers=2, healths=2, partitionable=1, stats_window_s=3
    )
    try:
        breaker_policy(mesh, window_s=3, cool_down_s=2)
        for model, replicas in WANTED.items():
            mesh.load(model, replicas)
        mesh.load("demo-flaky", 2, fallback="2")
        yield mesh
    finally:
        mesh.close()


class _Load(CheckedLoad):
    """Thread clients on a channel of their own over both routers (closed with the load)."""

    def __init__(self, mesh: Mesh, repo: Path, model: str, clients: int = 4, any_version: bool = False):
        self._channel = mesh.channel()
        super().__init__(self._channel, model, repo, clients=clients, any_version=any_version)

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._channel.close()


def scenario(mesh: Mesh, repo: Path, name: str) -> dict:
    row = run(mesh, repo, SCENARIOS[name], lambda model, **kw: _Load(mesh, repo, model, **kw), hold_s=2.0)
    print(json.dumps(row))
    return row


def test_clients_reusing_request_ids_each_get_their_own_answer(mesh, repo):
    """16 Triton clients, each numbering its requests "0", "1", ...: every answer is the request's own."""
    script = [sys.executable, str(HERE / "triton_same_ids.py"), mesh.routers[0].endpoints["grpc"], str(repo)]
    args = [*script, "--clients", "16", "--requests", "60"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report == {"ok": 16 * 60, "wrong": 0, "failed": 0, "messages": []}, report


def test_kill_9_a_worker_under_load(mesh, repo):
    scenario(mesh, repo, "kill_9_worker")


def test_sigstop_a_worker_past_its_lease(mesh, repo):
    resent_before = mesh.router_metric("mcp_router_retries_total", reason="may_have_started")
    row = scenario(mesh, repo, "sigstop_worker_past_ttl")  # demo-stateful: some fail "may have started"
    # every client whose next request went to the frozen worker waited there until its link timed out:
    # the idempotent ones were sent once more (counted by reason), the stateful ones failed, not resent.
    # (The victim holds demo-stateful; it holds demo-mlp too unless earlier faults moved its copies.)
    resent = mesh.router_metric("mcp_router_retries_total", reason="may_have_started") > resent_before
    assert resent == bool(row["frozen_held_idempotent"]), row


def test_sigterm_a_worker_drains_it(mesh, repo):
    scenario(mesh, repo, "sigterm_worker_drain")


def test_sigterm_the_only_holder_of_a_model_hands_it_over_first(mesh, repo):
    """One copy only: the draining worker serves it until the scheduler has it running elsewhere."""
    mesh.load("demo-onnx", 1)
    only = holder(mesh, "demo-onnx")
    mesh.add_worker()
    channel = mesh.channel()
    with CheckedLoad(channel, "demo-onnx", repo) as onnx:
        onnx.wait_ok(50)
        only.stop()  # SIGTERM
        onnx.wait_ok(100)
    channel.close()
    assert (onnx.result.failures, onnx.result.wrong) == ([], [])
    assert any(("demo-onnx", "1") in mesh.held(w) for w in mesh.live_workers())
    mesh.control.UnloadModel(control_pb2.UnloadModelRequest(model="demo-onnx"), timeout=60)


def test_etcd_frozen_10s_is_invisible(mesh, repo):
    scenario(mesh, repo, "etcd_frozen_10s")


def test_etcd_killed_and_restarted_after_10s_is_invisible(mesh, repo):
    scenario(mesh, repo, "etcd_killed_10s")


def test_etcd_restored_from_an_older_snapshot_under_load(mesh, repo, tmp_path):
    """The operator's backup restore: etcd goes back in revisions, to keys as they were at the backup.
    Every mirror lists again, every worker writes what it really holds, and what the backup does not
    know (a model loaded after it) is unloaded: its spec is gone."""
    backup = tmp_path / "backup.db"
    mesh.etcd.save_snapshot(backup)
    mesh.load("demo-onnx", 1)  # after the backup: lost with the restore
    relists = _relists(mesh)

    restore = Scenario("etcd_restored", lambda d: mesh.etcd.restore_snapshot(backup), stateful="none")
    run(mesh, repo, restore, lambda model, **kw: _Load(mesh, repo, model, **kw))
    assert _relists(mesh) > relists  # the scheduler's mirror listed again (counted)
    wait_for(
        lambda: not any(("demo-onnx", "1") in mesh.held(w) for w in mesh.live_workers()),
        30, 0.1, "the model the backup does not know unloaded",
    )  # fmt: skip
    mesh.load("demo-onnx", 1)  # writes after the restore take effect: no mirror waits for old revisions
    assert any(("demo-onnx", "1") in mesh.held(w) for w in mesh.live_workers())
    mesh.control.UnloadModel(control_pb2.UnloadModelRequest(model="demo-onnx"), timeout=60)


def _relists(mesh: Mesh) -> float:
    return metric(mesh.scheduler.metrics_text(), "mcp_loop_errors_total", loop="scheduler-state_relist")


def test_a_worker_restarted_under_its_id_routes_only_what_it_holds(mesh, repo):
    """kill -9 and start again at once with the same id (a StatefulSet, compose's restart): its old replica
    records are another incarnation's, so no router sends the new process a request for them."""

    restarted: list[str] = []

    def fault(d: object) -> None:
        old = holder(mesh)
        old.kill()
        restarted.append(mesh.add_worker(old.worker_id).worker_id)

    run(
        mesh,
        repo,
        Scenario("restarted_under_its_id", fault),
        lambda model, **kw: _Load(mesh, repo, model, **kw),
    )
    new = mesh.workers[restarted[0]]  # add_worker replaced the killed process under the same id
    # it was never sent a request for a replica only its predecessor held (it would answer "not held")
    assert metric(new.metrics_text(), "mcp_requests_total", model="_unknown") == 0


def test_sigterm_a_router_with_clients_on_two(mesh, repo):
    scenario(mesh, repo, "sigterm_router")


def test_kill_9_a_router_with_clients_on_two(mesh, repo):
    scenario(mesh, repo, "kill_9_router")


def test_kill_9_the_leader_scheduler_mid_load_model(mesh, repo):
    scenario(mesh, repo, "kill_9_leader_scheduler_mid_load")


def test_kill_9_the_leader_health_service(mesh, repo):
    scenario(mesh, repo, "kill_9_leader_health")


def test_a_worker_partitioned_from_the_routers_then_healed(mesh, repo):
    scenario(mesh, repo, "partition_worker")


def test_a_backend_failing_half_its_requests_opens_level_1_only(mesh, repo):
    scenario(mesh, repo, "backend_fails_50pct")


def test_a_backend_failing_95pct_walks_to_the_fallback_and_back(mesh, repo):
    scenario(mesh, repo, "backend_fails_95pct")


def test_a_slow_model_beside_a_fast_one(mesh, repo):
    scenario(mesh, repo, "slow_beside_fast")


def test_10x_overload_is_refused_fast_with_flat_memory(mesh, repo):
    scenario(mesh, repo, "overload_10x")
