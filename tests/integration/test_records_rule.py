"""The records' rules through real processes (etcd, a worker, a scheduler, a router, a health service):

- each operator document type (traffic, spec, breaker, breaker policy), written malformed four ways as an
  operator's etcdctl put would (not JSON, a wrong type, an unknown field, an out-of-range value), gets the
  same outcome in EVERY service that reads it: the last good value stays in force (checked against the
  process that holds the truth: inference answers, a worker's breaker level), the rejection is counted on
  that service's /metrics, and ``mcpctl status`` (the installed CLI) names each service that rejected it;
  a fixed document clears it;
- a field unknown to this version, put into each process-written record as a newer process would write
  it, is tolerated (the worker stays in the router's view and answers; the scheduler still counts its
  copies) and counted (``mcp_record_unknown_fields_total`` on the readers' /metrics); the records read
  on request (a model's status, a drain, a demand report, a router's presence, a service's rejections)
  the same through the scheduler's API and ``mcpctl``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from harness import etcd_put, full_mesh, metric, wait_for

from mcpapi.v2 import control_pb2, control_pb2_grpc, inference_pb2, inference_pb2_grpc, model_pb2
from mcpcore import dtypes
from mcpcore.etcd_store import EtcdStore
from mcpcore.keys import Keyspace
from mcpcore.records.breaker import DEFAULT_POLICY

MCPCTL = Path(sys.executable).parent / "mcpctl"
MODEL = "demo-mlp"
X = np.random.default_rng(5).random((2, 64), dtype=np.float32)
SPEC = {"versions": ["1", "2"], "replicas": 1, "fallback_version": "1"}


@pytest.fixture(scope="module")
def mesh(
    tmp_path_factory: pytest.TempPathFactory, etcd_endpoint: str, repo: Path
) -> Iterator[dict[str, Any]]:
    with full_mesh(tmp_path_factory.mktemp("records"), etcd_endpoint, repo, lease_ttl_s=10) as m:
        control = control_pb2_grpc.ModelControlStub(m.scheduler.channel())
        spec = model_pb2.ModelSpec(model=MODEL, versions=["1", "2"], replicas=1, fallback_version="1")
        control.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=60)
        stub = inference_pb2_grpc.InferenceStub(m.router.channel())
        wait_for(
            lambda: _answers(stub, "2") == "2" and _answers(stub, "1") == "1", what="both versions routed"
        )
        yield {
            "keys": Keyspace(m.prefix), "prefix": m.prefix, "etcd": etcd_endpoint, "control": control,
            "stub": stub,
            "services": {
                "worker": m.worker, "scheduler": m.scheduler, "router": m.router, "health": m.health,
            },
        }  # fmt: skip


def _answers(stub: inference_pb2_grpc.InferenceStub, version: str = "") -> str:
    """The version that answered one real inference (``version``: asked for; "": the router's choice)."""
    arr = X
    t = inference_pb2.Tensor(
        name="INPUT0",
        dtype=dtypes.wire_value(dtypes.from_numpy(arr.dtype)),
        shape=arr.shape,
        data=arr.tobytes(),
    )
    return stub.Infer(
        inference_pb2.InferRequest(model=MODEL, version=version, inputs=[t]), timeout=30
    ).version


def _all_answer(mesh: dict[str, Any], version: str, n: int = 10) -> bool:
    return all(_answers(mesh["stub"]) == version for _ in range(n))


def _rejected(mesh: dict[str, Any], service: str, kind: str) -> float:
    return metric(mesh["services"][service].metrics_text(), "mcp_config_rejected_total", key=kind)


def _status(mesh: dict[str, Any]) -> dict[str, Any]:
    """``mcpctl status -o json`` through the installed console script."""
    s = mesh["services"]
    args = [
        str(MCPCTL), "--scheduler", s["scheduler"].endpoints["grpc"],
        "--health", s["health"].endpoints["grpc"], "--etcd", mesh["etcd"],
        "-o", "json", "status", "--prefix", mesh["prefix"],
    ]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _rejecting(mesh: dict[str, Any], key: str) -> set[str]:
    """The services ``mcpctl status`` names as rejecting ``key``."""
    return {r["service"] for r in _status(mesh)["rejections"] or () if r["key"] == key}


def _mlp(mesh: dict[str, Any]) -> dict[str, Any]:
    return next(m for m in _status(mesh)["models"] if m["model"] == MODEL)


def _policy(**change: Any) -> dict[str, Any]:
    return {**json.loads(DEFAULT_POLICY.to_json()), **change}


def _worker_level(mesh: dict[str, Any]) -> float:
    return metric(mesh["services"]["worker"].metrics_text(), "mcp_breaker_level", model=MODEL)


# kind -> (key of the document, services that read it, good value, four malformed values, fixed value)
OPERATOR: dict[str, tuple[Callable[[Keyspace], str], tuple[str, ...], Any, list[Any], Any]] = {
    "traffic": (
        lambda k: k.model_traffic(MODEL), ("scheduler",),
        {"stable": "2", "canary": "1", "canary_percent": 100},  # absent would mean the highest: 2
        [b'{"stable": "2", "canary": "1"', {"stable": ["2"]}, {"stable": "2", "canary_pct": 5},
         {"stable": "2", "canary": "1", "canary_percent": 150}],
        {"stable": "2"},
    ),
    "spec": (
        lambda k: k.model_spec(MODEL), ("scheduler", "router"),
        SPEC,
        [b'{"versions": ["1", "2"]', {**SPEC, "versions": "1"}, {**SPEC, "replica": 2},
         {**SPEC, "replicas": -1}],
        SPEC,
    ),
    "breaker": (
        lambda k: k.breaker(MODEL), ("scheduler", "router", "health", "worker"),
        {"level": 3, "reason": "drill"},
        [b'{"level": 3', {"level": "3"}, {"level": 3, "untill": 5}, {"level": 7}],
        {"level": 0},
    ),
    "breaker_policy": (
        lambda k: k.breaker_config(), ("router", "health"),
        _policy(cool_down="10m"),
        [b'{"levels": [', _policy(min_requests="20"), _policy(cooldown="5m"), _policy(min_requests=0)],
        _policy(cool_down="5m"),
    ),
}  # fmt: skip


def _truth(mesh: dict[str, Any], kind: str, fixed: bool) -> None:
    """What the good (or, with ``fixed``, the fixed) document makes the processes that hold the truth do."""
    if kind == "traffic":  # the scheduler's split in force, seen in real inference answers
        wait_for(
            lambda: _all_answer(mesh, "2" if fixed else "1"), what=f"traffic {'fixed' if fixed else 'good'}"
        )
    elif kind == "spec":  # both versions kept loaded (scheduler) and routed (router); the fallback known
        mlp = wait_for(lambda: (m := _mlp(mesh))["replicas_running"] == 2 and m, what="both copies running")
        assert (mlp["versions"], mlp["fallback_version"]) == (["1", "2"], "1")
        assert _answers(mesh["stub"], "1") == "1" and _answers(mesh["stub"], "2") == "2"
    elif kind == "breaker":  # router: level 3 sends to the fallback; worker: its level in force
        level = 0 if fixed else 3
        wait_for(lambda: _worker_level(mesh) == level, what=f"the worker at breaker level {level}")
        wait_for(lambda: _all_answer(mesh, "2" if fixed else "1"), what="the router's breaker")
        assert _mlp(mesh)["breaker"]["level"] == level  # the scheduler's level in force


@pytest.mark.parametrize("kind", list(OPERATOR))
def test_a_malformed_operator_document_keeps_the_last_good_value_in_every_reader(mesh, kind):
    key_of, readers, good, malformed, fixed = OPERATOR[kind]
    key, etcd = key_of(mesh["keys"]), mesh["etcd"]
    split = model_pb2.TrafficSplit(stable="2")
    mesh["control"].SetTraffic(control_pb2.SetTrafficRequest(model=MODEL, traffic=split), timeout=10)
    wait_for(lambda: _all_answer(mesh, "2"), what="version 2 in service")
    etcd_put(etcd, key, good)
    _truth(mesh, kind, fixed=False)
    for value in malformed:
        before = {s: _rejected(mesh, s, kind) for s in readers}
        etcd_put(etcd, key, value)
        for service in readers:
            wait_for(
                lambda s=service, n=before[service]: _rejected(mesh, s, kind) == n + 1,
                what=f"{service} counted it",
            )
    _truth(mesh, kind, fixed=False)  # the last good value is still in force everywhere
    named = wait_for(
        lambda: (r := _rejecting(mesh, key)) >= set(readers) and r, what="mcpctl status names them"
    )
    assert named == set(readers)
    etcd_put(etcd, key, fixed)
    _truth(mesh, kind, fixed=True)
    wait_for(lambda: not _rejecting(mesh, key), what="a fixed document clears the rejection")


def _put_with_unknown_fields(mesh: dict[str, Any], key: str, add: Callable[[dict[str, Any]], None]) -> bool:
    """Rewrite ``key`` as a newer process would: its document plus fields this version does not know,
    under the same lease. False: its writer has not written it yet."""

    async def rewrite() -> bool:
        async with EtcdStore([mesh["etcd"]]) as store:
            kv = await store.get(key)
            if kv is None:
                return False
            doc = json.loads(kv.value)
            add(doc)
            await store.put(key, json.dumps(doc).encode(), lease=kv.lease)
            return True

    return asyncio.run(rewrite())


def _unknown(mesh: dict[str, Any], service: str, kind: str) -> float:
    return metric(mesh["services"][service].metrics_text(), "mcp_record_unknown_fields_total", kind=kind)


def test_a_newer_writers_fields_are_tolerated_and_counted(mesh):
    k, s = mesh["keys"], mesh["services"]
    worker, router = s["worker"].worker_id, s["router"].router_id
    _answers(mesh["stub"])  # a request in the router's window: its stats key exists
    cases = [  # (key, its kind, the services that read it)
        (k.worker(worker), "worker", ("scheduler", "router", "health")),
        (k.replica(MODEL, "1", worker), "replica", ("scheduler", "router")),
        (k.model_routing(MODEL), "routing", ("scheduler", "router")),
        (k.worker_load(worker), "load", ("scheduler", "health")),  # rewritten every heartbeat
        (k.stats(router, MODEL), "stats", ("health",)),  # rewritten every second
    ]

    def add(doc: dict[str, Any]) -> None:
        doc["added_by_a_newer_version"] = {"any": ["shape"]}
        if "info" in doc:
            doc["info"]["also_new"] = 1

    for key, kind, readers in cases:
        before = {r: _unknown(mesh, r, kind) for r in readers}

        def counted(key: str = key, kind: str = kind, before: dict[str, float] = before) -> bool:
            # put again until each reader saw it: its writer may replace it before a watch batch shows it
            written = _put_with_unknown_fields(mesh, key, add)
            return written and all(_unknown(mesh, r, kind) > n for r, n in before.items())

        wait_for(counted, interval_s=0.5, what=f"{readers} counting the new {kind} fields")
    # tolerated: the worker is still in the router's view and answers; the scheduler still counts its copies
    assert _answers(mesh["stub"], "1") == "1" and _answers(mesh["stub"], "2") == "2"
    assert _mlp(mesh)["replicas_running"] == 2


def _mcpctl(mesh: dict[str, Any], *args: str) -> str:
    """The installed ``mcpctl`` (JSON output) against this mesh; its stdout."""
    s = mesh["services"]
    argv = [
        str(MCPCTL), "--scheduler", s["scheduler"].endpoints["grpc"],
        "--health", s["health"].endpoints["grpc"], "--etcd", mesh["etcd"], "-o", "json", *args,
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


NEWER = {"added_by_a_newer_version": [1, {"nested": True}]}


def test_records_read_on_request_tolerate_a_newer_writers_fields(mesh):
    k, s = mesh["keys"], mesh["services"]
    router = s["router"].router_id

    # a model's status (the scheduler writes it; its GetModelStatus reads it)
    def status_counted(before: float = _unknown(mesh, "scheduler", "status")) -> bool:
        assert _put_with_unknown_fields(mesh, k.model_status(MODEL), lambda d: d.update(NEWER))
        request = control_pb2.GetModelStatusRequest(model=MODEL)
        answer = mesh["control"].GetModelStatus(request, timeout=10)
        assert answer.status.model == MODEL
        return _unknown(mesh, "scheduler", "status") > before

    wait_for(status_counted, interval_s=0.5, what="the scheduler counting a status's new fields")

    # a demand report (routers write it; the scheduler indexes every one)
    before = _unknown(mesh, "scheduler", "demand")
    demand = {"requests": 0, "overflow": 0, "at": 1.0, **NEWER}
    etcd_put(mesh["etcd"], k.demand("records-ghost-model", "records-ghost-router"), demand)
    wait_for(lambda: _unknown(mesh, "scheduler", "demand") > before, what="the scheduler counting demand")

    # a drain (the scheduler writes it; Undrain answers with its reason)
    before = _unknown(mesh, "scheduler", "drain")
    etcd_put(mesh["etcd"], k.drain("records-ghost"), {"reason": "moved racks", "at": 1.0, **NEWER})
    out = json.loads(_mcpctl(mesh, "undrain", "records-ghost"))
    assert "moved racks" in json.dumps(out)
    assert _unknown(mesh, "scheduler", "drain") > before

    # a router's presence (``mcpctl dump`` follows it to the router's snapshot)
    def dumped() -> bool:
        assert _put_with_unknown_fields(mesh, k.router(router), lambda d: d.update(NEWER))
        found = json.loads(_mcpctl(mesh, "dump", "--prefix", mesh["prefix"]))["routers"][router]
        assert "error" not in found, found
        return "added_by_a_newer_version" in found["record"] and "snapshot" in found

    wait_for(dumped, interval_s=0.5, what="mcpctl dump reading a newer router record")

    # a service's rejections (``mcpctl status`` lists them)
    rejection = {"key": "/x", "kind": "traffic", "reason": "from a newer service", "at": 1.0, **NEWER}
    doc = {"service": "health", "instance": "newer-1", "rejections": [rejection], **NEWER}
    etcd_put(mesh["etcd"], k.rejected("health", "newer-1"), doc)
    listed = [r for r in _status(mesh)["rejections"] or () if r["instance"] == "newer-1"]
    assert [(r["key"], r["reason"]) for r in listed] == [("/x", "from a newer service")]

    async def tidy() -> None:  # the other tests read mcpctl status's rejections too
        async with EtcdStore([mesh["etcd"]]) as store:
            await store.delete(k.rejected("health", "newer-1"))
            await store.delete(k.demand("records-ghost-model", "records-ghost-router"))

    asyncio.run(tidy())
