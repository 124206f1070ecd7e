"""Fuzzing the etcd keys operators write (DESIGN.md section 4), against the processes that read them.

Contract: a hostile value (not JSON, wrong types, out of range, unknown fields, huge strings, nested
garbage) of an operator-writable key is rejected by each process that reads it: logged, counted
(``mcp_config_rejected_total{key}``), and ignored, the last good value staying in force; the processes
keep serving; and nothing else in etcd changes but what reports the rejection (the model's status).

Keys and their readers here: ``/mcp/models/<m>/traffic`` (scheduler; the router follows the split in
force, ``routing``), ``/mcp/models/<m>/spec`` (scheduler, router), ``/mcp/breakers/<m>`` (router,
scheduler, worker) and ``/mcp/config/breaker`` (router). Which values are hostile is decided by the readers'
own parsers, run here on the same bytes: a value they accept is not garbage and is skipped.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from fuzzing import fuzz_settings, hostile_json, hostile_text
from harness import etcd_get, etcd_put, metric, mlp_reference, wait_for
from hypothesis import assume, given
from hypothesis import strategies as st

from mcpapi.kserve import grpc_service_pb2 as pb
from mcpapi.kserve import grpc_service_pb2_grpc as pb_grpc
from mcpcore.errors import InvalidArgument
from mcpcore.etcd_store import EtcdStore
from mcpcore.keys import Keyspace
from mcpcore.records import ModelSpecDoc, TrafficDoc
from mcpcore.records.breaker import BreakerDoc, BreakerPolicy

MODEL = "demo-mlp"
X = np.random.default_rng(9).random((1, 64), dtype=np.float32)
#: Keys that change by themselves (heartbeats, load reports, request stats, leases, elections) and the
#: status document, where the scheduler reports a rejected value: left out of the before/after check.
_MOVING = ("/workers/", "/stats/", "/routers/", "/leader/", "/demand/", "/status")


@pytest.fixture(scope="module")
def keys(mesh) -> Keyspace:  # type: ignore[no-untyped-def]
    return Keyspace(mesh.router.prefix)


@pytest.fixture(scope="module")
def stable_2(mesh, etcd_endpoint: str, keys: Keyspace):  # type: ignore[no-untyped-def]
    """A valid split written first (everything to version 2), in force before any garbage comes."""
    etcd_put(etcd_endpoint, keys.model_traffic(MODEL), {"stable": "2"})
    wait_for(lambda: (etcd_get(etcd_endpoint, keys.model_routing(MODEL)) or {}).get("stable") == "2",
             timeout_s=30, what="the split {stable: 2} in force")  # fmt: skip
    wait_for(lambda: answered_by(mesh) == "2", timeout_s=15, what="the router routing to version 2")
    yield
    etcd_put(etcd_endpoint, keys.model_traffic(MODEL), {"stable": "1"})


def answered_by(mesh) -> str:  # type: ignore[no-untyped-def]
    """The version that answers a request naming none (the split in force), checked against it."""
    request = pb.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=list(X.shape))
    request.raw_input_contents.append(X.tobytes())
    with mesh.router.channel() as channel:
        response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=15)
    out = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(1, 16)
    repo = Path(mesh.worker.args[mesh.worker.args.index("--repository") + 1])
    np.testing.assert_allclose(
        out, mlp_reference(repo, MODEL, response.model_version, X), rtol=1e-4, atol=1e-5
    )
    return response.model_version


def snapshot(endpoint: str, prefix: str) -> dict[str, bytes]:
    """Every key under ``prefix`` that only a reaction to an operator could change."""

    async def read() -> dict[str, bytes]:
        async with EtcdStore([endpoint]) as store:
            got = await store.get_prefix(prefix + "/")
            return {kv.key: kv.value for kv in got.items if not any(m in kv.key for m in _MOVING)}

    return asyncio.run(read())


def rejected(proc, key: str) -> float:  # type: ignore[no-untyped-def]
    return metric(proc.metrics_text(), "mcp_config_rejected_total", key=key)


def is_garbage(parse: Callable[[bytes], Any], raw: bytes) -> bool:
    try:
        parse(raw)
    except InvalidArgument:
        return True
    return False


# --- hostile values --------------------------------------------------------------------------------------

_json = hostile_json(max_size=3, max_leaves=8)


_HUGE_STRING = b'{"stable": "' + b"x" * 100_000 + b'"}'


def hostile(valid: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """Bytes an operator could put: ``valid`` with one field spoiled, dropped or added, or any JSON, or
    no JSON at all."""
    spoiled = st.tuples(st.sampled_from(sorted(valid)), _json).map(lambda kv: {**valid, kv[0]: kv[1]})
    extra = st.tuples(hostile_text(12), _json).map(lambda kv: {**valid, kv[0]: kv[1]})
    return st.one_of(
        spoiled.map(lambda d: json.dumps(d).encode()),
        extra.map(lambda d: json.dumps(d).encode()),
        _json.map(lambda d: json.dumps(d).encode()),
        st.sampled_from([b"", b"{", b"null", b"[]", b"\xff\xfe", b"[" * 10_000, _HUGE_STRING]),
        st.binary(max_size=40),
    )  # fmt: skip


_TRAFFIC = {"stable": "2", "canary": "1", "canary_percent": 10}
_BREAKER = {"level": 1, "reason": "fuzz", "set_by": "operator"}
_POLICY = {
    "levels": [
        {"threshold": 0.3, "action": "reduce_batch_size", "params": {"ratio": 0.5}},
        {"threshold": 0.6, "action": "disable_secondary_features", "params": {"features": ["RANK0"]}},
        {"threshold": 0.9, "action": "fallback_to_static", "params": {"version": "1"}},
    ],
    "metrics_window": "30s",
    "cool_down": "5m",
}


def _check(mesh, etcd_endpoint: str, key: str, raw: bytes, readers: list[tuple[Any, str]]) -> None:  # type: ignore[no-untyped-def]
    """Write ``raw`` to ``key`` and check the contract: each reader counts it rejected, the split in
    force still routes to version 2, and only ``key`` changed among the keys operators' values drive."""
    prefix = mesh.router.prefix
    before = snapshot(etcd_endpoint, prefix)
    counts = [rejected(proc, name) for proc, name in readers]
    etcd_put(etcd_endpoint, key, raw)
    for (proc, name), count in zip(readers, counts, strict=True):
        wait_for(
            lambda p=proc, n=name, c=count: rejected(p, n) > c,
            timeout_s=15,
            what=f"{proc.name} rejects {key}",
        )
    assert answered_by(mesh) == "2", "the last good split is no longer in force"
    after = snapshot(etcd_endpoint, prefix)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    published = {k for k in changed if k.startswith(Keyspace(prefix).rejected_prefix())}  # why, per service
    assert set(changed) - published <= {key}, f"keys changed besides {key}: {changed}"  # (may hold raw)
    assert after[key] == raw
    for proc in (mesh.router, mesh.scheduler, mesh.worker):
        assert proc.proc.poll() is None, f"{proc.name} died"


@fuzz_settings(8)
@given(raw=hostile(_TRAFFIC))
def test_hostile_traffic(mesh, etcd_endpoint, keys, stable_2, raw: bytes) -> None:  # type: ignore[no-untyped-def]
    assume(is_garbage(lambda r: TrafficDoc.parse(f"/mcp/models/{MODEL}/traffic", r), raw))
    key = keys.model_traffic(MODEL)
    _check(mesh, etcd_endpoint, key, raw, [(mesh.scheduler, "traffic")])
    status = etcd_get(etcd_endpoint, keys.model_status(MODEL)) or {}
    assert status.get("traffic_rejected"), f"the status does not report the rejected traffic: {status}"


@fuzz_settings(8)
@given(raw=hostile(_BREAKER))
def test_hostile_breaker(mesh, etcd_endpoint, keys, stable_2, raw: bytes) -> None:  # type: ignore[no-untyped-def]
    assume(is_garbage(lambda r: BreakerDoc.parse(f"breaker of {MODEL}", r), raw))
    key = keys.breaker(MODEL)
    _check(
        mesh,
        etcd_endpoint,
        key,
        raw,
        [(mesh.router, "breaker"), (mesh.scheduler, "breaker"), (mesh.worker, "breaker")],
    )


@fuzz_settings(8)
@given(raw=hostile(_POLICY))
def test_hostile_breaker_policy(mesh, etcd_endpoint, keys, stable_2, raw: bytes) -> None:  # type: ignore[no-untyped-def]
    assume(is_garbage(lambda r: BreakerPolicy.parse("breaker policy", r), raw))
    _check(mesh, etcd_endpoint, keys.breaker_config(), raw, [(mesh.router, "breaker_policy")])


@pytest.fixture(scope="module")
def good_spec(mesh, etcd_endpoint, keys) -> Any:  # type: ignore[no-untyped-def]
    """The spec the scheduler wrote for the mesh, put back after the garbage."""
    raw = etcd_get(etcd_endpoint, keys.model_spec(MODEL))
    yield raw
    etcd_put(etcd_endpoint, keys.model_spec(MODEL), raw)


@fuzz_settings(8)
@given(data=st.data())
def test_hostile_spec(mesh, etcd_endpoint, keys, stable_2, good_spec, data: st.DataObject) -> None:  # type: ignore[no-untyped-def]
    raw = data.draw(hostile(good_spec))
    assume(is_garbage(lambda r: ModelSpecDoc.parse(f"/mcp/models/{MODEL}/spec", r), raw))
    _check(mesh, etcd_endpoint, keys.model_spec(MODEL), raw, [(mesh.scheduler, "spec")])


def test_channel_is_still_served(mesh) -> None:  # type: ignore[no-untyped-def]
    """After all of it, a request naming version 1 is still answered by version 1."""
    request = pb.ModelInferRequest(model_name=MODEL, model_version="1")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=list(X.shape))
    request.raw_input_contents.append(X.tobytes())
    try:
        with mesh.router.channel() as channel:
            response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=15)
    except grpc.RpcError as err:  # pragma: no cover - the failure message
        pytest.fail(f"{err.code()} {err.details()}")
    assert response.model_version == "1"
