"""The health service against real etcd and real worker processes: failover marks, alerts, breaker levels."""

from __future__ import annotations

import itertools
import os
import signal
import time
import uuid

import grpc
import pytest
from harness import (
    HealthProcess,
    WorkerProcess,
    etcd_get,
    etcd_put,
    load_and_run,
    wait_for,
)
from webhook_receiver import WebhookReceiver

from mcpapi.v2 import health_pb2, health_pb2_grpc
from mcpcore.keys import Keyspace

TTL = 2


def replica_state(endpoint: str, keys: Keyspace, model: str, worker: str) -> str:
    return (etcd_get(endpoint, keys.replica(model, "1", worker)) or {}).get("state", "")


@pytest.fixture
def receiver():
    with WebhookReceiver() as r:
        yield r


@pytest.fixture
def prefix():
    return f"/t{uuid.uuid4().hex[:8]}/mcp"


@pytest.fixture
def health(tmp_path, etcd_endpoint, prefix, receiver):
    proc = HealthProcess(
        tmp_path,
        etcd_endpoint,
        prefix=prefix,
        check_interval_s=0.1,
        report_timeout_s=5,
        alert_webhook=receiver.url,
    ).start()
    yield proc
    proc.stop()


def worker_alerts(receiver: WebhookReceiver, worker: str) -> list[dict]:
    return [a for body in receiver.accepted for a in body if a["labels"].get("worker") == worker]


def test_kill_9_marks_replicas_error_within_the_ttl_and_alerts(
    tmp_path, etcd_endpoint, repo, prefix, health, receiver
):
    worker = WorkerProcess(
        tmp_path, etcd_endpoint, repo, prefix=prefix, lease_ttl_s=TTL, heartbeat_interval_s=0.3
    ).start()
    try:
        load_and_run(worker.control(), "demo-mlp")
        load_and_run(worker.control(), "demo-onnx")
        keys = Keyspace(prefix)
        killed = time.monotonic()
        worker.kill()
        for model in ("demo-mlp", "demo-onnx"):
            wait_for(
                lambda m=model: replica_state(etcd_endpoint, keys, m, worker.worker_id) == "ERROR",
                timeout_s=TTL + 3, interval_s=0.05, what=f"{model} marked ERROR",
            )  # fmt: skip
        detected_after = time.monotonic() - killed
        record = etcd_get(etcd_endpoint, keys.replica("demo-mlp", "1", worker.worker_id))
        assert f"worker {worker.worker_id} is dead" in record["reason"] and "last active" in record["reason"]
        receiver.wait_for(lambda posts: bool(worker_alerts(receiver, worker.worker_id)), timeout=5)
        [alert] = worker_alerts(receiver, worker.worker_id)
        assert alert["labels"]["alertname"] == "WorkerDown"
        assert (
            "demo-mlp/1@" in alert["annotations"]["replicas"]
            and "demo-onnx/1@" in alert["annotations"]["replicas"]
        )
        assert float(alert["annotations"]["last_active_unix"]) > 0 and alert["annotations"][
            "last_active"
        ].endswith("Z")
        print(f"detected {detected_after:.2f}s after kill -9 (lease TTL {TTL}s)")
    finally:
        worker.stop()


def test_a_stopped_worker_is_detected_and_recovers_when_resumed(
    tmp_path, etcd_endpoint, repo, prefix, health, receiver
):
    worker = WorkerProcess(
        tmp_path, etcd_endpoint, repo, prefix=prefix, lease_ttl_s=TTL, heartbeat_interval_s=0.3
    ).start()
    keys = Keyspace(prefix)
    try:
        load_and_run(worker.control(), "demo-mlp")
        os.kill(worker.proc.pid, signal.SIGSTOP)
        wait_for(
            lambda: replica_state(etcd_endpoint, keys, "demo-mlp", worker.worker_id) == "ERROR",
            timeout_s=TTL + 3, interval_s=0.05, what="replica marked ERROR while the worker is stopped",
        )  # fmt: skip
        os.kill(worker.proc.pid, signal.SIGCONT)
        wait_for(
            lambda: etcd_get(etcd_endpoint, keys.worker(worker.worker_id)),
            timeout_s=10,
            what="re-registration",
        )
        wait_for(
            lambda: replica_state(etcd_endpoint, keys, "demo-mlp", worker.worker_id) == "RUNNING",
            timeout_s=10, what="the replica's real state published again",
        )  # fmt: skip
        stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(health.endpoints["grpc"]))
        report = wait_for(
            lambda: (
                (r := stub.ClusterHealth(health_pb2.ClusterHealthRequest(), timeout=5))
                and any(w.worker_id == worker.worker_id and w.alive for w in r.workers)
                and r
            ),
            what="the worker alive again in ClusterHealth",
        )
        assert any(s.count >= 1 for s in report.replicas_by_state)
    finally:
        os.kill(worker.proc.pid, signal.SIGCONT)
        worker.stop()


def _window(endpoint: str, keys: Keyspace, model: str, router: str = "r1", **counts: float) -> None:
    doc = {"router": router, "window_s": 30.0, "at": time.time(), "requests": 100, "timeout": 0,
           "resource": 0, "backend": 0, "unavailable": 0, "client": 0, **counts}  # fmt: skip
    etcd_put(endpoint, keys.stats(router, model), doc)


def _level(endpoint: str, keys: Keyspace, model: str) -> int:
    return (etcd_get(endpoint, keys.breaker(model)) or {}).get("level", 0)


def test_error_rates_raise_breaker_levels_and_cool_down_steps_them_down(etcd_endpoint, prefix, health):
    keys = Keyspace(prefix)
    policy = {"levels": [{"threshold": 0.3, "action": "reduce_batch_size", "params": {"ratio": 0.5}},
                         {"threshold": 0.6, "action": "disable_secondary_features", "params": {}},
                         {"threshold": 0.9, "action": "fallback_to_static", "params": {"version": "1"}}],
              "metrics_window": "30s", "cool_down": "1s"}  # fmt: skip
    etcd_put(etcd_endpoint, keys.breaker_config(), policy)
    _window(etcd_endpoint, keys, "m", client=95)  # client errors alone never open a breaker
    time.sleep(0.5)  # several checks run (at 0.1 s): give them the chance to get it wrong
    assert _level(etcd_endpoint, keys, "m") == 0
    for errors, level in ((35, 1), (65, 2), (95, 3)):
        _window(etcd_endpoint, keys, "m", timeout=errors)
        wait_for(lambda lv=level: _level(etcd_endpoint, keys, "m") == lv, what=f"level {level}")
    doc = etcd_get(etcd_endpoint, keys.breaker("m"))
    assert doc["set_by"] == "health" and "0.95" in doc["reason"]
    _window(etcd_endpoint, keys, "m")  # healthy again: down one level per cool-down
    seen, changes = [3], [time.monotonic()]
    while seen[-1] > 0:
        level = wait_for(
            lambda: (lv := _level(etcd_endpoint, keys, "m")) != seen[-1] and str(lv),
            timeout_s=5,
            interval_s=0.02,
        )
        seen.append(int(level))
        changes.append(time.monotonic())
        _window(etcd_endpoint, keys, "m")  # keep the window fresh
    assert seen == [3, 2, 1, 0]
    assert all(b - a >= 0.9 for a, b in itertools.pairwise(changes))  # each step waited a cool-down


def test_router_windows_count_from_their_arrival_whatever_the_routers_clock(etcd_endpoint, prefix, health):
    """A router whose clock runs 2 minutes behind is heard; one 2 minutes ahead stops counting once it
    stops writing (freshness is measured here, from when each window arrived)."""
    keys = Keyspace(prefix)
    policy = {"levels": [{"threshold": 0.3, "action": "reduce_batch_size", "params": {"ratio": 0.5}},
                         {"threshold": 0.6, "action": "disable_secondary_features", "params": {}},
                         {"threshold": 0.9, "action": "fallback_to_static", "params": {"version": "1"}}],
              "metrics_window": "2s", "cool_down": "1s"}  # fmt: skip
    etcd_put(etcd_endpoint, keys.breaker_config(), policy)
    for model, skew in (("behind", -120.0), ("ahead", 120.0)):
        _window(etcd_endpoint, keys, model, "skewed", timeout=95, at=time.time() + skew)
        wait_for(lambda m=model: _level(etcd_endpoint, keys, m) == 3, what=f"{model}: level 3")
    # the skewed router stops writing; a healthy one goes on: once the old window is a window old, only
    # the healthy one counts, and the levels come down
    deadline = time.monotonic() + 20
    while (_level(etcd_endpoint, keys, "behind"), _level(etcd_endpoint, keys, "ahead")) != (0, 0):
        assert time.monotonic() < deadline, "the stale windows still count"
        for model in ("behind", "ahead"):
            _window(etcd_endpoint, keys, model, "healthy")
        time.sleep(0.2)  # the healthy router's reporting period, not a synchronisation


def test_an_operators_forced_level_wins_until_it_expires(etcd_endpoint, prefix, health):
    keys = Keyspace(prefix)
    until = time.time() + 2
    etcd_put(
        etcd_endpoint, keys.breaker("n"), {"level": 1, "set_by": "alice", "reason": "drill", "until": until}
    )
    _window(etcd_endpoint, keys, "n", timeout=95)
    time.sleep(0.5)  # checks run every 0.1 s; the forced level must hold through them
    assert etcd_get(etcd_endpoint, keys.breaker("n"))["set_by"] == "alice"
    wait_for(lambda: _window(etcd_endpoint, keys, "n", timeout=95) or _level(etcd_endpoint, keys, "n") == 3,
             timeout_s=6, what="health taking over after the expiry")  # fmt: skip
    assert time.time() >= until
    assert etcd_get(etcd_endpoint, keys.breaker("n"))["set_by"] == "health"


def test_an_invalid_policy_is_rejected_and_the_last_good_one_stays(etcd_endpoint, prefix, health):
    keys = Keyspace(prefix)
    etcd_put(etcd_endpoint, keys.breaker_config(), b'{"levels": [{"threshold": 2}]')
    wait_for(
        lambda: 'mcp_config_rejected_total{key="breaker_policy"} 1.0' in health.metrics_text(),
        what="rejection",
    )
    _window(etcd_endpoint, keys, "p", timeout=35)
    wait_for(lambda: _level(etcd_endpoint, keys, "p") == 1, what="the default policy still in force")


def test_a_sick_worker_gets_an_emergency_stop(tmp_path, etcd_endpoint, repo, prefix, health, receiver):
    """Backend faults in a worker's reports (here written for it) make health stop it through its API."""
    worker = WorkerProcess(
        tmp_path, etcd_endpoint, repo, prefix=prefix, lease_ttl_s=20, heartbeat_interval_s=8
    ).start()
    keys = Keyspace(prefix)
    try:
        load_and_run(worker.control(), "demo-mlp")
        report = etcd_get(etcd_endpoint, keys.worker_load(worker.worker_id))
        wait_for(
            lambda: any(w.worker_id == worker.worker_id for w in _cluster(health).workers),
            what="health sees it",
        )
        for errors in (0, 500):  # two reports, one check apart: 500 requests failed in between
            etcd_put(
                etcd_endpoint,
                keys.worker_load(worker.worker_id),
                {**report, "last_beat": time.time(), "exec_errors_total": errors},
            )
            time.sleep(0.3)  # checks run every 0.1 s: let one see this report
        wait_for(
            lambda: replica_state(etcd_endpoint, keys, "demo-mlp", worker.worker_id) == "ERROR",
            timeout_s=10, what="the worker emergency-stopped",
        )  # fmt: skip
        record = etcd_get(etcd_endpoint, keys.replica("demo-mlp", "1", worker.worker_id))
        assert "emergency stop: health: 500 requests failed" in record["reason"]
        receiver.wait_for(
            lambda posts: any(a["labels"]["alertname"] == "WorkerSick" for a in _alerts(receiver)), timeout=5
        )
    finally:
        worker.stop()


def _cluster(health: HealthProcess) -> health_pb2.ClusterHealthResponse:
    stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(health.endpoints["grpc"]))
    return stub.ClusterHealth(health_pb2.ClusterHealthRequest(), timeout=5)


def _alerts(receiver: WebhookReceiver) -> list[dict]:
    return [a for body in receiver.accepted for a in body]
