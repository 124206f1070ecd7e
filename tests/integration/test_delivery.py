"""Every client gets its own answer, exactly once, through every fault (the request-path issue's table).

One mesh for the module, as ``make up`` runs it (etcd, three workers, a scheduler, a health service, two
routers; clients connect to both routers), carrying an idempotent model (``demo-mlp``) and one that is
not (``demo-stateful``), two replicas each, under checked load while each fault strikes:

- kill -9, SIGSTOP past its lease, SIGTERM of a worker; SIGTERM of a router; etcd frozen for 10 s;
  etcd killed and restarted after 10 s; etcd restored from an older snapshot; a worker restarted under
  its own id.

After each: idempotent requests 0 failed; ``demo-stateful`` 0 run twice (counted over every worker's
execution journal, the killed ones' too), and its only failures are UNAVAILABLE "may have started" for
requests its killed or frozen worker held, each counted by the routers; and the mesh is back at its
replica counts with records that match what the workers hold. The 60 s etcd outages run in ``make chaos``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from harness import metric, wait_for
from meshload import CheckedLoad, LoadResult, Mesh, settle

from mcpapi.v2 import control_pb2

WANTED = {"demo-mlp": 2, "demo-stateful": 2}
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def mesh(tmp_path_factory, repo):
    mesh = Mesh(tmp_path_factory.mktemp("mesh"), repo)
    try:
        for model, replicas in WANTED.items():
            mesh.load(model, replicas)
        yield mesh
    finally:
        mesh.close()


def holder(mesh: Mesh, *models: str):  # type: ignore[no-untyped-def]
    """A live worker that holds every one of ``models`` (default: both; with two copies each on three
    workers one always does), so the fault hits requests of each in flight on it."""
    wanted = {(m, "1") for m in models or WANTED}
    return next(w for w in mesh.live_workers() if wanted <= mesh.held(w))


def under_load(mesh: Mesh, repo: Path, fault: Callable[[], None]) -> tuple[LoadResult, LoadResult]:
    """Checked load on both models; the fault strikes once traffic flows; the load goes on until the mesh
    is consistent again and more answers came after that."""
    wait_for(lambda: mesh.consistent(WANTED), 30, 0.1, "the mesh at its replica counts before the fault")
    started = mesh.may_have_started_total()
    channel = mesh.channel()
    with (
        CheckedLoad(channel, "demo-mlp", repo) as mlp,
        CheckedLoad(channel, "demo-stateful", repo) as stateful,
    ):
        mlp.wait_ok(50)
        stateful.wait_ok(50)
        fault()
        wait_for(lambda: mesh.consistent(WANTED), 40, 0.1, "the mesh back at its replica counts")
        mlp.wait_ok(100)
        stateful.wait_ok(100)
    channel.close()
    a, b = mlp.result, stateful.result
    assert (a.failures, a.wrong) == ([], []), a.failures[:5]  # idempotent: nothing fails, nothing swaps
    assert b.wrong == [] and b.not_may_have_started() == [], b.failures[:5]
    assert mesh.duplicates("demo-stateful") == []  # at most once, across every worker
    counted = mesh.may_have_started_total() - started
    assert counted == len(b.failures), (counted, b.failures)  # each such failure counted by a router
    return a, b


def test_clients_reusing_request_ids_each_get_their_own_answer(mesh, repo):
    """16 Triton clients, each numbering its requests "0", "1", ...: every answer is the request's own."""
    script = [sys.executable, str(HERE / "triton_same_ids.py"), mesh.routers[0].endpoints["grpc"], str(repo)]
    args = [*script, "--clients", "16", "--requests", "60"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report == {"ok": 16 * 60, "wrong": 0, "failed": 0, "messages": []}, report


def test_kill_9_a_worker_under_load(mesh, repo):
    def fault() -> None:
        holder(mesh).kill()
        mesh.add_worker()

    _, stateful = under_load(mesh, repo, fault)
    print(f"kill -9: demo-stateful failed 'may have started' {len(stateful.failures)} of {stateful.ok}")


def test_sigstop_a_worker_past_its_lease(mesh, repo):
    resent_before = mesh.router_metric("mcp_router_retries_total", reason="may_have_started")

    def fault() -> None:
        frozen = holder(mesh)
        os.kill(frozen.proc.pid, signal.SIGSTOP)
        settle(3.0)  # the fault: frozen past its 2 s lease
        os.kill(frozen.proc.pid, signal.SIGCONT)

    _, stateful = under_load(mesh, repo, fault)
    # every client whose next request went to the frozen worker waited there until its link timed out:
    # the idempotent ones were sent once more (counted by reason), the stateful ones failed, not resent
    assert stateful.failures
    assert mesh.router_metric("mcp_router_retries_total", reason="may_have_started") > resent_before


def test_sigterm_a_worker_drains_it(mesh, repo):
    def fault() -> None:
        mesh.add_worker()
        holder(mesh).stop()  # SIGTERM: draining, then gone

    _, stateful = under_load(mesh, repo, fault)
    assert stateful.failures == []  # a drain fails nothing: what did not start goes elsewhere


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
    def fault() -> None:
        os.kill(mesh.etcd.proc.pid, signal.SIGSTOP)
        settle(10.0)  # the fault: every lease lapses meanwhile
        os.kill(mesh.etcd.proc.pid, signal.SIGCONT)

    _, stateful = under_load(mesh, repo, fault)
    assert stateful.failures == []


def test_etcd_killed_and_restarted_after_10s_is_invisible(mesh, repo):
    def fault() -> None:
        mesh.etcd.kill()
        settle(10.0)  # the fault: etcd gone
        mesh.etcd.start()

    _, stateful = under_load(mesh, repo, fault)
    assert stateful.failures == []


def test_etcd_restored_from_an_older_snapshot_under_load(mesh, repo, tmp_path):
    """The operator's backup restore: etcd goes back in revisions, to keys as they were at the backup.
    Every mirror lists again, every worker writes what it really holds, and what the backup does not
    know (a model loaded after it) is unloaded: its spec is gone."""
    backup = tmp_path / "backup.db"
    mesh.etcd.save_snapshot(backup)
    mesh.load("demo-onnx", 1)  # after the backup: lost with the restore
    relists = _relists(mesh)

    _, stateful = under_load(mesh, repo, lambda: mesh.etcd.restore_snapshot(backup))
    assert stateful.failures == []
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

    def fault() -> None:
        old = holder(mesh)
        old.kill()
        restarted.append(mesh.add_worker(old.worker_id).worker_id)

    under_load(mesh, repo, fault)
    new = mesh.workers[restarted[0]]  # add_worker replaced the killed process under the same id
    # it was never sent a request for a replica only its predecessor held (it would answer "not held")
    assert metric(new.metrics_text(), "mcp_requests_total", model="_unknown") == 0


def test_sigterm_a_router_with_clients_on_two(mesh, repo):
    def fault() -> None:
        mesh.routers[0].stop()  # SIGTERM: NOT_SERVING, in-flight calls finish, then it exits

    _, stateful = under_load(mesh, repo, fault)
    assert stateful.failures == []
