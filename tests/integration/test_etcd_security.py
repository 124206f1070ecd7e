"""etcd over TLS with username/password auth, as README "Securing a cluster" sets it up: a real etcd with
auth enabled; services given the CA and credentials work, and without them each fails with a message
that says what to set."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import grpc
import pytest
from harness import SchedulerProcess, WorkerProcess, wait_for
from test_security import _make_certs

from mcp_devcluster.localetcd import EtcdServer
from mcpapi.v2 import control_pb2, control_pb2_grpc, model_pb2

PREFIX = f"/es{uuid.uuid4().hex[:6]}/mcp"


def _etcdctl(etcd: EtcdServer, ca: Path, *args: str, user: str = "") -> str:
    cmd = [
        "etcdctl",
        f"--endpoints={etcd.url}",
        f"--cacert={ca}",
        *([f"--user={user}"] if user else []),
        *args,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False,
                          env={**os.environ, "ETCDCTL_API": "3"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def secured_etcd(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("etcd-sec")
    certs = _make_certs(tmp / "certs", [])
    etcd = EtcdServer(tmp / "etcd", tls=(certs / "ca.pem", certs / "etcd.pem", certs / "etcd.key"))
    etcd.start()
    etcd.enable_auth({"root": "root-secret", "mesh": "mesh-secret"}, PREFIX.rsplit("/", 1)[0] + "/")
    (tmp / "password").write_text("mesh-secret\n")
    (tmp / "wrong").write_text("guess\n")
    try:
        yield etcd, certs, tmp
    finally:
        etcd.kill()


def _auth_env(service: str, ca: Path, password: Path | None) -> dict[str, str]:
    p = f"MCP_{service}_ETCD_AUTH__"
    env = {f"{p}CA_FILE": str(ca)}
    if password is not None:
        env |= {f"{p}USER": "mesh", f"{p}PASSWORD_FILE": str(password)}
    return env


def test_services_with_credentials_work_over_tls(secured_etcd, repo, tmp_path):
    etcd, certs, tmp = secured_etcd
    ca = certs / "ca.pem"
    worker = WorkerProcess(tmp_path, etcd.endpoint, repo, prefix=PREFIX)
    worker.env.update(_auth_env("WORKER", ca, tmp / "password"))
    scheduler = SchedulerProcess(tmp_path, etcd.endpoint, prefix=PREFIX)
    scheduler.env.update(_auth_env("SCHEDULER", ca, tmp / "password"))
    try:
        worker.start()
        scheduler.start()
        control = control_pb2_grpc.ModelControlStub(scheduler.channel())
        spec = model_pb2.ModelSpec(model="demo-mlp", versions=["1"], replicas=1)
        control.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=60)
        got = _etcdctl(etcd, ca, "get", "--prefix", "--keys-only", PREFIX, user="mesh:mesh-secret")
        assert f"{PREFIX}/workers/{worker.worker_id}" in got
        assert f"{PREFIX}/models/demo-mlp/" in got
        # etcd restarts: every token it issued is gone; the services renew theirs and carry on
        etcd.kill()
        etcd.start()
        wait_for(lambda: _loads(control, "demo-onnx"), 60, 0.2, "a load to go through after the restart")
        got = _etcdctl(etcd, ca, "get", "--prefix", PREFIX + "/models/demo-onnx/", user="mesh:mesh-secret")
        assert '"running":1' in got, got  # from the worker's replica record: it authenticated again too
    finally:
        scheduler.stop()
        worker.stop()


def _loads(control: control_pb2_grpc.ModelControlStub, model: str) -> bool:
    spec = model_pb2.ModelSpec(model=model, versions=["1"], replicas=1)
    try:
        control.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=30)
    except grpc.RpcError:
        return False
    return True


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("no credentials", "requires authentication"),
        ("wrong password", "refused user 'mesh'"),
        ("plaintext", "is unreachable"),  # a TLS port that does not speak plaintext
    ],
)
def test_services_without_valid_credentials_say_what_to_set(secured_etcd, tmp_path, case, needle):
    etcd, certs, tmp = secured_etcd
    scheduler = SchedulerProcess(tmp_path, etcd.endpoint, prefix=PREFIX)
    if case == "no credentials":
        scheduler.env.update(_auth_env("SCHEDULER", certs / "ca.pem", None))
    elif case == "wrong password":
        scheduler.env.update(_auth_env("SCHEDULER", certs / "ca.pem", tmp / "wrong"))
    with pytest.raises(RuntimeError):
        scheduler.start(timeout_s=8)  # never ready: it cannot read etcd
    wait_for(lambda: needle in scheduler.log.read_text(), 10, 0.1, f"the log to say {needle!r}")
    scheduler.kill()
