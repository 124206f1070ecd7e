"""Fencing: a deposed leader's etcd writes and worker calls take no effect (real etcd, real processes).

The leader that is deposed here is one frozen past its lease: its token (the leader key's revision when
it won) is what it acts with when it runs again, before it notices. The deterministic tests hand that
token to the real reconciler and detector; the process test freezes a real scheduler with SIGSTOP.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import time
import uuid
from dataclasses import replace

import pytest
from harness import (
    HealthProcess,
    SchedulerProcess,
    WorkerProcess,
    etcd_get,
    load_and_run,
    metric,
    wait_for,
)

from mcp_health.alerts import Alerter
from mcp_health.detector import Detector, WorkerSeen
from mcp_scheduler.config import SchedulerConfig
from mcp_scheduler.reconciler import Reconciler
from mcp_scheduler.state import ClusterState
from mcp_scheduler.worker_client import WorkerClients
from mcpapi.v2 import control_pb2, control_pb2_grpc, model_pb2, worker_pb2
from mcpcore.errors import FailedPrecondition, InvalidArgument
from mcpcore.etcd_store import EtcdStore
from mcpcore.fencing import FENCE_METADATA, Fence, FenceCheck
from mcpcore.keys import Keyspace
from mcpcore.lifecycle import ReplicaLifecycle
from mcpcore.mirror import PrefixMirror
from mcpcore.store import Compare, Put


async def _expiring_leader(store: EtcdStore, keys: Keyspace, role: str) -> Fence:
    """Win ``role``'s election key on a 1 s lease that nobody refreshes: a leader frozen from now on."""
    lease = await store.grant_lease(1)
    key = keys.leader(role)
    won = await store.txn([Compare(key, 0)], [Put(key, b"frozen-leader", lease.id)])
    assert won.succeeded
    return Fence(role, key, won.revision)


async def _until(predicate, timeout_s: float = 20.0, what: str = "condition"):  # type: ignore[no-untyped-def]
    """Poll ``predicate`` (plain or async) until it returns something true."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.05)


def _spec(model: str, version: str) -> model_pb2.ModelSpec:
    return model_pb2.ModelSpec(model=model, versions=[version])


def _fence_metadata(fence: Fence) -> tuple[tuple[str, str], ...]:
    return ((FENCE_METADATA, f"{fence.role}:{fence.revision}"),)


async def test_a_deposed_schedulers_writes_and_worker_calls_change_nothing(tmp_path, etcd_endpoint, repo):
    prefix = f"/t{uuid.uuid4().hex[:8]}/mcp"
    keys = Keyspace(prefix)
    async with EtcdStore([etcd_endpoint]) as store:
        stale = await _expiring_leader(store, keys, "scheduler")
        worker = WorkerProcess(tmp_path, etcd_endpoint, repo, prefix=prefix).start()
        leader = SchedulerProcess(tmp_path, etcd_endpoint, prefix=prefix, leader_ttl_s=1).start()
        state = ClusterState(store, keys)
        clients = WorkerClients(timeout_s=10, retries=0)
        try:
            control = control_pb2_grpc.ModelControlStub(leader.channel())
            # the real scheduler takes over once the frozen leader's lease is gone, and acts
            await asyncio.to_thread(
                control.LoadModel,
                control_pb2.LoadModelRequest(spec=model_pb2.ModelSpec(model="demo-mlp", versions=["1"])),
                timeout=60,
            )
            await state.start()
            await _until(lambda: state.raw(keys.model_routing("demo-mlp")) is not None, what="routing")
            routing_before = state.raw(keys.model_routing("demo-mlp"))

            # the frozen leader runs again, with the view it had: demo-mlp has no spec, so unload it
            fenced: list[str] = []
            old = Reconciler(
                state, store, keys, clients, SchedulerConfig(scheduler_id="frozen-leader"),
                is_leader=lambda: True, fence=lambda: stale, on_fenced=fenced.append,
            )  # fmt: skip
            stale_view = replace(state.view(), specs={}, traffic={})
            planned = await old.reconcile_once(stale_view)
            kinds = {type(a).__name__ for a in planned.actions}
            assert {"UnloadReplica", "PublishRouting"} <= kinds  # it did try both
            await _until(lambda: not old._running, what="the old leader's actions")

            assert "routing" in fenced  # etcd refused the routing delete: the compare on its key failed
            assert (await store.get(keys.model_routing("demo-mlp"))).value == routing_before
            stats = worker.control().Stats(worker_pb2.StatsRequest(model="demo-mlp"), timeout=5)
            assert [(m.model, model_pb2.ModelState.Name(m.state)) for m in stats.models] == [
                ("demo-mlp", "RUNNING")
            ]  # the worker refused the Unload
            refused = metric(worker.metrics_text(), "mcp_worker_fenced_calls_total", role="scheduler")
            assert refused == 1
            # the leader's own calls pass the same check: it still loads and unloads
            await asyncio.to_thread(
                control.UnloadModel, control_pb2.UnloadModelRequest(model="demo-mlp"), timeout=60
            )
            stats = worker.control().Stats(worker_pb2.StatsRequest(model="demo-mlp"), timeout=5)
            assert list(stats.models) == []
        finally:
            await clients.close()
            await state.stop()
            leader.stop()
            worker.stop()


async def test_a_deposed_health_leader_marks_nothing_and_stops_no_worker(tmp_path, etcd_endpoint, repo):
    prefix = f"/t{uuid.uuid4().hex[:8]}/mcp"
    keys = Keyspace(prefix)
    async with EtcdStore([etcd_endpoint]) as store:
        stale = await _expiring_leader(store, keys, "health")
        worker = WorkerProcess(tmp_path, etcd_endpoint, repo, prefix=prefix).start()
        health = HealthProcess(tmp_path, etcd_endpoint, prefix=prefix, leader_ttl_s=1).start()
        mirror = PrefixMirror(store, prefix + "/")
        try:
            load_and_run(worker.control(), "demo-mlp")
            await _until(lambda: _leads(store, keys, "health", health.health_id), what="health takes over")
            await mirror.start()
            rid_key = keys.replica("demo-mlp", "1", worker.worker_id)
            await _until(lambda: rid_key in mirror.values, what="the replica record")
            before = await store.get(rid_key)

            errors: list[str] = []
            old = Detector(
                mirror, keys, ReplicaLifecycle(store, keys), Alerter(webhook_url=""),
                report_timeout_s=5, sick_errors=1, worker_timeout_s=5, fence=lambda: stale,
                on_error=errors.append,
            )  # fmt: skip
            # its stale view: the worker's reports stopped (so it is dead), and it is sick
            record = await store.get(keys.worker(worker.worker_id))
            guard = Compare(keys.worker(worker.worker_id), record.mod_revision)
            await old._dead(worker.worker_id, "no load report (stale view)", guard)
            assert (await store.get(rid_key)).mod_revision == before.mod_revision  # not marked ERROR
            seen = WorkerSeen(worker.worker_id, grpc=worker.endpoints["grpc"])
            await old._emergency_stop(seen, "sick (stale view)")
            assert errors == ["emergency_stop"] and not seen.emergency_sent
            stats = worker.control().Stats(worker_pb2.StatsRequest(), timeout=5)
            assert [model_pb2.ModelState.Name(m.state) for m in stats.models] == ["RUNNING"]
            assert metric(worker.metrics_text(), "mcp_worker_fenced_calls_total", role="health") == 1
            await old.close()
        finally:
            await mirror.stop()
            health.stop()
            worker.stop()


async def _leads(store: EtcdStore, keys: Keyspace, role: str, candidate: str) -> bool:
    kv = await store.get(keys.leader(role))
    return kv is not None and kv.value.decode() == candidate


async def test_the_workers_fence_check(etcd_endpoint, key_prefix):
    keys = Keyspace(key_prefix.rstrip("/"))
    async with EtcdStore([etcd_endpoint]) as store:
        refused: list[str] = []
        check = FenceCheck(store, keys, on_refused=refused.append)
        await check.check([], "Load")  # no token: an operator's call
        await check.check([("other", "x")], "Load")
        first = await _expiring_leader(store, keys, "scheduler")
        await check.check(_fence_metadata(first), "Load")
        assert check.highest == {"scheduler": first.revision}
        await store.delete(first.key)  # that leader is gone (its lease expired)
        second = await _expiring_leader(store, keys, "scheduler")
        with pytest.raises(FailedPrecondition, match="no longer leads"):
            await check.check(_fence_metadata(first), "Unload demo-mlp/1")
        await check.check(_fence_metadata(second), "Load")
        with pytest.raises(FailedPrecondition, match="no longer leads"):
            await check.check([(FENCE_METADATA, f"scheduler:{second.revision - 1}")], "Load")
        # etcd restored from an older snapshot: a lower revision that etcd confirms is the leader now
        check.highest["scheduler"] = second.revision + 1000
        await check.check(_fence_metadata(second), "Load")
        assert check.highest["scheduler"] == second.revision
        assert refused == ["scheduler", "scheduler"]
        with pytest.raises(InvalidArgument, match="expected '<role>:<revision>'"):
            await check.check([(FENCE_METADATA, "router:12")], "Load")
        with pytest.raises(InvalidArgument):
            await check.check([(FENCE_METADATA, "scheduler:-1")], "Load")

    # etcd unreachable: only a token not lower than the highest seen passes
    async with EtcdStore(["127.0.0.1:1"], timeout=0.2) as away:
        offline = FenceCheck(away, keys, timeout_s=0.3)
        offline.highest["scheduler"] = 50
        await offline.check([(FENCE_METADATA, "scheduler:50")], "Load")
        with pytest.raises(FailedPrecondition, match="newer scheduler leader"):
            await offline.check([(FENCE_METADATA, "scheduler:49")], "Load")


def test_a_scheduler_frozen_past_its_lease_changes_nothing_when_it_runs_again(tmp_path, etcd_endpoint, repo):
    prefix = f"/t{uuid.uuid4().hex[:8]}/mcp"
    keys = Keyspace(prefix)
    worker = WorkerProcess(tmp_path, etcd_endpoint, repo, prefix=prefix).start()
    schedulers = [
        SchedulerProcess(
            tmp_path, etcd_endpoint, prefix=prefix, leader_ttl_s=1, reconcile_interval_s=0.2
        ).start()
        for _ in range(2)
    ]
    frozen = None
    try:
        leader_id = wait_for(lambda: etcd_get_raw(etcd_endpoint, keys.leader("scheduler")), what="a leader")
        old = next(s for s in schedulers if s.scheduler_id == leader_id)
        new = next(s for s in schedulers if s is not old)
        stub = control_pb2_grpc.ModelControlStub(old.channel())
        stub.LoadModel(
            control_pb2.LoadModelRequest(spec=model_pb2.ModelSpec(model="demo-mlp", versions=["1"])),
            timeout=60,
        )
        os.kill(old.proc.pid, signal.SIGSTOP)
        frozen = old
        wait_for(
            lambda: etcd_get_raw(etcd_endpoint, keys.leader("scheduler")) == new.scheduler_id,
            timeout_s=15,
            what="the standby takes over",
        )
        # the new leader acts while the old one is frozen: demo-mlp goes, demo-onnx comes
        new_stub = control_pb2_grpc.ModelControlStub(new.channel())
        new_stub.UnloadModel(control_pb2.UnloadModelRequest(model="demo-mlp"), timeout=60)
        new_stub.LoadModel(
            control_pb2.LoadModelRequest(spec=model_pb2.ModelSpec(model="demo-onnx", versions=["2"])),
            timeout=60,
        )
        os.kill(old.proc.pid, signal.SIGCONT)
        frozen = None
        wait_for(
            lambda: metric(old.metrics_text(), "mcp_scheduler_leader_ratio") == 0,
            what="the old leader stepped down",
        )
        time.sleep(1.0)  # not a readiness wait: the window in which a stale leader could still act
        held = worker.control().Stats(worker_pb2.StatsRequest(), timeout=5)
        assert sorted((m.model, model_pb2.ModelState.Name(m.state)) for m in held.models) == [
            ("demo-onnx", "RUNNING")
        ]
        assert etcd_get(etcd_endpoint, keys.model_spec("demo-mlp")) is None
        assert etcd_get(etcd_endpoint, keys.model_routing("demo-mlp")) is None
        assert etcd_get(etcd_endpoint, keys.model_routing("demo-onnx")) == {"stable": "2"}
        assert etcd_get_raw(etcd_endpoint, keys.leader("scheduler")) == new.scheduler_id
        print(
            "old leader fenced writes:",
            metric(old.metrics_text(), "mcp_scheduler_fenced_writes_total"),
            "worker fenced calls:",
            metric(worker.metrics_text(), "mcp_worker_fenced_calls_total"),
        )
    finally:
        if frozen is not None:
            os.kill(frozen.proc.pid, signal.SIGCONT)
        for proc in (*schedulers, worker):
            proc.stop()


def etcd_get_raw(endpoint: str, key: str) -> str | None:
    async def read() -> str | None:
        async with EtcdStore([endpoint]) as store:
            kv = await store.get(key)
            return None if kv is None else kv.value.decode()

    return asyncio.run(read())
