"""Model keys never leave the keyring file: not in logs (at DEBUG), metrics, etcd, error messages or
``mcpctl dump``/``keygen``/``encrypt-model`` output.

Keys made with ``mcpctl keygen``, a model encrypted with ``mcpctl encrypt-model``, served by a real
worker/scheduler/router; a second model encrypted under the same key id with another key fails to load.
Everything the mesh wrote or answered is then searched for each key, raw and in every usual encoding.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from pathlib import Path

import grpc
import numpy as np
import pytest
from harness import (
    RouterProcess,
    SchedulerProcess,
    WorkerProcess,
    make_demo_repository,
    mlp_reference,
    wait_for,
)

from mcpapi.v2 import control_pb2, control_pb2_grpc, inference_pb2, inference_pb2_grpc, model_pb2, worker_pb2
from mcpclient.mcpctl import main
from mcpcore import dtypes
from mcpcore.etcd_store import EtcdStore

X = np.random.default_rng(3).random((1, 64), dtype=np.float32)


def _mcpctl(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """``mcpctl ARGS`` in this process (its ``main``), which must succeed: what it printed."""
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out + err


def _forms(key: bytes) -> list[bytes]:
    b64 = base64.b64encode(key)
    url = base64.urlsafe_b64encode(key)
    return [key, key.hex().encode(), key.hex().upper().encode(), b64, b64.rstrip(b"="), url, url.rstrip(b"="),
            base64.b32encode(key), repr(key).encode()]  # fmt: skip


def _keys(keyring: Path) -> list[bytes]:
    return [base64.b64decode(v) for v in json.loads(keyring.read_text())["keys"].values()]


def _etcd_values(endpoint: str, prefix: str) -> bytes:
    async def read() -> bytes:
        async with EtcdStore([endpoint]) as store:
            items = await store.get_prefix(prefix)
            return b"\n".join(kv.key.encode() + b"=" + kv.value for kv in items.items)

    return asyncio.run(read())


def test_model_keys_appear_nowhere(tmp_path, etcd_endpoint, capsys):
    repo = make_demo_repository(tmp_path / "models")
    keyring, other = tmp_path / "keyring.json", tmp_path / "other.json"
    said = [_mcpctl(capsys, "keygen", "--keyring", str(keyring), "--key-id", "sec-key")]
    said.append(
        _mcpctl(capsys, "keygen", "--keyring", str(other), "--key-id", "sec-key")
    )  # same id, other key
    for ring, name in ((keyring, "demo-secret"), (other, "demo-wrong")):
        said.append(_mcpctl(capsys, "-o", "json", "encrypt-model", "--repo", str(repo), "--model", "demo-mlp",
                            "--version", "1", "--keyring", str(ring), "--key-id", "sec-key",
                            "--output-model", name))  # fmt: skip
    prefix = f"/ks{uuid.uuid4().hex[:6]}/mcp"
    worker = WorkerProcess(tmp_path, etcd_endpoint, repo, prefix=prefix, keyring=keyring)
    scheduler = SchedulerProcess(tmp_path, etcd_endpoint, prefix=prefix)
    router = RouterProcess(tmp_path, etcd_endpoint, prefix=prefix, scheduler="")
    for proc in (worker, scheduler, router):
        proc.env["MCP_LOG_LEVEL"] = "DEBUG"
    try:
        worker.start()
        # the other key under the same id, asked of the worker before a scheduler manages it (it would
        # unload what it did not place): refused, and the refusal names ids, never keys
        try:
            worker.control().Load(worker_pb2.LoadRequest(model="demo-wrong", version="1"), timeout=30)
            raise AssertionError("a model encrypted with another key loaded")
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED, err.details()
            said.append(err.details() or "")
        scheduler.start()
        router.start()
        control = control_pb2_grpc.ModelControlStub(scheduler.channel())
        spec = model_pb2.ModelSpec(model="demo-secret", versions=["1"], replicas=1)
        control.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=60)
        stub = inference_pb2_grpc.InferenceStub(router.channel())
        t = inference_pb2.Tensor(
            name="INPUT0", dtype=dtypes.wire_value("FP32"), shape=[1, 64], data=X.tobytes()
        )

        def answer() -> list[np.ndarray]:
            try:
                reply = stub.Infer(inference_pb2.InferRequest(model="demo-secret", inputs=[t]), timeout=10)
            except grpc.RpcError:
                return []
            return [np.frombuffer(reply.outputs[0].data, np.float32).reshape(1, -1)]

        (got,) = wait_for(answer, 30, 0.1, "demo-secret served")
        np.testing.assert_allclose(got, mlp_reference(repo, "demo-mlp", "1", X), rtol=1e-5, atol=1e-5)
        said += [p.metrics_text() for p in (worker, scheduler, router)]
        said.append(_mcpctl(capsys, "--etcd", etcd_endpoint, "-o", "json", "dump", "--prefix", prefix))
    finally:
        for proc in reversed((worker, scheduler, router)):
            proc.stop()
    seen = b"\n".join(
        [s.encode() for s in said]
        + [p.log.read_bytes() for p in (worker, scheduler, router)]
        + [_etcd_values(etcd_endpoint, prefix)]
    )
    # the search covers what the mesh said about these models and keys (ids only)
    logs = b"".join(p.log.read_bytes() for p in (worker, scheduler, router))
    assert b"demo-secret" in logs and b'"level": "DEBUG"' in worker.log.read_bytes()
    assert "sec-key" in said[-5]  # the refusal (before the 3 metrics texts and the dump) names the key id
    for key in (*_keys(keyring), *_keys(other)):
        for form in _forms(key):
            assert form not in seen, "a model key (or an encoding of it) appeared in the mesh's output"
