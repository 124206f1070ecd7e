"""A real worker subprocess against a real etcd, driven over gRPC control and ZeroMQ tensors."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import yaml
import zmq
import zmq.auth
from harness import (
    TensorClient,
    WorkerProcess,
    etcd_get,
    load_and_run,
    make_demo_repository,
    metric,
    mlp_reference,
    wait_for,
)

from mcpapi.v2 import model_pb2, tensor_pb2, worker_pb2
from mcpcore import wire
from mcpcore.errors import (
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
)
from mcpcore.keyring import Keyring, generate_key
from mcpcore.keys import Keyspace
from mcpcore.model_encryption import encrypt_model_bytes

X = np.random.default_rng(7).random((5, 64), dtype=np.float32)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = make_demo_repository(tmp_path_factory.mktemp("repo") / "models")
    keyring = Keyring.load(root / "keyring.json")
    plain = (root / "demo-mlp" / "1" / "weights.safetensors").read_bytes()

    def encrypted_variant(name: str, blob: bytes) -> None:
        target = root / name / "1"
        shutil.copytree(root / "demo-mlp-enc" / "1", target)
        (target / "weights.safetensors.enc").write_bytes(blob)

    demo_key = keyring.get("demo-key")
    # the right key id but other key material: PERMISSION_DENIED
    encrypted_variant(
        "demo-wrongkey",
        encrypt_model_bytes(plain, key=generate_key(), key_id="demo-key", model="demo-wrongkey", version="1"),
    )
    # one flipped ciphertext byte: DATA_LOSS
    blob = bytearray(
        encrypt_model_bytes(plain, key=demo_key, key_id="demo-key", model="demo-tampered", version="1")
    )
    blob[len(blob) // 2] ^= 0x01
    encrypted_variant("demo-tampered", bytes(blob))
    # demo-mlp-enc's file copied under another model name: authenticated data differs, DATA_LOSS
    encrypted_variant("demo-copied", (root / "demo-mlp-enc" / "1" / "weights.safetensors.enc").read_bytes())
    # declares more memory than any worker has: RESOURCE_EXHAUSTED, nothing loaded
    huge = root / "demo-huge" / "1"
    shutil.copytree(root / "demo-mlp" / "1", huge)
    doc = yaml.safe_load((huge / "model.yaml").read_text())
    doc["memory_bytes"] = 1 << 40
    (huge / "model.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return root


@pytest.fixture(scope="module")
def prefix():
    return f"/t{uuid.uuid4().hex[:8]}/mcp"


@pytest.fixture(scope="module")
def worker(tmp_path_factory, etcd_endpoint, repo, prefix):
    proc = WorkerProcess(
        tmp_path_factory.mktemp("worker"),
        etcd_endpoint,
        repo,
        prefix=prefix,
        keyring=repo / "keyring.json",
        memory_capacity_bytes=256 << 20,
    ).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def control(worker):
    return worker.control()


@pytest.fixture
def client(worker):
    with TensorClient(worker.endpoints["zmq"]) as c:
        yield c


def replica(endpoint: str, prefix: str, model: str, worker_id: str, version: str = "1") -> dict | None:
    return etcd_get(endpoint, Keyspace(prefix).replica(model, version, worker_id))


def test_worker_registers_under_its_lease(worker, etcd_endpoint, prefix):
    record = wait_for(lambda: etcd_get(etcd_endpoint, Keyspace(prefix).worker(worker.worker_id)))
    assert record["zmq"] == worker.endpoints["zmq"] and record["grpc"] == worker.endpoints["grpc"]
    report = wait_for(lambda: etcd_get(etcd_endpoint, Keyspace(prefix).worker_load(worker.worker_id)))
    assert report["memory_capacity_bytes"] == 256 << 20 and "queue_depth" in report


def test_load_infer_pause_resume_unload(worker, control, client, repo, etcd_endpoint, prefix):
    loaded = control.Load(worker_pb2.LoadRequest(model="demo-mlp", version="1"), timeout=30)
    assert model_pb2.ModelState.Name(loaded.replica.state) == "READY"
    assert [t.name for t in loaded.inputs] == ["INPUT0"] and list(loaded.outputs[0].shape) == [-1, 16]
    assert replica(etcd_endpoint, prefix, "demo-mlp", worker.worker_id)["state"] == "READY"

    control.Resume(worker_pb2.ResumeRequest(model="demo-mlp", version="1"), timeout=10)
    assert replica(etcd_endpoint, prefix, "demo-mlp", worker.worker_id)["state"] == "RUNNING"
    out = client.infer("demo-mlp", {"INPUT0": X}, version="1").named()["OUTPUT0"]
    np.testing.assert_allclose(out, mlp_reference(repo, "demo-mlp", "1", X), rtol=1e-5, atol=1e-5)

    control.Pause(worker_pb2.PauseRequest(model="demo-mlp", version="1"), timeout=10)
    assert replica(etcd_endpoint, prefix, "demo-mlp", worker.worker_id)["state"] == "PAUSED"
    with pytest.raises(Unavailable, match="paused"):
        client.infer("demo-mlp", {"INPUT0": X})
    control.Resume(worker_pb2.ResumeRequest(model="demo-mlp", version="1"), timeout=10)
    client.infer("demo-mlp", {"INPUT0": X})

    unloaded = control.Unload(worker_pb2.UnloadRequest(model="demo-mlp", version="1"), timeout=10)
    assert model_pb2.ModelState.Name(unloaded.replica.state) == "IDLE"
    record = replica(etcd_endpoint, prefix, "demo-mlp", worker.worker_id)
    assert record["state"] == "IDLE"
    assert [t["to"] for t in record["transitions"]][-3:] == ["RUNNING", "UNLOADING", "IDLE"]
    client.send("demo-mlp", {"INPUT0": X})
    reply = client.recv().header  # not held here: not started, so a router may send it elsewhere
    assert reply.status_code == int(Unavailable.code) and reply.flags & wire.FLAG_RETRYABLE
    assert "demo-mlp" in reply.status_message


def test_onnx_model_matches_onnxruntime_run_directly(control, client, repo):
    load_and_run(control, "demo-onnx")
    path = str(repo / "demo-onnx" / "1" / "model.onnx")
    (expected,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(
        ["OUTPUT0"], {"INPUT0": X}
    )
    out = client.infer("demo-onnx", {"INPUT0": X}).named()["OUTPUT0"]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_encrypted_model_decrypts_in_memory(control, client, repo):
    load_and_run(control, "demo-mlp-enc")
    out = client.infer("demo-mlp-enc", {"INPUT0": X}).tensors[0]
    np.testing.assert_allclose(out, mlp_reference(repo, "demo-mlp", "1", X), rtol=1e-5, atol=1e-5)


def test_64_concurrent_requests_are_batched_and_exact(worker, control, client, repo):
    load_and_run(control, "demo-mlp", "2")
    rng = np.random.default_rng(64)
    rows = rng.random((64, 1, 64), np.float32)
    inputs = {client.send("demo-mlp", {"INPUT0": x}, version="2"): x for x in rows}
    for _ in inputs:
        msg = client.recv()
        wire.raise_for_status(msg.header)
        expected = mlp_reference(repo, "demo-mlp", "2", inputs[msg.header.request_id])
        np.testing.assert_allclose(msg.tensors[0], expected, rtol=1e-5, atol=1e-5)
    text = worker.metrics_text()
    labels = 'model="demo-mlp",version="2"'
    batches = float(re.search(rf"mcp_batch_size_count\{{{labels}\}} (\S+)", text).group(1))
    requests = float(re.search(rf"mcp_batch_size_sum\{{{labels}\}} (\S+)", text).group(1))
    assert requests == 64 and batches < 64, (requests, batches)  # some batch held more than one request


@pytest.mark.parametrize(
    ("model", "inputs", "error", "match"),
    [
        ("no-such-model", {"INPUT0": X}, Unavailable, "no-such-model"),
        ("demo-mlp", {"INPUT0": X.astype(np.float64)}, InvalidArgument, "expected dtype FP32, got FP64"),
        ("demo-mlp", {"INPUT0": X[:, :63]}, InvalidArgument, r"expected shape \[-1, 64\], got \[5, 63\]"),
        ("demo-mlp", {"WRONG": X}, InvalidArgument, "missing"),
        ("demo-mlp", {"INPUT0": np.zeros((65, 64), np.float32)}, InvalidArgument, "batch size 65"),
        ("demo-mlp", {"INPUT0": np.zeros((17 << 12, 64), np.float32)}, ResourceExhausted, "frame limit"),
    ],
    ids=["unknown-model", "wrong-dtype", "wrong-shape", "wrong-name", "over-max-batch", "oversize-frame"],
)
def test_bad_requests_get_clear_errors_and_the_worker_goes_on(control, client, model, inputs, error, match):
    load_and_run(control, "demo-mlp")
    with pytest.raises(error, match=match):
        client.infer(model, inputs)
    client.infer("demo-mlp", {"INPUT0": X})
    # only what another worker could serve is marked "not started": bad input fails the same anywhere
    client.send(model, inputs)
    assert bool(client.recv().header.flags & wire.FLAG_RETRYABLE) == (error is Unavailable)


def test_malformed_frames_get_error_replies(control, client):
    load_and_run(control, "demo-mlp")
    header = tensor_pb2.TensorHeader(kind=tensor_pb2.KIND_REQUEST, request_id="t", model="demo-mlp")
    frames = wire.encode(header, {"INPUT0": X})
    client.sock.send_multipart([frames[0], bytes(frames[1])[:-4]])  # truncated tensor frame
    with pytest.raises(InvalidArgument, match="frame has 1276 bytes but its header says 1280"):
        wire.raise_for_status(client.recv().header)
    client.sock.send_multipart([b"\x0a\xff garbage"])
    with pytest.raises(InvalidArgument, match="not a TensorHeader"):
        wire.raise_for_status(client.recv().header)
    client.infer("demo-mlp", {"INPUT0": X})


@pytest.mark.parametrize(
    ("model", "code", "match"),
    [
        ("demo-wrongkey", grpc.StatusCode.PERMISSION_DENIED, "encrypted with a different key"),
        ("demo-tampered", grpc.StatusCode.DATA_LOSS, "failed authentication"),
        ("demo-copied", grpc.StatusCode.DATA_LOSS, "another model or version"),
    ],
)
def test_bad_encrypted_files_fail_the_load_into_error(
    worker, control, client, repo, etcd_endpoint, prefix, model, code, match
):
    with pytest.raises(grpc.RpcError) as info:
        control.Load(worker_pb2.LoadRequest(model=model, version="1"), timeout=30)
    assert info.value.code() == code and match in info.value.details()
    record = replica(etcd_endpoint, prefix, model, worker.worker_id)
    assert record["state"] == "ERROR" and match in record["reason"]
    load_and_run(control, "demo-mlp")
    client.infer("demo-mlp", {"INPUT0": X})
    key = Keyring.load(repo / "keyring.json").get("demo-key")
    log = worker.log.read_text()
    assert base64.b64encode(key).decode() not in log and key.hex() not in log  # no key material logged


def test_load_over_budget_loads_nothing(worker, control, client, etcd_endpoint, prefix):
    used = control.Stats(worker_pb2.StatsRequest(), timeout=5).memory_used_bytes
    with pytest.raises(grpc.RpcError) as info:
        control.Load(worker_pb2.LoadRequest(model="demo-huge", version="1"), timeout=30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "demo-huge/1 needs 1024.0 GiB" in info.value.details()
    assert control.Stats(worker_pb2.StatsRequest(), timeout=5).memory_used_bytes == used
    assert replica(etcd_endpoint, prefix, "demo-huge", worker.worker_id) is None
    load_and_run(control, "demo-mlp")
    client.infer("demo-mlp", {"INPUT0": X})


def test_control_validates_its_input(control):
    cases = [
        (worker_pb2.LoadRequest(model="../etc", version="1"), grpc.StatusCode.INVALID_ARGUMENT, "model name"),
        (worker_pb2.LoadRequest(model="demo-mlp", version="v1"), grpc.StatusCode.INVALID_ARGUMENT, "version"),
        (worker_pb2.LoadRequest(model="absent", version="1"), grpc.StatusCode.NOT_FOUND, "not in repository"),
        (
            worker_pb2.LoadRequest(model="demo-mlp", version="1", model_path="/etc"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "model_path",
        ),
    ]
    for request, code, match in cases:
        with pytest.raises(grpc.RpcError) as info:
            control.Load(request, timeout=10)
        assert info.value.code() == code and match in info.value.details(), info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        control.Pause(worker_pb2.PauseRequest(model="never-loaded", version="1"), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_illegal_transition_is_failed_precondition(control):
    control.Load(worker_pb2.LoadRequest(model="demo-onnx", version="2"), timeout=30)  # READY
    with pytest.raises(grpc.RpcError) as info:
        control.Pause(worker_pb2.PauseRequest(model="demo-onnx", version="2"), timeout=10)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "READY -> PAUSED" in info.value.details()


def test_emergency_stop_answers_queued_requests_and_checkpoints(tmp_path, etcd_endpoint, repo, prefix):
    proc = WorkerProcess(tmp_path, etcd_endpoint, repo, prefix=prefix, exec_slots=1).start()
    client = TensorClient(proc.endpoints["zmq"])
    try:
        control = proc.control()
        load_and_run(control, "demo-slow")
        sent = [client.send("demo-slow", {"INPUT0": X[:1]}) for _ in range(40)]  # 50 ms per batch of <= 8
        wait_for(
            lambda: control.Stats(worker_pb2.StatsRequest(), timeout=5).models[0].in_flight > 0,
            what="a batch executing",
        )
        stop = control.EmergencyStop(worker_pb2.EmergencyStopRequest(reason="gpu xid 79"), timeout=30)
        assert stop.in_flight >= 1 and stop.last_active_unix_ms >= 0
        assert [(r.model, model_pb2.ModelState.Name(r.state)) for r in stop.replicas] == [
            ("demo-slow", "ERROR")
        ]
        checkpoint = json.loads(Path(stop.checkpoint_path).read_text())
        assert checkpoint["reason"] == "gpu xid 79" and len(checkpoint["in_flight"]) == stop.in_flight
        assert set(checkpoint["in_flight"]) | set(checkpoint["rejected"]) <= set(sent)
        assert checkpoint["replicas"][0]["state"] == "RUNNING"

        replies = {}
        for _ in sent:
            msg = client.recv()
            replies[msg.header.request_id] = msg.header
        rejected = [h for h in replies.values() if h.status_code]
        assert len(rejected) == len(checkpoint["rejected"]) > 0
        for h in rejected:
            assert h.status_code == grpc.StatusCode.UNAVAILABLE.value[0] and h.flags & wire.FLAG_RETRYABLE
            assert "emergency stop: gpu xid 79" in h.status_message
        assert len(replies) - len(rejected) >= stop.in_flight  # what was executing finished normally

        assert replica(etcd_endpoint, prefix, "demo-slow", proc.worker_id)["state"] == "ERROR"
        assert control.Stats(worker_pb2.StatsRequest(), timeout=5).memory_used_bytes == 0
        with pytest.raises(grpc.RpcError) as info:
            control.Load(worker_pb2.LoadRequest(model="demo-mlp", version="1"), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        client.close()
        proc.stop()


def test_reregisters_and_republishes_after_etcd_loses_everything(tmp_path, restartable_etcd, repo, prefix):
    keys = Keyspace(prefix)
    proc = WorkerProcess(
        tmp_path, restartable_etcd.endpoint, repo, prefix=prefix, lease_ttl_s=2, heartbeat_interval_s=0.2
    ).start()
    client = TensorClient(proc.endpoints["zmq"])
    try:
        control = proc.control()
        load_and_run(control, "demo-mlp")
        load_and_run(control, "demo-onnx")
        load_and_run(control, "demo-stateful")
        control.Pause(worker_pb2.PauseRequest(model="demo-onnx", version="1"), timeout=10)

        restartable_etcd.stop()
        shutil.rmtree(restartable_etcd.data_dir)  # a new, empty etcd: nothing of the worker is left
        client.infer("demo-mlp", {"INPUT0": X})  # etcd gone: the worker keeps serving
        restartable_etcd.start()  # waits until healthy

        wait_for(
            lambda: etcd_get(restartable_etcd.endpoint, keys.worker(proc.worker_id)), what="re-registration"
        )
        # the worker record and each held replica's real state come back in one transaction
        for model, state in (("demo-mlp", "RUNNING"), ("demo-onnx", "PAUSED"), ("demo-stateful", "RUNNING")):
            wait_for(
                lambda m=model, st=state: (
                    (replica(restartable_etcd.endpoint, prefix, m, proc.worker_id) or {}).get("state") == st
                ),
                what=f"{model} re-published as {state}",
            )
        # re-created whole: what routers decide by (idempotency, limits, I/O) and whose process wrote it
        incarnation = etcd_get(restartable_etcd.endpoint, keys.worker(proc.worker_id))["incarnation"]
        for model, idempotent in (("demo-mlp", True), ("demo-stateful", False)):
            info = replica(restartable_etcd.endpoint, prefix, model, proc.worker_id)["info"]
            assert (info["idempotent"], info["incarnation"]) == (idempotent, incarnation), info
            assert info["outputs"] and info["max_ongoing_requests"] > 0
        report = wait_for(lambda: etcd_get(restartable_etcd.endpoint, keys.worker_load(proc.worker_id)))
        assert set(report["models"]) == {"demo-mlp/1", "demo-onnx/1", "demo-stateful/1"}
        client.infer("demo-mlp", {"INPUT0": X})
    finally:
        client.close()
        proc.stop()


def test_curve_keys_admit_only_clients_that_know_the_server_key(tmp_path, etcd_endpoint, repo, prefix):
    _, secret_file = zmq.auth.create_certificates(str(tmp_path), "worker")
    server_public, _ = zmq.auth.load_certificate(secret_file)
    proc = WorkerProcess(
        tmp_path, etcd_endpoint, repo, prefix=prefix, zmq_curve_secret_key_file=secret_file
    ).start()
    trusted = TensorClient(proc.endpoints["zmq"], curve_server_key=server_public)
    plain = TensorClient(proc.endpoints["zmq"])
    plain.sock.setsockopt(zmq.RCVTIMEO, 300)
    plain.sock.setsockopt(zmq.SNDTIMEO, 300)
    try:
        load_and_run(proc.control(), "demo-mlp")
        record = wait_for(lambda: etcd_get(etcd_endpoint, Keyspace(prefix).worker(proc.worker_id)))
        assert record["curve_public_key"] == server_public.decode()
        np.testing.assert_allclose(
            trusted.infer("demo-mlp", {"INPUT0": X}).tensors[0],
            mlp_reference(repo, "demo-mlp", "1", X),
            rtol=1e-5,
        )
        # The handshake never completes, so no reply can come. Once libzmq has seen the handshake
        # fail it drops the pipe, and then the send itself cannot go anywhere: either is a refusal.
        with pytest.raises(zmq.Again):
            plain.send("demo-mlp", {"INPUT0": X})
            plain.recv()
    finally:
        trusted.close()
        plain.close()
        proc.stop()


def test_numa_pin_without_a_gpu_is_a_logged_no_op(tmp_path, etcd_endpoint, repo, prefix):
    proc = WorkerProcess(
        tmp_path, etcd_endpoint, repo, prefix=prefix, numa_pin="true", gpu_pci_bus_id="0000:ff:00.0"
    )
    proc.args = [a for a in proc.args if a != "true"]  # a boolean flag takes no value
    proc.args[proc.args.index("--numa-pin")] = "--numa-pin"
    proc.start()
    try:
        load_and_run(proc.control(), "demo-mlp")
        assert "numa: not pinning" in proc.log.read_text()
    finally:
        proc.stop()


def _blas_default() -> int:
    """The threads a fresh process's BLAS (the one numpy links) would use by its own default."""
    code = (
        "import numpy, threadpoolctl; print(max(i['num_threads'] for i in threadpoolctl.threadpool_info() "
        "if i['user_api'] == 'blas'))"
    )
    return int(
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    )


def test_blas_threads_cap_numpy_matrix_products(
    worker, control, client, tmp_path, etcd_endpoint, repo, prefix
):
    """By default one BLAS thread per matrix product (parallelism is exec_slots'); BLAS's own pool spins
    between batches. 0 leaves the library's default. The worker reports what the library says."""
    assert metric(worker.metrics_text(), "mcp_worker_blas_threads") == 1
    load_and_run(control, "demo-mlp")  # a capped worker still answers, exactly
    x = np.random.default_rng(3).random((64, 64), np.float32)  # 64 rows: past OpenBLAS's one-thread size
    client.send("demo-mlp", {"INPUT0": x}, version="1")
    msg = client.recv()
    wire.raise_for_status(msg.header)
    np.testing.assert_allclose(msg.tensors[0], mlp_reference(repo, "demo-mlp", "1", x), rtol=1e-5, atol=1e-5)
    uncapped = WorkerProcess(tmp_path, etcd_endpoint, repo, prefix=prefix, blas_threads=0).start()
    try:
        assert metric(uncapped.metrics_text(), "mcp_worker_blas_threads") == _blas_default()
    finally:
        uncapped.stop()
