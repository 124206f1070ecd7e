"""The Python SDK (``mcpclient.MeshClient`` / ``AsyncMeshClient``) against a real cluster: two workers, a
scheduler, two routers and a health service on a real etcd.

Both paths give the same answers; the direct path sends to the worker itself (coalesced, counted by the
worker for the breakers, and the health service reads those counts), falls back to the router only for
requests that provably did not start, and never sends twice one that may have run; several routers fail
over; every failure is a typed ``MCPError``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import zmq
import zmq.auth
from harness import (
    HealthProcess,
    RouterProcess,
    SchedulerProcess,
    WorkerProcess,
    etcd_get,
    etcd_put,
    freeze,
    metric,
    mlp_reference,
    small_mesh,
    wait_for,
)

from mcpapi.v2 import worker_pb2
from mcpclient import (
    AsyncMeshClient,
    ClientStats,
    DeadlineExceeded,
    InvalidArgument,
    MCPError,
    MeshClient,
    NotFound,
    Unavailable,
    async_client,
)
from mcpcore import wire
from mcpcore.keys import Keyspace

MODEL = "demo-mlp"


@dataclass
class Cluster:
    prefix: str
    workers: list[WorkerProcess]
    scheduler: SchedulerProcess
    routers: list[RouterProcess]
    health: HealthProcess

    @property
    def router_addresses(self) -> list[str]:
        return [r.endpoints["grpc"] for r in self.routers]

    def client(self, routers: list[str] | None = None, **options: object) -> MeshClient:
        return MeshClient(
            routers or self.router_addresses, scheduler=self.scheduler.endpoints["grpc"], **options
        )

    def worker(self, worker_id: str) -> WorkerProcess:
        return next(w for w in self.workers if w.worker_id == worker_id)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, etcd_endpoint: str, repo: Path) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("sdk")
    prefix = f"/t{uuid.uuid4().hex[:8]}/mcp"
    started: list = []
    try:
        workers = [WorkerProcess(tmp, etcd_endpoint, repo, prefix=prefix).start() for _ in range(2)]
        started += workers
        scheduler = SchedulerProcess(tmp, etcd_endpoint, prefix=prefix).start()
        started.append(scheduler)
        routers = [RouterProcess(tmp, etcd_endpoint, prefix=prefix).start() for _ in range(2)]
        started += routers
        health = HealthProcess(tmp, etcd_endpoint, prefix=prefix, check_interval_s=0.1).start()
        started.append(health)
        mesh = Cluster(prefix, workers, scheduler, routers, health)
        with mesh.client() as client:
            info = client.load(MODEL, ["1"], replicas=2)
            assert info.running("1") == 2, info
            for address in mesh.router_addresses:  # each router has it in its table
                with mesh.client([address]) as one:
                    wait_for(lambda c=one: _routable(c), what=f"{MODEL} routed by {address}")
        yield mesh
    finally:
        for proc in reversed(started):
            proc.stop()


def _routable(client: MeshClient) -> bool:
    try:
        client.route(MODEL)
    except MCPError:
        return False
    return True


def _x(rows: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((rows, 64), dtype=np.float32)


def _free_address() -> str:
    """A loopback address nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_router_path_and_direct_path_give_identical_outputs(cluster: Cluster, repo: Path) -> None:
    x = _x()
    with cluster.client() as client:
        routed = client.infer(MODEL, {"INPUT0": x}, version="1")
        direct = client.infer(MODEL, {"INPUT0": x}, version="1", direct=True)
        assert set(routed) == set(direct) and "OUTPUT0" in routed
        for name in routed:
            assert routed[name].dtype == direct[name].dtype
            assert np.array_equal(routed[name], direct[name]), name
        np.testing.assert_allclose(
            direct["OUTPUT0"], mlp_reference(repo, MODEL, "1", x), rtol=1e-5, atol=1e-6
        )
        assert (client.stats.routed, client.stats.direct, client.stats.fallbacks) == (1, 1, 0)
        only = client.infer(MODEL, {"INPUT0": x}, version="1", direct=True, outputs=["OUTPUT0"])
        assert list(only) == ["OUTPUT0"]
        [info] = client.status(MODEL)
        assert info.model == MODEL and info.running("1") == 2


def _router_links(router: RouterProcess) -> dict[str, str]:
    """worker -> the address the router's link to it connects to (its /debug/snapshot)."""
    url = f"http://{router.endpoints['metrics']}/debug/snapshot"
    with urllib.request.urlopen(url, timeout=5) as resp:
        workers = json.load(resp)["workers"]
    return {worker: doc["link_address"] for worker, doc in workers.items()}


def test_same_host_senders_reach_the_worker_by_its_local_endpoint(
    cluster: Cluster, repo: Path, etcd_endpoint: str
) -> None:
    """Each worker's record offers its same-host endpoint; the SDK's direct links and every router's links
    connect there, named from what the worker's record publishes, and the answers are the model's."""
    x = _x()
    want = mlp_reference(repo, MODEL, "1", x)
    expected = {}
    for worker in cluster.workers:
        doc = etcd_get(etcd_endpoint, Keyspace(cluster.prefix).worker(worker.worker_id))
        assert doc is not None and wire.FEATURE_LOCAL in doc["zmq_features"]
        local = wire.local_endpoint(worker.worker_id, doc["incarnation"], doc["zmq"], doc["curve_public_key"])
        assert local.startswith("ipc://@mcpmesh-")
        expected[worker.worker_id] = local
    with cluster.client() as client:
        for key in ("a", "b", "c", "d", "e", "f"):  # sticky keys: most likely both workers
            out = client.infer(MODEL, {"INPUT0": x}, version="1", key=key, direct=True)
            np.testing.assert_allclose(out["OUTPUT0"], want, rtol=1e-5, atol=1e-6)
        links = client._client._direct.forwarder._links  # which address each link took is the point
        assert links and {w: link.address for w, link in links.items()} == {w: expected[w] for w in links}
    for router in cluster.routers:
        addresses = _router_links(router)
        assert {w: addresses.get(w) for w in expected} == expected


def test_a_worker_without_its_local_endpoint_is_reached_over_tcp(
    tmp_path: Path, etcd_endpoint: str, repo: Path
) -> None:
    """``--no-zmq-local`` (a proxy in front of the worker, say): no "local" in its record, and both the
    direct path and the router connect to its published endpoint."""
    with _one_worker_mesh(tmp_path, etcd_endpoint, repo, zmq_local=False) as (client, started):
        out = client.infer(MODEL, {"INPUT0": _x()}, direct=True)
        assert out["OUTPUT0"].shape == (4, 16) and client.stats.direct == 1
        route = client.route(MODEL)
        assert wire.FEATURE_LOCAL not in route.zmq_features and wire.FEATURE_BATCH in route.zmq_features
        links = client._client._direct.forwarder._links
        assert [link.address for link in links.values()] == [route.endpoint]
        assert _router_links(started[2]) == {route.worker_id: route.endpoint}


def test_the_route_is_asked_once_and_kept_at_most_its_ttl(cluster: Cluster) -> None:
    with cluster.client(route_ttl_s=1.0) as client:
        started = time.monotonic()
        for seed in range(5):
            client.infer(MODEL, {"INPUT0": _x(seed=seed)}, key="user-7", direct=True)
        elapsed = time.monotonic() - started
        assert client.stats.direct == 5
        assert client.stats.route_calls == 1 + int(elapsed // 1.0)  # once per second the route lives
    with cluster.client(route_ttl_s=0) as client:  # no caching: a Route per request
        for seed in range(3):
            client.infer(MODEL, {"INPUT0": _x(seed=seed)}, key="user-7", direct=True)
        assert client.stats.route_calls == 3
    with pytest.raises(InvalidArgument, match="at most"):  # a route may live 1 s at most
        cluster.client(route_ttl_s=60)


def test_direct_requests_are_counted_by_their_worker_for_the_breakers(
    cluster: Cluster, etcd_endpoint: str
) -> None:
    keys = Keyspace(cluster.prefix)
    with cluster.client() as client:
        worker = client.route(MODEL, "counted").worker_id
        key = keys.direct_stats(worker, MODEL)
        before = etcd_get(etcd_endpoint, key) or {"requests": 0, "client": 0}  # earlier tests' traffic
        for seed in range(7):
            client.infer(MODEL, {"INPUT0": _x(seed=seed)}, key="counted", direct=True)
        with pytest.raises(InvalidArgument):  # a client error: counted as such, never as the server's
            client.infer(MODEL, {"INPUT0": np.zeros((1, 3), np.float32)}, key="counted", direct=True)

    def window() -> dict | None:
        doc = etcd_get(etcd_endpoint, key)
        done = doc and doc["requests"] >= before["requests"] + 8 and doc["client"] >= before["client"] + 1
        return doc if done else None

    doc = wait_for(window, what=f"{key} with the direct requests")
    assert doc["worker"] == worker
    assert doc["timeout"] == doc["backend"] == doc["unavailable"] == 0


def test_the_health_service_reads_the_workers_direct_windows(cluster: Cluster, etcd_endpoint: str) -> None:
    """The consumer side of the boundary: a worker's window doc, as it writes it, raises a breaker."""
    keys = Keyspace(cluster.prefix)
    endpoint = etcd_endpoint
    model = f"direct-only-{uuid.uuid4().hex[:6]}"
    doc = {"worker": "w-x", "window_s": 30.0, "at": time.time(), "requests": 100, "timeout": 0,
           "resource": 0, "backend": 95, "unavailable": 0, "client": 0}  # fmt: skip
    etcd_put(endpoint, keys.direct_stats("w-x", model), doc)
    level = wait_for(lambda: (etcd_get(endpoint, keys.breaker(model)) or {}).get("level", 0), what="a level")
    assert level >= 1


def test_direct_requests_leave_coalesced_and_all_get_their_own_answer(cluster: Cluster, repo: Path) -> None:
    worker_of = {}

    async def run() -> list[tuple[np.ndarray, dict[str, np.ndarray]]]:
        async with AsyncMeshClient(cluster.router_addresses) as client:
            worker_of["w"] = (await client.route(MODEL, "burst")).worker_id
            xs = [_x(rows=1, seed=100 + i) for i in range(64)]
            outs = await asyncio.gather(
                *(client.infer(MODEL, {"INPUT0": x}, version="1", key="burst", direct=True) for x in xs)
            )
            assert client.stats.direct == 64 and client.stats.fallbacks == 0
            return list(zip(xs, outs, strict=True))

    before = metric(
        cluster.worker(_route_worker(cluster)).metrics_text(), "mcp_worker_coalesced_requests_total"
    )
    pairs = asyncio.run(run())
    for x, out in pairs:
        np.testing.assert_allclose(out["OUTPUT0"], mlp_reference(repo, MODEL, "1", x), rtol=1e-5, atol=1e-6)
    after = metric(cluster.worker(worker_of["w"]).metrics_text(), "mcp_worker_coalesced_requests_total")
    assert worker_of["w"] == _route_worker(cluster)
    assert after - before >= 32, "64 requests sent in one loop turn should leave coalesced"


def _route_worker(cluster: Cluster) -> str:
    with cluster.client() as client:
        return client.route(MODEL, "burst").worker_id


def test_a_request_the_worker_did_not_start_goes_through_the_router(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(async_client, "MAX_ROUTE_TTL_S", 60.0)  # the stale route must outlive the unload
    with cluster.client(route_ttl_s=60.0) as client:
        x = _x()
        client.infer(MODEL, {"INPUT0": x}, version="1", key="moved", direct=True)  # caches the route
        worker = cluster.worker(client.route(MODEL, "moved", version="1").worker_id)
        worker.control().Unload(worker_pb2.UnloadRequest(model=MODEL, version="1"), timeout=30)
        try:
            out = client.infer(MODEL, {"INPUT0": x}, version="1", key="moved", direct=True)
            assert out["OUTPUT0"].shape == (4, 16)
            # "not held here": not started, so the router served it
            assert (client.stats.fallbacks, client.stats.routed, client.stats.direct) == (1, 1, 1)
        finally:  # the scheduler puts the copy back; later tests want both
            wait_for(lambda: client.status(MODEL)[0].running("1") == 2, timeout_s=60, what="the copy back")


def test_routers_fail_over_when_one_cannot_be_reached(cluster: Cluster) -> None:
    dead = _free_address()
    with cluster.client([dead, *cluster.router_addresses]) as client:
        out = client.infer(MODEL, {"INPUT0": _x()})
        assert out["OUTPUT0"].shape == (4, 16)
        assert client.stats.failovers == 1
        client.infer(MODEL, {"INPUT0": _x()})  # stays on the router that answered
        assert client.stats.failovers == 1
        assert client.route(MODEL).worker_id
    with cluster.client([_free_address(), _free_address()], timeout=5) as client:
        with pytest.raises(Unavailable) as err:
            client.infer(MODEL, {"INPUT0": _x()})
        assert err.value.not_started and "no router could be reached" in err.value.message


def _answers(client: MeshClient) -> bool:
    try:
        client.infer(MODEL, {"INPUT0": _x(rows=1)})
    except MCPError:
        return False
    return True


def _received(port: int) -> bool:
    """Bytes wait unread in a listening process's socket on ``port`` (what ``ss`` shows as Recv-Q)."""
    done = subprocess.run(["ss", "-Htn", "state", "established", f"( sport = :{port} )"],
                          capture_output=True, text=True, timeout=10, check=True)  # fmt: skip
    return any(int(line.split()[0]) > 0 for line in done.stdout.splitlines() if line.strip())


def test_a_router_killed_holding_a_call_of_an_idempotent_model_is_sent_to_the_next(
    cluster: Cluster, tmp_path: Path, etcd_endpoint: str
) -> None:
    """The router has the request (frozen, then kill -9): the call broke after it reached the router.
    The SDK learns from Route that the model may run twice and sends it to the other router."""
    doomed = RouterProcess(tmp_path, etcd_endpoint, prefix=cluster.prefix).start()
    try:
        with cluster.client([doomed.endpoints["grpc"], cluster.router_addresses[1]]) as client:
            # routed calls only (no Route yet: the client learns the model's idempotency when it must)
            wait_for(lambda: _answers(client), what=f"{MODEL} routed by the new router")
            freeze(doomed.proc.pid)  # all its threads: one still running could read the request
            result: dict[str, object] = {}
            sender = threading.Thread(
                target=lambda: result.update(out=client.infer(MODEL, {"INPUT0": _x(1)}))
            )
            sender.start()
            port = int(doomed.endpoints["grpc"].rsplit(":", 1)[1])
            wait_for(lambda: _received(port), what="the request waiting at the frozen router")
            failovers = client.stats.failovers
            doomed.proc.kill()
            doomed.proc.wait(5)
            sender.join(30)
            assert "out" in result, "the call failed"
            # one Route asked (the model's idempotency, learned when needed), and it too moved on
            assert client.stats.route_calls == 1 and client.stats.failovers == failovers + 2
    finally:
        doomed.kill()


def test_errors_are_typed_on_both_paths(cluster: Cluster) -> None:
    with cluster.client() as client:
        for direct in (False, True):
            with pytest.raises(NotFound):
                client.infer("no-such-model", {"INPUT0": _x()}, direct=direct)
            with pytest.raises(InvalidArgument) as err:
                client.infer(MODEL, {"INPUT0": np.zeros((2, 5), np.float32)}, direct=direct)
            assert "INPUT0" in err.value.message
            with pytest.raises(InvalidArgument):
                client.infer(MODEL, {}, direct=direct)
            with pytest.raises(InvalidArgument):
                client.infer(MODEL, {"INPUT0": _x()}, direct=direct, outputs=["NOPE"])
        with pytest.raises(NotFound):
            client.route("no-such-model")
    with pytest.raises(InvalidArgument):
        MeshClient([])


@pytest.mark.parametrize(
    ("model", "resent"),
    [("demo-stateful", False), ("demo-slow", True)],  # idempotent: false / true in their model.yaml
)
def test_a_direct_request_whose_worker_dies_is_sent_again_only_if_idempotent(
    tmp_path: Path, etcd_endpoint: str, repo: Path, model: str, resent: bool
) -> None:
    with small_mesh(tmp_path, etcd_endpoint, repo, model, ["1"]) as mesh:
        address = mesh.router.endpoints["grpc"]
        with MeshClient(address, scheduler=mesh.scheduler.endpoints["grpc"], timeout=20) as client:
            client.infer(model, {"INPUT0": _x(rows=1)}, direct=True)  # link up, route cached
            outcome: dict[str, BaseException | None] = {}

            def send() -> None:
                try:
                    client.infer(model, {"INPUT0": _x(rows=1)}, direct=True)
                    outcome["error"] = None
                except BaseException as exc:
                    outcome["error"] = exc

            os.kill(mesh.worker.proc.pid, signal.SIGSTOP)  # it holds the request and cannot answer
            sender = threading.Thread(target=send)
            sender.start()
            wait_for(lambda: client.in_flight == 1, what="the request out to the worker")
            os.kill(mesh.worker.proc.pid, signal.SIGKILL)
            mesh.worker.proc.wait(5)
            sender.join(30)
            error = outcome["error"]
            assert isinstance(error, Unavailable), error
            assert client.stats.fallbacks == 0 and client.stats.resends == int(resent)
            if resent:  # sent once more through the router, which has no other copy to give it
                assert "may have started" not in error.message and client.stats.routed == 0
            else:
                assert "may have started" in error.message and "not idempotent" in error.message


@contextmanager
def _one_worker_mesh(
    tmp: Path, etcd: str, repo: Path, **worker_flags: object
) -> Iterator[tuple[MeshClient, list]]:
    """A worker (``worker_flags``), a scheduler and a router on a fresh prefix, MODEL loaded and routed,
    and a client; the processes (worker first) for the test to kill or add to; all stopped after."""
    prefix = f"/t{uuid.uuid4().hex[:8]}/mcp"
    started: list = []
    try:
        started.append(WorkerProcess(tmp, etcd, repo, prefix=prefix, **worker_flags).start())
        started.append(SchedulerProcess(tmp, etcd, prefix=prefix).start())
        started.append(RouterProcess(tmp, etcd, prefix=prefix).start())
        with MeshClient(started[2].endpoints["grpc"], scheduler=started[1].endpoints["grpc"]) as client:
            client.load(MODEL, ["1"], replicas=1)
            wait_for(lambda: _routable(client), what=f"{MODEL} routed")
            yield client, started
    finally:
        for proc in reversed(started):
            proc.stop()


@pytest.mark.parametrize("local", [True, False], ids=["same-host endpoint", "tcp"])
def test_the_direct_path_speaks_curve_to_a_worker_that_requires_it(
    tmp_path: Path, etcd_endpoint: str, repo: Path, local: bool
) -> None:
    """Over the same-host endpoint and over TCP (what other hosts use), with the worker's CURVE key."""
    _, secret_file = zmq.auth.create_certificates(str(tmp_path), "worker")
    server_public, _ = zmq.auth.load_certificate(secret_file)
    flags = {"zmq_curve_secret_key_file": secret_file, "zmq_local": local}
    with _one_worker_mesh(tmp_path, etcd_endpoint, repo, **flags) as (client, _):
        route = client.route(MODEL)
        assert route.curve_public_key == server_public.decode()
        x = _x()
        out = client.infer(MODEL, {"INPUT0": x}, direct=True)
        np.testing.assert_allclose(out["OUTPUT0"], mlp_reference(repo, MODEL, "1", x), rtol=1e-5, atol=1e-6)
        # without the key the handshake would never complete and the request would go by the router
        assert (client.stats.direct, client.stats.fallbacks) == (1, 0)
        [link] = client._client._direct.forwarder._links.values()
        assert link.address.startswith("ipc://@mcpmesh-" if local else "tcp://127.0.0.1:")


def _keys_on_two_workers(client: MeshClient) -> tuple[str, str]:
    """Two routing keys whose requests go to different workers."""
    first = client.route(MODEL, "k0", version="1").worker_id
    for i in range(1, 200):
        if client.route(MODEL, f"k{i}", version="1").worker_id != first:
            return "k0", f"k{i}"
    raise AssertionError("every key maps to one worker")


def test_a_link_with_requests_in_flight_stays_open_when_its_routes_go(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Routes are dropped on any failure; the link they named must not close under requests still out."""
    monkeypatch.setattr(async_client, "MAX_ROUTE_TTL_S", 60.0)
    with cluster.client(route_ttl_s=60.0) as client:
        key_a, key_b = _keys_on_two_workers(client)
        worker_a = cluster.worker(client.route(MODEL, key_a, version="1").worker_id)
        client.infer(MODEL, {"INPUT0": _x()}, version="1", key=key_a, direct=True)  # link to A up
        outcome: dict[str, object] = {}
        os.kill(worker_a.proc.pid, signal.SIGSTOP)  # A holds the next request (well inside its heartbeat)
        try:
            sender = threading.Thread(
                target=lambda: outcome.update(
                    out=client.infer(MODEL, {"INPUT0": _x()}, version="1", key=key_a, direct=True)
                )
            )
            sender.start()
            wait_for(lambda: client.in_flight == 1, what="the request out to A")
            client._client._routes.forget(MODEL)  # what a failed request of another key does to the cache
            client.infer(MODEL, {"INPUT0": _x()}, version="1", key=key_b, direct=True)  # opens B's link
        finally:
            os.kill(worker_a.proc.pid, signal.SIGCONT)
        sender.join(30)
        assert outcome["out"]["OUTPUT0"].shape == (4, 16)  # answered by A over the link kept open
        assert client.stats.fallbacks == 0 and client.stats.direct == 3


def test_closing_a_client_ends_its_running_calls(cluster: Cluster) -> None:
    client = cluster.client()
    worker = cluster.worker(client.route(MODEL, "closing", version="1").worker_id)
    client.infer(MODEL, {"INPUT0": _x()}, version="1", key="closing", direct=True)
    outcome: dict[str, BaseException] = {}

    def send() -> None:
        try:
            client.infer(MODEL, {"INPUT0": _x()}, version="1", key="closing", direct=True)
        except BaseException as exc:
            outcome["error"] = exc

    os.kill(worker.proc.pid, signal.SIGSTOP)
    try:
        sender = threading.Thread(target=send)
        sender.start()
        wait_for(lambda: client.in_flight == 1, what="the request out")
        client.close()
        sender.join(10)
        assert not sender.is_alive()
    finally:
        os.kill(worker.proc.pid, signal.SIGCONT)
    assert isinstance(outcome["error"], Unavailable) and "closed" in outcome["error"].message
    with pytest.raises(Unavailable, match="closed"):
        client.infer(MODEL, {"INPUT0": _x()})
    client.close()  # twice is fine


def test_bad_arguments_are_invalid_argument_before_anything_is_sent(cluster: Cluster) -> None:
    with cluster.client() as client:
        x = _x()
        for kwargs in (
            {"priority": -1}, {"priority": 2**40}, {"priority": "high"}, {"version": 3}, {"key": 5},
            {"timeout": 0}, {"timeout": -1.0}, {"outputs": "OUTPUT0"},
        ):  # fmt: skip
            with pytest.raises(InvalidArgument):
                client.infer(MODEL, {"INPUT0": x}, direct=True, **kwargs)
        with pytest.raises(InvalidArgument):
            client.infer(MODEL, {7: x})
        with pytest.raises(InvalidArgument):
            client.infer(MODEL, {"INPUT0": np.array([object()])})
        assert client.stats.route_calls == 0 and client.stats.routed == 0


def test_direct_requests_past_their_deadline_raise_the_breaker(cluster: Cluster, etcd_endpoint: str) -> None:
    """Producer and consumer for real: direct requests to a slow model that time out are counted by its
    worker as timeouts, and the health service raises the model's breaker from that window alone."""
    keys = Keyspace(cluster.prefix)
    with cluster.client() as client:
        client.load("demo-slow", ["1"], replicas=1)
        wait_for(lambda: _routable_model(client, "demo-slow"), what="demo-slow routed")
        for seed in range(25):  # demo-slow takes 50 ms; each request gives it 10
            with pytest.raises(DeadlineExceeded):
                client.infer("demo-slow", {"INPUT0": _x(rows=1, seed=seed)}, timeout=0.01, direct=True)
        assert client.stats.routed == 0
        windows = [keys.direct_stats(w.worker_id, "demo-slow") for w in cluster.workers]
        wait_for(
            lambda: sum((etcd_get(etcd_endpoint, k) or {}).get("timeout", 0) for k in windows) >= 20,
            what="the timeouts in the worker's direct window",
        )
        level = wait_for(
            lambda: (etcd_get(etcd_endpoint, keys.breaker("demo-slow")) or {}).get("level", 0),
            timeout_s=20,
            what="demo-slow's breaker raised",
        )
        assert level >= 1
        client.unload("demo-slow")


def _routable_model(client: MeshClient, model: str) -> bool:
    try:
        client.route(model)
    except MCPError:
        return False
    return True


def test_keyless_direct_requests_spread_over_every_copy(cluster: Cluster) -> None:
    """Without a key one Route answer names every copy that may take it (RouteRequest.candidates), and
    each request goes to the one with the fewest of this client's requests in flight."""

    def served() -> dict[str, float]:
        return {
            w.worker_id: metric(w.metrics_text(), "mcp_requests_total", model=MODEL, api_version="zmq")
            for w in cluster.workers
        }

    async def run() -> ClientStats:
        async with AsyncMeshClient(cluster.router_addresses) as client:
            for _ in range(4):
                await asyncio.gather(
                    *(
                        client.infer(MODEL, {"INPUT0": _x(rows=1, seed=i)}, version="1", direct=True)
                        for i in range(32)
                    )
                )
            return client.stats

    before = served()
    stats = asyncio.run(run())
    after = served()
    assert stats.direct == 128 and stats.fallbacks == 0 and stats.route_calls == 1
    assert all(after[w] - before[w] >= 16 for w in after), (before, after)


def test_a_worker_restarted_under_its_id_is_reached_at_its_new_endpoint(
    tmp_path: Path, etcd_endpoint: str, repo: Path
) -> None:
    """kill -9, then the same worker id again on a new port: the cached route and the old link go, the
    next route names the new incarnation, and direct requests reach it."""
    with _one_worker_mesh(tmp_path, etcd_endpoint, repo, worker_id="w-same") as (client, started):
        before = client.route(MODEL)
        client.infer(MODEL, {"INPUT0": _x()}, direct=True)
        started[0].kill()
        prefix = started[0].prefix
        started.append(
            WorkerProcess(tmp_path, etcd_endpoint, repo, prefix=prefix, worker_id="w-same").start()
        )

        def moved() -> bool:
            try:
                route = client.route(MODEL)
            except MCPError:
                return False
            return route.incarnation != before.incarnation and route.endpoint != before.endpoint

        wait_for(moved, timeout_s=60, what="the new incarnation routed")
        direct = client.stats.direct
        out = wait_for(lambda: _direct_answer(client), timeout_s=10, what="a direct answer")
        assert out["OUTPUT0"].shape == (4, 16) and client.stats.direct > direct


def test_a_worker_restarted_at_the_same_endpoint_is_reached_at_its_new_local_name(
    tmp_path: Path, etcd_endpoint: str, repo: Path
) -> None:
    """kill -9, then the same worker id on the same port (a fixed port, as compose's): only the
    incarnation changes, and so does the same-host name; the SDK's link follows it and direct requests
    reach the new process, not the old name nobody listens on any more."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    flags = {"worker_id": "w-port", "zmq_bind": f"tcp://127.0.0.1:{port}"}
    with _one_worker_mesh(tmp_path, etcd_endpoint, repo, **flags) as (client, started):
        before = client.route(MODEL)
        client.infer(MODEL, {"INPUT0": _x()}, direct=True)
        started[0].kill()
        started.append(
            WorkerProcess(tmp_path, etcd_endpoint, repo, prefix=started[0].prefix, **flags).start()
        )

        def restarted() -> bool:
            try:
                route = client.route(MODEL)
            except MCPError:
                return False
            return route.incarnation != before.incarnation

        wait_for(restarted, timeout_s=60, what="the new incarnation routed")
        assert client.route(MODEL).endpoint == before.endpoint
        out = wait_for(lambda: _direct_answer(client), timeout_s=10, what="a direct answer")
        assert out["OUTPUT0"].shape == (4, 16)
        [link] = client._client._direct.forwarder._links.values()
        route = client.route(MODEL)
        assert link.address == wire.local_endpoint("w-port", route.incarnation, route.endpoint)


def _direct_answer(client: MeshClient) -> dict[str, np.ndarray] | None:
    """A direct request's answer, or None when it went by the router (a stale route was just dropped)."""
    direct = client.stats.direct
    out = client.infer(MODEL, {"INPUT0": _x()}, direct=True)
    return out if client.stats.direct > direct else None
