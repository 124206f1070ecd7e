"""A mesh that lets no one in unasked: mutual TLS on every gRPC port, control APIs behind an allow-list,
CURVE with a ZAP allow-list on the tensor path, and worker records signed so that a forged etcd record
cannot redirect tensors (README "Securing a cluster").

One secured mesh for the module, from ``make certs``' generator: a worker (CURVE, its key allow-listing
the router's and the SDK's public keys), a scheduler and a router, each with its own certificate; the
scheduler's calls to the worker and the router's calls to both go over mutual TLS with those identities.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import zmq
from harness import (
    HealthProcess,
    RouterProcess,
    SchedulerProcess,
    WorkerProcess,
    etcd_get,
    etcd_put,
    metric,
    mlp_reference,
    wait_for,
)

from mcp_devcluster.certs import make_certs
from mcpapi.kserve import grpc_service_pb2 as kserve_pb
from mcpapi.kserve import grpc_service_pb2_grpc as kserve_grpc
from mcpapi.v2 import (
    control_pb2,
    control_pb2_grpc,
    health_pb2,
    health_pb2_grpc,
    inference_pb2,
    inference_pb2_grpc,
    model_pb2,
    tensor_pb2,
    worker_pb2,
    worker_pb2_grpc,
)
from mcpclient import MeshClient, PermissionDenied, TLSConfig, Unavailable
from mcpclient.mcpctl import main as mcpctl_main
from mcpcore import dtypes, wire
from mcpcore.keys import Keyspace
from mcpcore.record_signing import RecordSigner, local_claim, payload

WORKER = f"w-sec-{uuid.uuid4().hex[:4]}"
X = np.random.default_rng(11).random((1, 64), dtype=np.float32)


def _make_certs(out: Path, workers: list[str]) -> Path:
    return make_certs(out, workers=workers)


def tls_env(service: str, certs: Path, name: str) -> dict[str, str]:
    p = f"MCP_{service}_TLS__"
    return {f"{p}CA_FILE": str(certs / "ca.pem"), f"{p}CERT_FILE": str(certs / f"{name}.pem"),
            f"{p}KEY_FILE": str(certs / f"{name}.key")}  # fmt: skip


def client_tls(certs: Path, name: str | None) -> TLSConfig:
    if name is None:
        return TLSConfig(ca_file=str(certs / "ca.pem"))
    return TLSConfig(str(certs / "ca.pem"), str(certs / f"{name}.pem"), str(certs / f"{name}.key"))


def secure(address: str, certs: Path, name: str | None) -> grpc.Channel:
    return grpc.secure_channel(address, client_tls(certs, name).channel_credentials())


class Secured:
    def __init__(self, tmp: Path, etcd: str, repo: Path) -> None:
        self.certs = _make_certs(tmp / "certs", [WORKER, "w-other"])
        self.rogue = _make_certs(tmp / "rogue", [WORKER])  # another CA, same names
        self.prefix = f"/sec{uuid.uuid4().hex[:6]}/mcp"
        self.etcd = etcd
        curve = self.certs / "curve"
        self.worker = WorkerProcess(
            tmp, etcd, repo, prefix=self.prefix, worker_id=WORKER,
            zmq_curve_secret_key_file=curve / f"{WORKER}.key_secret", zmq_curve_clients_dir=curve / "clients",
        )  # fmt: skip
        self.worker.env.update(tls_env("WORKER", self.certs, WORKER))
        self.scheduler = SchedulerProcess(tmp, etcd, prefix=self.prefix)
        self.scheduler.env.update(tls_env("SCHEDULER", self.certs, "mcp-scheduler"))
        self.procs = [self.worker.start(), self.scheduler.start()]
        self.router = RouterProcess(
            tmp, etcd, prefix=self.prefix, scheduler=self.scheduler.endpoints["grpc"],
            zmq_curve_secret_key_file=curve / "mcp-router.key_secret",
        )  # fmt: skip
        self.router.env.update(tls_env("ROUTER", self.certs, "mcp-router"))
        self.procs.append(self.router.start())
        self.health = HealthProcess(tmp, etcd, prefix=self.prefix)
        self.health.env.update(tls_env("HEALTH", self.certs, "mcp-health"))
        self.procs.append(self.health.start())

    def channel(self, service: str, name: str | None) -> grpc.Channel:
        return secure(self.proc(service).endpoints["grpc"], self.certs, name)

    def proc(self, service: str) -> Any:
        return {
            "router": self.router,
            "scheduler": self.scheduler,
            "worker": self.worker,
            "health": self.health,
        }[service]

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


@pytest.fixture(scope="module")
def mesh(tmp_path_factory, etcd_endpoint, repo):
    m = Secured(tmp_path_factory.mktemp("secured"), etcd_endpoint, repo)
    try:
        control = control_pb2_grpc.ModelControlStub(m.channel("scheduler", "admin"))
        spec = model_pb2.ModelSpec(model="demo-mlp", versions=["1"], replicas=1)
        control.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=60)
        wait_for(lambda: _infer(m.channel("router", "client")) is not None, 30, 0.1, "demo-mlp routed")
        yield m
    finally:
        m.close()


def _infer(channel: grpc.Channel) -> np.ndarray | None:
    t = inference_pb2.Tensor(name="INPUT0", dtype=dtypes.wire_value("FP32"), shape=[1, 64], data=X.tobytes())
    try:
        reply = inference_pb2_grpc.InferenceStub(channel).Infer(
            inference_pb2.InferRequest(model="demo-mlp", version="1", inputs=[t]), timeout=10
        )
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.UNAVAILABLE and "no RUNNING" in (err.details() or ""):
            return None
        raise
    out = reply.outputs[0]
    return np.frombuffer(out.data, np.float32).reshape(tuple(out.shape))


def _code(call) -> tuple[grpc.StatusCode, str]:  # type: ignore[no-untyped-def]
    try:
        call()
    except grpc.RpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


def test_an_application_certificate_infers_through_the_curve_path(mesh, repo):
    """Client cert -> router (mTLS) -> worker (CURVE, the router's key on the worker's allow-list)."""
    got = _infer(mesh.channel("router", "client"))
    np.testing.assert_allclose(got, mlp_reference(repo, "demo-mlp", "1", X), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("service", ["router", "scheduler", "worker", "health"])
def test_a_client_without_a_valid_certificate_is_refused(mesh, service):
    address = mesh.proc(service).endpoints["grpc"]
    health = "grpc.health.v1.Health/Check"
    for channel in (
        grpc.insecure_channel(address),  # plaintext: the TLS port does not speak it
        secure(address, mesh.certs, None),  # TLS without a client certificate
        grpc.secure_channel(address, client_tls(mesh.rogue, "admin").channel_credentials()),  # other CA
    ):
        check = channel.unary_unary(f"/{health}", request_serializer=bytes, response_deserializer=bytes)
        code, _ = _code(lambda c=check: c(b"", timeout=5))
        assert code == grpc.StatusCode.UNAVAILABLE, (service, code)
        channel.close()
    ok = mesh.channel(service, "client").unary_unary(f"/{health}", request_serializer=bytes)
    assert _code(lambda: ok(b"", timeout=5))[0] == grpc.StatusCode.OK


def test_health_answers_over_mutual_tls(mesh):
    stub = health_pb2_grpc.HealthStub(mesh.channel("health", "client"))
    wait_for(lambda: _code(lambda: stub.ClusterHealth(health_pb2.ClusterHealthRequest(), timeout=5))[0]
             == grpc.StatusCode.OK, 10, 0.1, "health's ClusterHealth over mTLS")  # fmt: skip


def test_a_request_over_the_size_limit_is_refused_and_the_service_serves_on(mesh):
    control = control_pb2_grpc.ModelControlStub(mesh.channel("scheduler", "admin"))
    spec = model_pb2.ModelSpec(model="demo-mlp", versions=["y" * (5 << 20)], replicas=1)
    code, message = _code(lambda: control.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=10))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, message)
    control.ListModels(control_pb2.ListModelsRequest(), timeout=10)


def test_control_apis_need_a_certificate_on_the_allow_list(mesh):
    spec = model_pb2.ModelSpec(model="demo-onnx", versions=["1"], replicas=1)
    load = control_pb2.LoadModelRequest(spec=spec)
    app = mesh.channel("scheduler", "client")
    code, message = _code(lambda: control_pb2_grpc.ModelControlStub(app).LoadModel(load, timeout=10))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "tls.control_clients" in message and message.endswith("this one's is client")
    assert etcd_get(mesh.etcd, Keyspace(mesh.prefix).model_spec("demo-onnx")) is None  # nothing was written
    # reads stay open to any valid certificate
    control_pb2_grpc.ModelControlStub(app).ListModels(control_pb2.ListModelsRequest(), timeout=10)
    # the worker's control API: an application cannot stop it (the scheduler's certificate may)
    stop = worker_pb2.EmergencyStopRequest(reason="test")
    worker_app = worker_pb2_grpc.WorkerControlStub(mesh.channel("worker", "client"))
    assert _code(lambda: worker_app.EmergencyStop(stop, timeout=10))[0] == grpc.StatusCode.PERMISSION_DENIED
    worker_app.Stats(worker_pb2.StatsRequest(), timeout=10)
    # Triton's repository API on the router, the same rule; the router's own identity may forward it
    kserve = kserve_grpc.GRPCInferenceServiceStub(mesh.channel("router", "client"))
    unload = kserve_pb.RepositoryModelUnloadRequest(model_name="demo-mlp")
    assert (
        _code(lambda: kserve.RepositoryModelUnload(unload, timeout=10))[0]
        == grpc.StatusCode.PERMISSION_DENIED
    )
    admin = kserve_grpc.GRPCInferenceServiceStub(mesh.channel("router", "admin"))
    code, message = _code(
        lambda: admin.RepositoryModelLoad(
            kserve_pb.RepositoryModelLoadRequest(model_name="no-such"), timeout=10
        )
    )
    assert code == grpc.StatusCode.NOT_FOUND, (code, message)  # through to the scheduler, which answered
    assert _infer(mesh.channel("router", "client")) is not None  # nothing was unloaded


def https(
    address: str,
    certs: Path,
    path: str,
    name: str | None,
    body: dict | None = None,
    *,
    ca: Path | None = None,
    client_certs: Path | None = None,
) -> tuple[int, dict]:
    """A JSON request to the REST door at ``address`` over TLS: trusting ``ca`` (default ``certs``' CA),
    as ``name`` from ``client_certs`` (default ``certs``; None: no client certificate)."""
    context = ssl.create_default_context(cafile=str(ca or certs / "ca.pem"))
    if name is not None:
        own = client_certs or certs
        context.load_cert_chain(own / f"{name}.pem", own / f"{name}.key")
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"https://{address}{path}", data=data)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def _https(mesh: Secured, path: str, name: str | None, body: dict | None = None) -> tuple[int, dict]:
    return https(mesh.router.endpoints["rest"], mesh.certs, path, name, body)


def test_rest_is_https_with_the_same_rules(mesh, repo):
    infer = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": X.ravel().tolist()}]}
    status, reply = _https(mesh, "/v2/models/demo-mlp/versions/1/infer", "client", infer)
    assert status == 200, reply
    got = np.array(reply["outputs"][0]["data"], np.float32).reshape(1, -1)
    np.testing.assert_allclose(got, mlp_reference(repo, "demo-mlp", "1", X), rtol=1e-5, atol=1e-5)
    status, reply = _https(mesh, "/v2/repository/models/demo-mlp/unload", "client", {})
    assert status == 403 and "tls.control_clients" in reply["error"], reply
    status, reply = _https(mesh, "/v2/repository/models/no-such/load", "admin", {})
    assert status == 404, reply  # allowed: through to the scheduler, which answered
    refused = (urllib.error.URLError, ConnectionError, ssl.SSLError)
    with pytest.raises(refused):  # no client certificate: the handshake fails (TLS 1.3: on first read)
        _https(mesh, "/v2/health/ready", None)
    plain = f"http://{mesh.router.endpoints['rest']}/v2/health/ready"
    with pytest.raises(refused):
        urllib.request.urlopen(plain, timeout=10)


def _dealer(endpoint: str, server_key: bytes, keypair: tuple[bytes, bytes]) -> tuple[zmq.Socket, zmq.Socket]:
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.curve_serverkey = server_key
    sock.curve_publickey, sock.curve_secretkey = keypair
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    sock.connect(endpoint)
    return sock, monitor


def _handshake(monitor: zmq.Socket) -> int:
    assert monitor.poll(10_000), "no handshake event in 10 s"
    event = zmq.utils.monitor.recv_monitor_message(monitor)
    return event["event"]


def test_zap_lets_only_allow_listed_curve_keys_send_tensors(mesh, repo):
    record = etcd_get(mesh.etcd, Keyspace(mesh.prefix).worker(WORKER))
    server_key = record["curve_public_key"].encode()
    header = tensor_pb2.TensorHeader(kind=tensor_pb2.KIND_REQUEST, request_id="zap-1", model="demo-mlp",
                                     version="1", timeout_us=5_000_000)  # fmt: skip
    frames = wire.encode(header, {"INPUT0": X})
    stranger, watch = _dealer(record["zmq"], server_key, zmq.curve_keypair())
    assert _handshake(watch) == zmq.EVENT_HANDSHAKE_FAILED_AUTH  # the worker's ZAP handler said no
    with contextlib.suppress(zmq.Again):  # queued at most: a refused link delivers nothing
        stranger.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
    allowed, watch2 = _dealer(record["zmq"], server_key, zmq.auth.load_certificate(
        mesh.certs / "curve" / "client.key_secret"))  # fmt: skip
    assert _handshake(watch2) == zmq.EVENT_HANDSHAKE_SUCCEEDED
    allowed.send_multipart(frames, copy=False)
    assert allowed.poll(10_000)
    reply = wire.decode(allowed.recv_multipart())
    wire.raise_for_status(reply.header)
    np.testing.assert_allclose(reply.tensors[0], mlp_reference(repo, "demo-mlp", "1", X), rtol=1e-5)
    assert stranger.poll(0) == 0  # the stranger got nothing
    for s in (stranger, watch, allowed, watch2):
        s.close(linger=0)


def _rejected(mesh: Secured) -> float:
    return metric(mesh.router.metrics_text(), "mcp_config_rejected_total", key="worker_signature")


def test_a_forged_worker_record_cannot_redirect_tensors(mesh, repo):
    """Whoever can write etcd rewrites the worker's endpoint and CURVE key to an impostor's: unsigned,
    signed with another worker's key, or keeping the old signature. The router refuses each, keeps the
    last good record, and the impostor receives nothing."""
    key = Keyspace(mesh.prefix).worker(WORKER)
    real = etcd_get(mesh.etcd, key)
    ctx = zmq.Context.instance()
    impostor = ctx.socket(zmq.ROUTER)
    public, secret = zmq.curve_keypair()
    impostor.curve_server, impostor.curve_secretkey = True, secret
    port = impostor.bind_to_random_port("tcp://127.0.0.1")
    forged = {**real, "zmq": f"tcp://127.0.0.1:{port}", "curve_public_key": public.decode()}
    other = RecordSigner(str(mesh.certs / "w-other.pem"), str(mesh.certs / "w-other.key"))
    signed = payload(WORKER, forged["incarnation"], forged["zmq"], forged["curve_public_key"], forged["grpc"])
    attempts = [
        {k: v for k, v in forged.items() if not k.startswith("record_")},  # unsigned
        forged,  # the real signature over other values
        {**forged, **other.fields(signed)},  # a valid signature, by a certificate for another worker
    ]
    try:
        for attempt in attempts:
            before = _rejected(mesh)
            etcd_put(mesh.etcd, key, attempt)
            wait_for(lambda b=before: _rejected(mesh) > b, 10, 0.05, "the router to reject the record")
            for _ in range(5):
                got = _infer(mesh.channel("router", "client"))
                np.testing.assert_allclose(got, mlp_reference(repo, "demo-mlp", "1", X), rtol=1e-5)
        assert impostor.poll(0) == 0
    finally:
        etcd_put(mesh.etcd, key, real)  # the worker re-publishes only on changes
        impostor.close(linger=0)


def test_the_sdk_verifies_the_worker_record_and_goes_direct_over_curve(mesh, repo, tmp_path):
    certs = mesh.certs
    with MeshClient(mesh.router.endpoints["grpc"], tls=client_tls(certs, "client"),
                    curve_secret_key_file=str(certs / "curve" / "client.key_secret")) as client:  # fmt: skip
        got = client.infer("demo-mlp", {"INPUT0": X}, version="1", direct=True)
        np.testing.assert_allclose(got["OUTPUT0"], mlp_reference(repo, "demo-mlp", "1", X), rtol=1e-5)
        assert client.stats.direct == 1 and client.stats.fallbacks == 0
    # A router without the CA (TLS only: it verifies nothing) hands out a forged record: the SDK, which
    # has the CA, refuses to send there.
    lax = RouterProcess(tmp_path, mesh.etcd, prefix=mesh.prefix, scheduler="")
    lax.env.update({"MCP_ROUTER_TLS__CERT_FILE": str(certs / "mcp-router.pem"),
                    "MCP_ROUTER_TLS__KEY_FILE": str(certs / "mcp-router.key")})  # fmt: skip
    key = Keyspace(mesh.prefix).worker(WORKER)
    real = etcd_get(mesh.etcd, key)
    impostor = zmq.Context.instance().socket(zmq.ROUTER)
    public, secret = zmq.curve_keypair()
    impostor.curve_server, impostor.curve_secretkey = True, secret  # answers handshakes: the link comes up
    port = impostor.bind_to_random_port("tcp://127.0.0.1")
    lax.start()
    try:
        etcd_put(
            mesh.etcd, key, {**real, "zmq": f"tcp://127.0.0.1:{port}", "curve_public_key": public.decode()}
        )
        with MeshClient(lax.endpoints["grpc"], tls=client_tls(certs, "client"), route_ttl_s=0) as client:
            wait_for(lambda: _routed_to(client, port), 10, 0.05, "the lax router to route to the impostor")
            with pytest.raises(PermissionDenied, match="signature does not match"):
                client.infer("demo-mlp", {"INPUT0": X}, version="1", direct=True)
        assert impostor.poll(0) == 0
    finally:
        etcd_put(mesh.etcd, key, real)
        lax.stop()
        impostor.close(linger=0)


def _router_link(mesh: Secured) -> tuple[list[str], str]:
    """The router's view of the worker: its zmq_features as taken, and where its link connects."""
    url = f"http://{mesh.router.endpoints['metrics']}/debug/snapshot"
    with urllib.request.urlopen(url, timeout=5) as resp:
        doc = json.load(resp)["workers"][WORKER]
    return doc["zmq_features"], doc["link_address"]


def _direct_link(client: MeshClient) -> str:
    [link] = client._client._direct.forwarder._links.values()  # where the SDK's link went is the point
    return link.address


def test_the_same_host_offer_is_signed_and_an_unsigned_one_is_not_taken(mesh, repo, tmp_path):
    """The worker signs its offer of a same-host endpoint; the router (with the CA) and the SDK (with the CA)
    take the endpoint only while that signature verifies. With the offer's signature stripped from etcd or
    made by another worker's key, the router connects to the signed TCP endpoint instead, and so does the
    SDK even through a router without the CA (which passes the offer on); answers go on."""
    certs = mesh.certs
    key = Keyspace(mesh.prefix).worker(WORKER)
    real = etcd_get(mesh.etcd, key)
    signed = payload(WORKER, real["incarnation"], real["zmq"], real["curve_public_key"], real["grpc"])
    local = wire.local_endpoint(WORKER, real["incarnation"], real["zmq"], real["curve_public_key"])
    assert wire.FEATURE_LOCAL in real["zmq_features"] and real["record_local_signature"]
    other = RecordSigner(str(certs / "w-other.pem"), str(certs / "w-other.key"))
    sdk = {
        "tls": client_tls(certs, "client"),
        "curve_secret_key_file": str(certs / "curve" / "client.key_secret"),
    }
    want = mlp_reference(repo, "demo-mlp", "1", X)
    lax = RouterProcess(tmp_path, mesh.etcd, prefix=mesh.prefix, scheduler="",
                        zmq_curve_secret_key_file=certs / "curve" / "mcp-router.key_secret")  # fmt: skip
    lax.env.update({"MCP_ROUTER_TLS__CERT_FILE": str(certs / "mcp-router.pem"),
                    "MCP_ROUTER_TLS__KEY_FILE": str(certs / "mcp-router.key")})  # fmt: skip
    lax.start()
    try:
        wait_for(
            lambda: _router_link(mesh)[1] == local, 10, 0.05, "the router's link to the same-host endpoint"
        )
        with MeshClient(mesh.router.endpoints["grpc"], **sdk) as client:
            got = client.infer("demo-mlp", {"INPUT0": X}, version="1", direct=True)
            np.testing.assert_allclose(got["OUTPUT0"], want, rtol=1e-5)
            assert _direct_link(client) == local
        for forged in (
            {k: v for k, v in real.items() if k != "record_local_signature"},  # the offer, unsigned
            {**real, "record_local_signature": other.sign(local_claim(signed))},  # signed by another worker
        ):
            etcd_put(mesh.etcd, key, forged)
            wait_for(
                lambda: _router_link(mesh) == (["batch"], real["zmq"]), 10, 0.05, "the router back on TCP"
            )
            np.testing.assert_allclose(_infer(mesh.channel("router", "client")), want, rtol=1e-5)
            with MeshClient(lax.endpoints["grpc"], route_ttl_s=0, **sdk) as client:

                def lax_passes_it_on(c: MeshClient = client, f: dict = forged) -> bool:
                    route = c.route("demo-mlp")  # the forged record as the lax router took it
                    offered = wire.FEATURE_LOCAL in route.zmq_features
                    return offered and route.record_local_signature == f.get("record_local_signature", "")

                wait_for(lax_passes_it_on, 10, 0.05, "the lax router to pass the forged offer on")
                got = client.infer("demo-mlp", {"INPUT0": X}, version="1", direct=True)
                np.testing.assert_allclose(got["OUTPUT0"], want, rtol=1e-5)
                assert _direct_link(client) == real["zmq"] and client.stats.direct == 1
            etcd_put(mesh.etcd, key, real)  # each forgery starts from the real record, on the local link
            wait_for(
                lambda: _router_link(mesh)[1] == local, 10, 0.05, "the router back on the local endpoint"
            )
    finally:
        etcd_put(mesh.etcd, key, real)
        lax.stop()
    wait_for(lambda: _router_link(mesh)[1] == local, 10, 0.05, "the router back on the same-host endpoint")


def _routed_to(client: MeshClient, port: int) -> bool:
    try:
        return client.route("demo-mlp").endpoint.endswith(f":{port}")
    except Unavailable:  # its link to the endpoint not up yet
        return False


def test_mcpctl_with_the_admin_certificate(mesh, capsys):
    certs = mesh.certs
    where = ["--scheduler", mesh.scheduler.endpoints["grpc"]]
    tls = ["--tls-ca", str(certs / "ca.pem"), "--tls-cert", str(certs / "admin.pem"),
           "--tls-key", str(certs / "admin.key")]  # fmt: skip
    capsys.readouterr()
    assert mcpctl_main([*where, *tls, "-o", "json", "list"]) == 0
    out, err = capsys.readouterr()
    assert "demo-mlp" in json.dumps(json.loads(out)), err
    assert mcpctl_main([*where, "-o", "json", "list"]) == 3  # without TLS: unreachable, exit 3
    _, err = capsys.readouterr()
    assert err.count("\n") == 1 and "Traceback" not in err, err  # one line
    assert mcpctl_main([*where, "--tls-ca", str(certs / "nope.pem"), "list"]) == 2
    _, err = capsys.readouterr()
    assert "no such file" in err


STALE = {"scheduler": (("mcp-fence", "scheduler:1"),), "health": (("mcp-fence", "health:1"),)}


def _worker_call(method: str) -> Any:
    """A worker control call that, once let in, is refused by the fence (a stale leader token): it
    shows the access check passed without changing anything."""
    requests = {
        "Load": (worker_pb2.LoadRequest(model="demo-mlp", version="1"), "scheduler"),
        "Pause": (worker_pb2.PauseRequest(model="demo-mlp", version="1"), "scheduler"),
        "EmergencyStop": (worker_pb2.EmergencyStopRequest(reason="edge test"), "health"),
    }
    request, role = requests[method]
    return lambda stub: getattr(stub, method)(request, metadata=STALE[role], timeout=10)


NOT_SCHEDULER = ("mcp-router", "mcp-health", "client")
# (service, method, the call, who may, who may not): every edge of the least-privilege table
EDGES = [
    ("worker", "Load", _worker_call("Load"), ("mcp-scheduler", "admin"), NOT_SCHEDULER),
    ("worker", "Pause", _worker_call("Pause"), ("mcp-scheduler", "admin"), NOT_SCHEDULER),
    ("worker", "EmergencyStop", _worker_call("EmergencyStop"), ("mcp-health", "admin"),
     ("mcp-router", "mcp-scheduler", "client")),
    ("scheduler", "UnloadModel",
     lambda s: s.UnloadModel(control_pb2.UnloadModelRequest(model="no-such-model"), timeout=10),
     ("mcp-router", "admin"), ("mcp-health", "mcp-scheduler", "client")),
    ("scheduler", "SetTraffic",
     lambda s: s.SetTraffic(control_pb2.SetTrafficRequest(model="no-such-model"), timeout=10),
     ("admin",), ("mcp-router", "mcp-health", "client")),
    ("router", "SystemSharedMemoryRegister",
     lambda s: s.SystemSharedMemoryRegister(
         kserve_pb.SystemSharedMemoryRegisterRequest(name="r", key="/no-such-object", byte_size=8), timeout=10
     ),
     ("admin",), ("client", "mcp-router", "mcp-scheduler")),
    ("router", "LogSettings", lambda s: s.LogSettings(kserve_pb.LogSettingsRequest(), timeout=10),
     ("admin",), ("client", "mcp-health")),
]  # fmt: skip
STUBS = {
    "worker": worker_pb2_grpc.WorkerControlStub,
    "scheduler": control_pb2_grpc.ModelControlStub,
    "router": kserve_grpc.GRPCInferenceServiceStub,
}


@pytest.mark.parametrize(
    ("service", "method", "call", "allowed", "refused"), EDGES, ids=[e[1] for e in EDGES]
)
def test_each_control_method_admits_only_its_own_callers(mesh, service, method, call, allowed, refused):
    """Least privilege, per edge, through the real services: the router's certificate cannot pause a
    worker's models, the scheduler's cannot stop a worker, an application's can do none of it; each
    allowed caller gets past the check (to the fence, or the method's own answer)."""
    for name in (*allowed, *refused):
        code, message = _code(lambda name=name: call(STUBS[service](mesh.channel(service, name))))
        if name in refused:
            assert code == grpc.StatusCode.PERMISSION_DENIED, (name, code, message)
            assert message.endswith(f"this one's is {name}"), message
        else:
            assert code != grpc.StatusCode.PERMISSION_DENIED, (name, message)
    assert _infer(mesh.channel("router", "client")) is not None  # nothing was stopped or paused


def test_shared_memory_registration_over_rest_needs_its_permission(mesh):
    body = {"key": "/no-such-object", "offset": 0, "byte_size": 8}
    status, reply = _https(mesh, "/v2/systemsharedmemory/region/r/register", "client", body)
    assert status == 403 and "this one's is client" in reply["error"], reply
    status, reply = _https(mesh, "/v2/systemsharedmemory/region/r/register", "admin", body)
    assert status == 400 and "cannot open" in reply["error"], reply  # let in; the object does not exist
