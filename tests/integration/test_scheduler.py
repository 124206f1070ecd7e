"""A real scheduler (and a standby) with real worker subprocesses against a real etcd."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import uuid

import grpc
import numpy as np
import pytest
from harness import (
    HealthProcess,
    SchedulerProcess,
    TensorClient,
    WorkerProcess,
    etcd_get,
    etcd_put,
    wait_for,
)

from mcpapi.v1 import control_pb2 as v1
from mcpapi.v1 import control_pb2_grpc as v1_grpc
from mcpapi.v2 import control_pb2, control_pb2_grpc, model_pb2, worker_pb2
from mcpcore.errors import Unavailable
from mcpcore.etcd_store import EtcdStore
from mcpcore.keys import Keyspace
from mcpcore.store import EventType

X = np.random.default_rng(3).random((2, 64), dtype=np.float32)
MiB = 1 << 20


def spec(model: str, *versions: str, replicas: int = 1, **kw) -> model_pb2.ModelSpec:
    return model_pb2.ModelSpec(model=model, versions=list(versions) or ["1"], replicas=replicas, **kw)


def load(stub, model_spec: model_pb2.ModelSpec, timeout: float = 60):
    return stub.LoadModel(control_pb2.LoadModelRequest(spec=model_spec), timeout=timeout).status


def running(status) -> list[tuple[str, str]]:
    return sorted(
        (r.version, r.worker_id) for r in status.replicas if r.state == model_pb2.ModelState.Value("RUNNING")
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, etcd_endpoint, repo):
    """One scheduler and two workers (64 MiB each) on their own key prefix."""
    prefix = f"/t{uuid.uuid4().hex[:8]}/mcp"
    tmp = tmp_path_factory.mktemp("cluster")
    workers = [
        WorkerProcess(tmp, etcd_endpoint, repo, prefix=prefix, keyring=repo / "keyring.json",
                      memory_capacity_bytes=64 * MiB).start()
        for _ in range(2)
    ]  # fmt: skip
    scheduler = SchedulerProcess(tmp, etcd_endpoint, prefix=prefix, leader_ttl_s=2).start()
    yield {"prefix": prefix, "workers": workers, "scheduler": scheduler}
    scheduler.stop()
    for w in workers:
        w.stop()


@pytest.fixture(scope="module")
def stub(cluster):
    return control_pb2_grpc.ModelControlStub(cluster["scheduler"].channel())


def test_load_with_two_replicas_lands_on_two_workers_then_unload_frees_memory(cluster, stub, etcd_endpoint):
    status = load(stub, spec("demo-mlp", "1", replicas=2))
    placed = running(status)
    assert [v for v, _ in placed] == ["1", "1"]
    assert {w for _, w in placed} == {w.worker_id for w in cluster["workers"]}
    keys = Keyspace(cluster["prefix"])
    assert etcd_get(etcd_endpoint, keys.model_routing("demo-mlp"))["stable"] == "1"
    for worker in cluster["workers"]:
        client = TensorClient(worker.endpoints["zmq"])
        try:
            assert client.infer("demo-mlp", {"INPUT0": X}).tensors[0].shape == (2, 16)
        finally:
            client.close()

    stub.UnloadModel(control_pb2.UnloadModelRequest(model="demo-mlp"), timeout=60)
    for worker in cluster["workers"]:
        stats = worker.control().Stats(worker_pb2.StatsRequest(), timeout=5)
        assert stats.memory_used_bytes == 0 and not stats.models
    with pytest.raises(grpc.RpcError) as info:
        stub.GetModelStatus(control_pb2.GetModelStatusRequest(model="demo-mlp"), timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_model_too_large_for_any_worker_gets_a_clear_error(cluster, stub):
    big = spec("demo-onnx", "1", placement=model_pb2.PlacementConstraints(memory_bytes=1 << 30))
    with pytest.raises(grpc.RpcError) as info:
        load(stub, big)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "needs 1.0 GiB" in info.value.details() and "free" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:  # a failed load of a new model leaves nothing behind
        stub.GetModelStatus(control_pb2.GetModelStatusRequest(model="demo-onnx"), timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_flip_to_version_2_moves_traffic_only_once_it_runs(cluster, stub, etcd_endpoint):
    keys = Keyspace(cluster["prefix"])
    load(stub, spec("demo-mlp", "1", replicas=2))

    async def flip_and_record() -> list[tuple[str, str, bytes]]:
        async with EtcdStore([etcd_endpoint]) as store:
            start = await store.ping()
            reply = await asyncio.to_thread(
                stub.SetTraffic,
                control_pb2.SetTrafficRequest(model="demo-mlp", traffic=model_pb2.TrafficSplit(stable="2")),
                timeout=10,
            )
            assert "pending" in reply.pending and "version 2" in reply.pending
            seen: list[tuple[str, str, bytes]] = []
            async for batch in store.watch_prefix(cluster["prefix"] + "/", start_revision=start + 1):
                for ev in batch:
                    seen.append((ev.type.value, ev.key, ev.value))
                    if ev.key == keys.model_routing("demo-mlp") and ev.type is EventType.PUT:
                        return seen
        return seen

    events = asyncio.run(asyncio.wait_for(flip_and_record(), 60))
    assert json.loads(events[-1][2])["stable"] == "2"
    states: dict[str, str] = {}
    for kind, key, value in events[:-1]:
        rid = keys.parse_replica_key(key)
        if rid is not None and rid.version == "2":
            states[rid.worker] = json.loads(value)["state"] if kind == "put" else "gone"
    assert sorted(states.values()) == ["RUNNING", "RUNNING"]  # both copies of v2 ran before the flip
    status = stub.GetModelStatus(control_pb2.GetModelStatusRequest(model="demo-mlp"), timeout=5).status
    assert status.traffic.stable == "2" and not status.pending
    stub.UnloadModel(control_pb2.UnloadModelRequest(model="demo-mlp"), timeout=60)


def test_a_typo_in_the_traffic_key_changes_nothing(cluster, stub, etcd_endpoint):
    keys = Keyspace(cluster["prefix"])
    load(stub, spec("demo-onnx", "1"))
    before = etcd_get(etcd_endpoint, keys.model_routing("demo-onnx"))
    etcd_put(
        etcd_endpoint,
        keys.model_traffic("demo-onnx"),
        b'{"stable": "1", "canary": "2", "canary_percent": 150}',
    )
    status = wait_for(
        lambda: (
            (s := stub.GetModelStatus(control_pb2.GetModelStatusRequest(model="demo-onnx"), timeout=5).status)
            and "traffic key rejected" in s.pending
            and s
        ),
        what="the rejection in status",
    )
    assert "canary_percent" in status.pending
    assert etcd_get(etcd_endpoint, keys.model_routing("demo-onnx")) == before
    assert status.traffic.stable == "1" and not any(r.version == "2" for r in status.replicas)
    text = cluster["scheduler"].metrics_text()
    assert re.search(r'mcp_config_rejected_total\{key="traffic"\} [1-9]', text)
    stub.UnloadModel(control_pb2.UnloadModelRequest(model="demo-onnx"), timeout=60)


def test_v1_client_loads_lists_and_unloads_against_the_same_server(cluster):
    v1_stub = v1_grpc.ModelControlStub(cluster["scheduler"].channel())
    reply = v1_stub.LoadModel(v1.LoadModelRequest(model="demo-mlp-enc", version="1", replicas=1), timeout=60)
    assert reply.status.state == v1.RUNNING and reply.status.replicas[0].worker_id
    listed = v1_stub.ListModels(v1.ListModelsRequest(), timeout=5).models
    assert [m.model for m in listed] == ["demo-mlp-enc"]
    v1_stub.UnloadModel(v1.UnloadModelRequest(model="demo-mlp-enc"), timeout=60)
    assert not v1_stub.ListModels(v1.ListModelsRequest(), timeout=5).models


def test_api_validates_its_input(stub):
    cases = [
        (control_pb2.LoadModelRequest(spec=spec("bad/name")), grpc.StatusCode.INVALID_ARGUMENT),
        (control_pb2.LoadModelRequest(spec=spec("demo-mlp", "v1")), grpc.StatusCode.INVALID_ARGUMENT),
        (
            control_pb2.LoadModelRequest(spec=model_pb2.ModelSpec(model="demo-mlp")),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
    ]
    for request, code in cases:
        with pytest.raises(grpc.RpcError) as info:
            stub.LoadModel(request, timeout=10)
        assert info.value.code() == code, info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        stub.SetTraffic(
            control_pb2.SetTrafficRequest(model="never-loaded", traffic=model_pb2.TrafficSplit(stable="1")),
            timeout=5,
        )
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_killing_the_leader_lets_the_standby_finish_a_load(tmp_path, etcd_endpoint, repo):
    prefix = f"/t{uuid.uuid4().hex[:8]}/mcp"
    keys = Keyspace(prefix)
    worker = WorkerProcess(tmp_path, etcd_endpoint, repo, prefix=prefix).start()
    first = SchedulerProcess(tmp_path, etcd_endpoint, prefix=prefix, leader_ttl_s=1).start()
    second = SchedulerProcess(tmp_path, etcd_endpoint, prefix=prefix, leader_ttl_s=1).start()
    try:
        leader_id = wait_for(lambda: _leader(etcd_endpoint, keys), what="a leader")
        leader, standby = (first, second) if leader_id == first.scheduler_id else (second, first)
        leader_stub = control_pb2_grpc.ModelControlStub(leader.channel())
        call = leader_stub.LoadModel.future(
            control_pb2.LoadModelRequest(spec=spec("demo-slow", "1")), timeout=60
        )
        wait_for(lambda: etcd_get(etcd_endpoint, keys.model_spec("demo-slow")), what="the spec written")
        leader.kill()
        with pytest.raises(grpc.RpcError):
            call.result()
        standby_stub = control_pb2_grpc.ModelControlStub(standby.channel())
        status = load(standby_stub, spec("demo-slow", "1"))  # idempotent: finishes what is under way
        assert running(status) == [("1", worker.worker_id)]
        assert _leader(etcd_endpoint, keys) == standby.scheduler_id
    finally:
        for proc in (first, second, worker):
            proc.stop()


def test_killing_a_worker_gets_its_replicas_recovered_elsewhere(tmp_path, etcd_endpoint, repo):
    prefix = f"/t{uuid.uuid4().hex[:8]}/mcp"
    workers = [
        WorkerProcess(
            tmp_path, etcd_endpoint, repo, prefix=prefix, lease_ttl_s=1, heartbeat_interval_s=0.3
        ).start()
        for _ in range(2)
    ]
    scheduler = SchedulerProcess(tmp_path, etcd_endpoint, prefix=prefix, reconcile_interval_s=0.5).start()
    try:
        stub = control_pb2_grpc.ModelControlStub(scheduler.channel())
        [(_, first)] = running(load(stub, spec("demo-onnx", "2")))
        victim = next(w for w in workers if w.worker_id == first)
        survivor = next(w for w in workers if w.worker_id != first)
        victim.kill()
        status = wait_for(
            lambda: (
                (
                    s := stub.GetModelStatus(
                        control_pb2.GetModelStatusRequest(model="demo-onnx"), timeout=5
                    ).status
                )
                and running(s) == [("2", survivor.worker_id)]
                and len(s.replicas) == 1
                and s
            ),
            timeout_s=30,
            what="the replica recovered on the surviving worker",
        )
        assert status.traffic.stable == "2"
        client = TensorClient(survivor.endpoints["zmq"])
        try:
            assert client.infer("demo-onnx", {"INPUT0": X}).header.version == "2"
        finally:
            client.close()
    finally:
        scheduler.stop()
        for w in workers:
            w.stop()


def _leader(endpoint: str, keys: Keyspace) -> str | None:
    async def read() -> str | None:
        async with EtcdStore([endpoint]) as store:
            kv = await store.get(keys.leader("scheduler"))
            return None if kv is None else kv.value.decode()

    return asyncio.run(read())


def test_load_on_demand_loads_when_a_router_asks(cluster, stub, etcd_endpoint):
    keys = Keyspace(cluster["prefix"])
    status = load(stub, spec("demo-onnx", "1", replicas=0, load_on_demand=True))
    assert not status.replicas  # registered, nothing loaded yet
    etcd_put(
        etcd_endpoint, keys.demand("demo-onnx", "router-1"), json.dumps({"requests": 3, "at": 1.0}).encode()
    )
    wait_for(
        lambda: running(
            stub.GetModelStatus(control_pb2.GetModelStatusRequest(model="demo-onnx"), timeout=5).status
        ),
        timeout_s=30,
        what="a copy loaded on demand",
    )
    stub.UnloadModel(control_pb2.UnloadModelRequest(model="demo-onnx"), timeout=60)


def test_hot_model_gets_an_extra_copy_on_overflow(cluster, stub, etcd_endpoint):
    keys = Keyspace(cluster["prefix"])
    assert len(running(load(stub, spec("demo-mlp", "2", replicas=1, max_replicas=2)))) == 1
    etcd_put(
        etcd_endpoint, keys.demand("demo-mlp", "router-1"), json.dumps({"overflow": 40, "at": 5.0}).encode()
    )
    status = wait_for(
        lambda: (
            (s := stub.GetModelStatus(control_pb2.GetModelStatusRequest(model="demo-mlp"), timeout=5).status)
            and len(running(s)) == 2
            and s
        ),
        timeout_s=30,
        what="a second copy",
    )
    assert {w for _, w in running(status)} == {w.worker_id for w in cluster["workers"]}
    stub.UnloadModel(control_pb2.UnloadModelRequest(model="demo-mlp"), timeout=60)


def test_pause_resume_and_drain(cluster, stub):
    load(stub, spec("demo-mlp", "1"))
    paused = stub.PauseModel(control_pb2.PauseModelRequest(model="demo-mlp", version="1"), timeout=30).status
    assert [model_pb2.ModelState.Name(r.state) for r in paused.replicas] == ["PAUSED"]
    resumed = stub.ResumeModel(
        control_pb2.ResumeModelRequest(model="demo-mlp", version="1"), timeout=30
    ).status
    [(_, where)] = running(resumed)
    drained = stub.Drain(control_pb2.DrainRequest(worker_id=where, reason="kernel upgrade"), timeout=10)
    assert [r.worker_id for r in drained.replicas] == [where]
    wait_for(
        lambda: (
            (s := stub.GetModelStatus(control_pb2.GetModelStatusRequest(model="demo-mlp"), timeout=5).status)
            and [w for _, w in running(s)] != [where]
            and len(s.replicas) == 1
        ),
        timeout_s=30,
        what="the replica moved off the drained worker",
    )
    undone = stub.Undrain(control_pb2.UndrainRequest(worker_id=where), timeout=10)
    assert undone.reason == "kernel upgrade"
    with pytest.raises(grpc.RpcError) as info:  # not drained (any more): a clear NOT_FOUND
        stub.Undrain(control_pb2.UndrainRequest(worker_id=where), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND and "not drained" in info.value.details()
    # the worker takes replicas again: two copies need both workers
    status = load(stub, spec("demo-mlp", "1", replicas=2))
    assert {w for _, w in running(status)} == {w.worker_id for w in cluster["workers"]}
    stub.UnloadModel(control_pb2.UnloadModelRequest(model="demo-mlp"), timeout=60)


def test_pause_and_resume_without_a_version_cover_every_version(cluster, stub):
    """An empty version means every version the spec declares (control.proto); the workers are the judge."""
    workers = {w.worker_id: w for w in cluster["workers"]}
    placed = running(load(stub, spec("demo-mlp", "1", "2")))
    assert [v for v, _ in placed] == ["1", "2"]

    def answers(version: str, worker_id: str) -> bool:
        with TensorClient(workers[worker_id].endpoints["zmq"]) as client:
            try:
                client.infer("demo-mlp", {"INPUT0": X}, version=version)
            except Unavailable as err:
                assert "is paused" in err.message
                return False
        return True

    paused = stub.PauseModel(control_pb2.PauseModelRequest(model="demo-mlp"), timeout=30).status
    states = sorted((r.version, model_pb2.ModelState.Name(r.state)) for r in paused.replicas)
    assert states == [("1", "PAUSED"), ("2", "PAUSED")]
    assert not any(answers(v, w) for v, w in placed)
    resumed = stub.ResumeModel(control_pb2.ResumeModelRequest(model="demo-mlp"), timeout=30).status
    assert running(resumed) == placed
    assert all(answers(v, w) for v, w in placed)
    for call, request in (
        (stub.PauseModel, control_pb2.PauseModelRequest(model="no-such-model")),
        (stub.ResumeModel, control_pb2.ResumeModelRequest(model="no-such-model")),
    ):
        with pytest.raises(grpc.RpcError) as info:  # every version of nothing: NOT_FOUND, as with a version
            call(request, timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND and "no-such-model" in info.value.details()
    stub.UnloadModel(control_pb2.UnloadModelRequest(model="demo-mlp"), timeout=60)


def test_mcpctl_drains_and_undrains_and_status_shows_it(cluster, tmp_path, etcd_endpoint):
    health = HealthProcess(tmp_path, etcd_endpoint, prefix=cluster["prefix"], check_interval_s=0.2).start()
    worker = cluster["workers"][0].worker_id
    addr = ["--scheduler", cluster["scheduler"].endpoints["grpc"], "--health", health.endpoints["grpc"]]

    def mcpctl(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "mcpclient.mcpctl", *addr, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    def drained_as_shown() -> dict[str, str]:
        return {
            w["worker"]: w["drained"]
            for w in json.loads(mcpctl("-o", "json", "status").stdout)["workers"] or []
        }

    try:
        drained = mcpctl("drain", worker, "--reason", "disk swap")
        assert drained.returncode == 0 and f"{worker}: drained (disk swap)" in drained.stdout, drained.stderr
        wait_for(lambda: drained_as_shown().get(worker) == "disk swap", what="status shows the drain")
        table = mcpctl("status").stdout
        assert next(line for line in table.splitlines() if line.startswith(worker)).endswith(
            "drained: disk swap"
        )
        undone = mcpctl("undrain", worker)
        assert undone.returncode == 0 and "no longer drained (was: disk swap)" in undone.stdout
        again = mcpctl("undrain", worker)
        assert again.returncode == 1 and "not drained" in again.stderr and len(again.stderr.splitlines()) == 1
        wait_for(lambda: not any(drained_as_shown().values()), what="status without the drain")
    finally:
        health.stop()


def test_watch_models_streams_a_snapshot_then_changes(cluster, stub):
    load(stub, spec("demo-slow", "1"))
    stream = stub.WatchModels(
        control_pb2.WatchModelsRequest(models=["demo-slow"], initial_snapshot=True), timeout=60
    )
    kinds = []
    for event in stream:
        kinds.append(control_pb2.EventKind.Name(event.kind))
        if event.kind == control_pb2.EVENT_KIND_SYNCED:
            break
    assert "EVENT_KIND_REPLICA" in kinds and "EVENT_KIND_SPEC" in kinds and "EVENT_KIND_TRAFFIC" in kinds
    stub.SetBreaker(control_pb2.SetBreakerRequest(model="demo-slow", level=2, reason="drill"), timeout=5)
    for event in stream:
        if event.kind == control_pb2.EVENT_KIND_BREAKER:
            assert event.breaker.level == 2 and event.breaker.reason == "drill"
            break
    stream.cancel()
    assert stub.GetBreaker(control_pb2.GetBreakerRequest(model="demo-slow"), timeout=5).breaker.level == 2
    with pytest.raises(grpc.RpcError) as info:
        stub.SetBreaker(control_pb2.SetBreakerRequest(model="demo-slow", level=7), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "0..3" in info.value.details()
    stub.SetBreaker(control_pb2.SetBreakerRequest(model="demo-slow", clear=True), timeout=5)
    stub.UnloadModel(control_pb2.UnloadModelRequest(model="demo-slow"), timeout=60)


def test_a_load_that_runs_out_of_time_keeps_its_spec_and_finishes(cluster, stub, etcd_endpoint):
    keys = Keyspace(cluster["prefix"])
    frozen = cluster["workers"]
    for w in frozen:  # no load can finish while the call waits
        os.kill(w.proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(grpc.RpcError) as info:
            load(stub, spec("demo-onnx", "1"), timeout=1.0)
    finally:
        for w in frozen:
            os.kill(w.proc.pid, signal.SIGCONT)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "goes on in the background" in info.value.details()
    assert etcd_get(etcd_endpoint, keys.model_spec("demo-onnx")) is not None  # kept, as the message says
    status = load(stub, spec("demo-onnx", "1"))  # and it does finish
    assert len(running(status)) == 1
    stub.UnloadModel(control_pb2.UnloadModelRequest(model="demo-onnx"), timeout=60)


def test_a_load_that_fails_on_one_worker_is_placed_on_another(tmp_path, etcd_endpoint, repo):
    """The first pick is frozen: its Load times out (a failure another worker may not hit). LoadModel
    does not return it: the copy goes to the other worker."""
    prefix = f"/t{uuid.uuid4().hex[:8]}/mcp"
    tag = uuid.uuid4().hex[:6]
    workers = [
        WorkerProcess(
            tmp_path, etcd_endpoint, repo, prefix=prefix, worker_id=f"w-{name}-{tag}", lease_ttl_s=20
        )
        for name in ("a", "b")
    ]
    for w in workers:
        w.start()
    scheduler = SchedulerProcess(tmp_path, etcd_endpoint, prefix=prefix, worker_timeout_s=1.0).start()
    first = workers[0]  # same free memory: the lower id is picked first
    os.kill(first.proc.pid, signal.SIGSTOP)
    try:
        control = control_pb2_grpc.ModelControlStub(scheduler.channel())
        status = load(control, spec("demo-mlp", "1"), timeout=45)
        assert running(status) == [("1", workers[1].worker_id)]
    finally:
        os.kill(first.proc.pid, signal.SIGCONT)
        scheduler.stop()
        for w in workers:
            w.stop()
