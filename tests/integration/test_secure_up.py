"""``make up SECURE=1`` for real, probed as an attacker probes it: every door (the router's gRPC and REST,
the scheduler, the health service, each worker's control port, etcd) refuses plaintext, a caller without
a certificate and one with a certificate of another CA; the application's certificate infers but is
refused control, logging settings and shared memory; a ZeroMQ peer without an allow-listed CURVE key
gets nothing from a worker; etcd refuses no user and a wrong password. Each refusal sits beside the same
call made with the right identity, which succeeds, so a refusal is the door's and not a broken call.

Slow and on ``make up``'s fixed ports (DESIGN.md section 13): ``make secure-test`` runs it (``.ci/run``
calls it), not ``make test``; a cluster already running fails it at once (``make down`` first).
"""

from __future__ import annotations

import contextlib
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import zmq
import zmq.auth
import zmq.utils.monitor
from test_security import _code, client_tls, https

from mcp_devcluster.certs import make_certs
from mcp_devcluster.launcher import HEALTH, ROUTER, ROUTER_REST, SCHEDULER
from mcpapi.kserve import grpc_service_pb2 as kserve_pb
from mcpapi.kserve import grpc_service_pb2_grpc as kserve_grpc
from mcpapi.v2 import control_pb2, control_pb2_grpc, model_pb2, tensor_pb2, worker_pb2, worker_pb2_grpc
from mcpcore import wire

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / ".run"
WORKERS = {"worker-1": ("127.0.0.1:50061", "tcp://127.0.0.1:5561"),
           "worker-2": ("127.0.0.1:50062", "tcp://127.0.0.1:5562")}  # fmt: skip
GRPC_DOORS = {"router": ROUTER, "scheduler": SCHEDULER, "health": HEALTH,
              **{w: control for w, (control, _) in WORKERS.items()}}  # fmt: skip
ETCD = "127.0.0.1:2379"
X = np.random.default_rng(5).random((1, 64), dtype=np.float32)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``make up SECURE=1`` from the repository, as a user runs it; ``make down`` after. A cluster of
    yours already running is left alone: the test fails before it starts anything."""
    if running := sorted(p.name for p in RUN.glob("*.pid")):
        pytest.fail(f"a local cluster is running ({', '.join(running)} in .run/): `make down` first")
    env = {k: v for k, v in os.environ.items() if k != "MCP_ETCD_ENDPOINTS"}
    up = subprocess.run(["make", "up", "SECURE=1"], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=420, check=False)  # fmt: skip
    try:
        assert up.returncode == 0, f"make up SECURE=1 failed:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}"
        rogue = make_certs(tmp_path_factory.mktemp("rogue"), workers=list(WORKERS))  # same names, other CA
        yield up.stdout, RUN / "certs", rogue
    finally:
        subprocess.run(["make", "down"], cwd=ROOT, capture_output=True, timeout=120, check=False)


def _health_check(channel: grpc.Channel) -> grpc.StatusCode:
    check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=bytes,
                                response_deserializer=bytes)  # fmt: skip
    try:
        return _code(lambda: check(b"", timeout=5))[0]
    finally:
        channel.close()


def _as(certs: Path, name: str | None, address: str) -> grpc.Channel:
    return grpc.secure_channel(address, client_tls(certs, name).channel_credentials())


def test_up_prints_how_to_reach_it_and_the_demo_ran(cluster):
    out, certs, _ = cluster
    assert "demo client: demo-mlp/" in out
    for line in ("mcpctl (as admin):  . .run/mcpctl.env", "tritonclient gRPC (as client)",
                 "tritonclient HTTP (as client)", "curl:  curl --cacert .run/certs/ca.pem",
                 "etcdctl:"):  # fmt: skip
        assert line in out, line
    assert oct((RUN / "secrets" / "etcd-mesh").stat().st_mode & 0o777) == "0o600"
    assert oct((certs / "client.key").stat().st_mode & 0o777) == "0o600"
    assert not (certs / "ca.key").exists()  # nothing more is issued: the CA's key is gone


@pytest.mark.parametrize("door", sorted(GRPC_DOORS))
def test_every_grpc_door_refuses_plaintext_no_certificate_and_a_foreign_ca(cluster, door):
    _, certs, rogue = cluster
    address = GRPC_DOORS[door]
    assert _health_check(grpc.insecure_channel(address)) == grpc.StatusCode.UNAVAILABLE
    assert _health_check(_as(certs, None, address)) == grpc.StatusCode.UNAVAILABLE  # no certificate
    foreign = grpc.ssl_channel_credentials(  # trusts the real CA, presents the other CA's client
        (certs / "ca.pem").read_bytes(), (rogue / "client.key").read_bytes(),
        (rogue / "client.pem").read_bytes(),
    )  # fmt: skip
    assert _health_check(grpc.secure_channel(address, foreign)) == grpc.StatusCode.UNAVAILABLE
    assert _health_check(_as(certs, "client", address)) == grpc.StatusCode.OK


def _https(
    certs: Path, path: str, name: str | None, body: dict | None = None, **trust: Path
) -> tuple[int, dict]:
    return https(ROUTER_REST, certs, path, name, body, **trust)


REFUSED = (urllib.error.URLError, ConnectionError, ssl.SSLError)


def test_the_rest_door_refuses_plaintext_no_certificate_and_a_foreign_ca(cluster):
    _, certs, rogue = cluster
    with pytest.raises(REFUSED):
        urllib.request.urlopen(f"http://{ROUTER_REST}/v2/health/ready", timeout=10)
    with pytest.raises(REFUSED):  # no client certificate (TLS 1.3: the refusal comes on the first read)
        _https(certs, "/v2/health/ready", None)
    with pytest.raises(REFUSED):
        _https(certs, "/v2/health/ready", "client", client_certs=rogue)
    with pytest.raises(REFUSED):  # nor does a client that trusts another CA take the router for real
        _https(certs, "/v2/health/ready", "client", ca=rogue / "ca.pem")
    assert _https(certs, "/v2/health/ready", "client")[0] == 200


def test_the_application_certificate_infers_and_is_refused_control_logging_and_shared_memory(cluster):
    _, certs, _ = cluster
    app = kserve_grpc.GRPCInferenceServiceStub(_as(certs, "client", ROUTER))
    admin = kserve_grpc.GRPCInferenceServiceStub(_as(certs, "admin", ROUTER))
    request = kserve_pb.ModelInferRequest(model_name="demo-mlp")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(X.tobytes())

    def answers() -> bool:
        reply = app.ModelInfer(request, timeout=10)
        return len(reply.raw_output_contents[0]) == 4 * int(np.prod(reply.outputs[0].shape)) > 0

    assert answers()
    refused_and_allowed = [
        (lambda s: s.LogSettings(kserve_pb.LogSettingsRequest(), timeout=10), app, admin),
        (lambda s: s.SystemSharedMemoryRegister(kserve_pb.SystemSharedMemoryRegisterRequest(
            name="r", key="/no-such-object", byte_size=8), timeout=10), app, admin),
        (lambda s: s.RepositoryModelUnload(
            kserve_pb.RepositoryModelUnloadRequest(model_name="no-such-model"), timeout=10), app, admin),
    ]  # fmt: skip
    scheduler = [control_pb2_grpc.ModelControlStub(_as(certs, n, SCHEDULER)) for n in ("client", "admin")]
    unload = control_pb2.UnloadModelRequest(model="no-such-model")
    refused_and_allowed.append((lambda s: s.UnloadModel(unload, timeout=10), *scheduler))
    load = control_pb2.LoadModelRequest(
        spec=model_pb2.ModelSpec(model="demo-onnx", versions=["1"], replicas=2)
    )
    refused_and_allowed.append((lambda s: s.LoadModel(load, timeout=10), scheduler[0], None))
    worker = worker_pb2_grpc.WorkerControlStub(_as(certs, "client", WORKERS["worker-1"][0]))
    pause = worker_pb2.PauseRequest(model="demo-mlp", version="1")
    refused_and_allowed.append((lambda s: s.Pause(pause, timeout=10), worker, None))
    for call, as_app, as_admin in refused_and_allowed:
        code, message = _code(lambda call=call, stub=as_app: call(stub))
        assert code == grpc.StatusCode.PERMISSION_DENIED, (code, message)
        assert message.endswith("this one's is client"), message
        if as_admin is not None:  # the same call, by an operator, gets past the check
            code, message = _code(lambda call=call, stub=as_admin: call(stub))
            assert code != grpc.StatusCode.PERMISSION_DENIED, message
    region = {"key": "/x", "offset": 0, "byte_size": 8}
    for path, body in (("/v2/logging", {"log_verbose_level": 1}),
                       ("/v2/systemsharedmemory/region/r/register", region),
                       ("/v2/repository/models/demo-mlp/unload", {})):  # fmt: skip
        status, reply = _https(certs, path, "client", body)
        assert status == 403 and "this one's is client" in reply["error"], (path, reply)
    assert answers()  # nothing was unloaded or paused


def _dealer(endpoint: str, server_key: bytes | None, keypair: tuple[bytes, bytes] | None) -> tuple[Any, Any]:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    if keypair is not None:
        sock.curve_serverkey = server_key
        sock.curve_publickey, sock.curve_secretkey = keypair
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                      | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                      | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)  # fmt: skip
    sock.connect(endpoint)
    return sock, monitor


def _handshake(monitor: Any) -> int:
    assert monitor.poll(10_000), "no handshake event in 10 s"
    return zmq.utils.monitor.recv_monitor_message(monitor)["event"]


@pytest.mark.parametrize("worker", sorted(WORKERS))
def test_zeromq_without_an_allowed_curve_key_gets_nothing(cluster, worker):
    _, certs, _ = cluster
    endpoint = WORKERS[worker][1]
    server_key, _ = zmq.auth.load_certificate(certs / "curve" / f"{worker}.key")
    header = tensor_pb2.TensorHeader(kind=tensor_pb2.KIND_REQUEST, request_id=f"{worker}-probe",
                                     model="demo-mlp", version="1", timeout_us=5_000_000)  # fmt: skip
    frames = wire.encode(header, {"INPUT0": X})
    plain, watch_plain = _dealer(endpoint, None, None)  # no CURVE at all
    stranger, watch_stranger = _dealer(endpoint, server_key, zmq.curve_keypair())  # a key not allowed
    allowed, watch_allowed = _dealer(endpoint, server_key, zmq.auth.load_certificate(
        certs / "curve" / "client.key_secret"))  # fmt: skip
    try:
        assert _handshake(watch_plain) != zmq.EVENT_HANDSHAKE_SUCCEEDED
        assert _handshake(watch_stranger) == zmq.EVENT_HANDSHAKE_FAILED_AUTH
        assert _handshake(watch_allowed) == zmq.EVENT_HANDSHAKE_SUCCEEDED
        for sock in (plain, stranger):
            with contextlib.suppress(zmq.Again):  # queued at most: a refused link delivers nothing
                sock.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
        allowed.send_multipart(frames, copy=False)
        assert allowed.poll(10_000), "the allow-listed key got no answer"
        wire.raise_for_status(wire.decode(allowed.recv_multipart()).header)
        assert plain.poll(0) == 0 and stranger.poll(0) == 0  # the answer came; theirs did not
    finally:
        for sock in (plain, watch_plain, stranger, watch_stranger, allowed, watch_allowed):
            sock.close(linger=0)


def _etcdctl(certs: Path, *args: str, user: str = "", url: str = f"https://{ETCD}") -> Any:
    cmd = ["etcdctl", f"--endpoints={url}", f"--cacert={certs / 'ca.pem'}", "--dial-timeout=3s",
           "--command-timeout=5s", *args]  # fmt: skip
    env = {**os.environ, "ETCDCTL_API": "3", **({"ETCDCTL_USER": user} if user else {})}  # not in argv
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False, env=env)


def test_etcd_refuses_plaintext_no_user_and_a_wrong_password(cluster):
    _, certs, _ = cluster
    read = ("get", "--prefix", "--keys-only", "/mcp/")
    mesh = "mesh:" + (RUN / "secrets" / "etcd-mesh").read_text().strip()
    plaintext = _etcdctl(certs, *read, user=mesh, url=f"http://{ETCD}")  # the right user, in clear
    assert plaintext.returncode != 0 and "/mcp/" not in plaintext.stdout, plaintext.stdout
    no_user = _etcdctl(certs, *read)
    assert no_user.returncode != 0 and "user name is empty" in no_user.stderr, no_user.stderr
    wrong = _etcdctl(certs, *read, user="mesh:guess")
    assert wrong.returncode != 0 and "authentication failed" in wrong.stderr, wrong.stderr
    right = _etcdctl(certs, *read, user=mesh)
    assert right.returncode == 0 and "/mcp/workers/worker-1" in right.stdout, right.stderr
    outside = _etcdctl(certs, "put", "/elsewhere", "x", user=mesh)
    assert outside.returncode != 0 and "permission denied" in outside.stderr, outside.stderr


TRITON = """
import sys, gevent.ssl, numpy as np, tritonclient.grpc, tritonclient.http
kind, client = sys.argv[1], {expr}
module = tritonclient.grpc if kind == "gRPC" else tritonclient.http
tensor = module.InferInput("INPUT0", [1, 64], "FP32")
tensor.set_data_from_numpy(np.ones((1, 64), np.float32))
print(client.infer("demo-mlp", [tensor]).as_numpy("OUTPUT0").shape)
"""


@pytest.mark.parametrize("kind", ["gRPC", "HTTP"])
def test_the_printed_tritonclient_lines_work_as_printed(cluster, kind):
    """The client ``make up SECURE=1`` tells a Triton user to build, run from the repository as printed."""
    out, _, _ = cluster
    marker = f"tritonclient {kind} (as client):  "
    expr = next(line.split(marker, 1)[1] for line in out.splitlines() if marker in line)
    done = subprocess.run([sys.executable, "-c", TRITON.format(expr=expr), kind], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip().startswith("(1, "), done.stderr[-2000:]
