"""The development cluster on one machine, no containers: ``python -m mcp_devcluster up|down|status``.

``up`` starts etcd (Debian's binary, data in ``.run/etcd``; skipped when ``MCP_ETCD_ENDPOINTS`` names one
already running), builds the demo model repository (``.run/models``), starts two workers, the scheduler,
the router and the health service on DESIGN.md section 13's ports, loads the demo models, sends a few
requests through the router, and prints the status table. Logs and pid files go to ``.run/``; ``down``
stops everything it started. A port already in use fails at once with the process to blame named.
``up --secure`` (``make up SECURE=1``) does the same with every door locked (``secure``): etcd over TLS
with users, mutual TLS on every service, CURVE on the workers' sockets, each under its own identity.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from mcp_devcluster import demo
from mcp_devcluster.config import DevClusterConfig
from mcp_devcluster.localetcd import EtcdServer
from mcp_devcluster.secure import Identities
from mcpapi.v2 import control_pb2, control_pb2_grpc
from mcpclient.cluster_cmds import status_table
from mcpcore.tls import channel

__all__ = ["down", "main", "up"]

RUN = Path(".run")
DRAIN_WAIT_S = 15.0  # a worker's graceful stop takes at most its drain_timeout_s (10 s) and a little more
ROUTER, SCHEDULER, HEALTH = "127.0.0.1:8001", "127.0.0.1:50051", "127.0.0.1:50053"
ROUTER_REST = "127.0.0.1:8000"
SERVICES = {  # name -> (module, flags)
    "worker-1": ("mcp_worker", ["--worker-id", "worker-1", "--metrics-port", "9110", "--grpc-port", "50061",
                                "--zmq-bind", "tcp://127.0.0.1:5561"]),
    "worker-2": ("mcp_worker", ["--worker-id", "worker-2", "--metrics-port", "9111", "--grpc-port", "50062",
                                "--zmq-bind", "tcp://127.0.0.1:5562"]),
    "scheduler": ("mcp_scheduler", ["--scheduler-id", "scheduler-1"]),
    "router": ("mcp_router", ["--router-id", "router-1"]),
    "health": ("mcp_health", ["--health-id", "health-1"]),
}  # fmt: skip
PORTS = {
    8001: "router", 8000: "router REST", 50051: "scheduler", 50053: "health", 9101: "router metrics",
    9102: "scheduler metrics", 9103: "health metrics", 9110: "worker-1 metrics", 9111: "worker-2 metrics",
}  # fmt: skip


def _busy(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _start(name: str, module: str, flags: list[str], env: dict[str, str]) -> dict[str, str]:
    log = RUN / f"{name}.log"
    out = RUN / f"{name}.out"
    with log.open("ab") as err, out.open("wb") as stdout:
        proc = subprocess.Popen([sys.executable, "-m", module, *flags], stdout=stdout, stderr=err, env=env,
                                start_new_session=True)  # fmt: skip
    (RUN / f"{name}.pid").write_text(str(proc.pid))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the service prints one JSON "ready" line when it serves
        text = out.read_text()
        if text.strip():
            return json.loads(text.splitlines()[0])
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited during start-up; see {log}:\n{log.read_text()[-2000:]}")
        time.sleep(0.05)
    raise SystemExit(f"{name} did not start within 60 s; see {log}")


def _etcd(config: DevClusterConfig, ids: Identities | None) -> str:
    if config.etcd_endpoints is not None:
        return config.etcd_endpoints
    if _busy(2379):
        raise SystemExit("port 2379 is in use: set MCP_ETCD_ENDPOINTS to use that etcd, or stop it")
    shutil.rmtree(RUN / "etcd", ignore_errors=True)  # a fresh cluster state each time
    tls = None if ids is None else ids.etcd_tls
    server = EtcdServer(RUN / "etcd", client_port=2379, peer_port=2380, detached=True, tls=tls)
    server.start()
    (RUN / "etcd.pid").write_text(str(server.proc.pid))
    if ids is not None:
        ids.enable_etcd_auth(server)
    return server.endpoint


def up(config: DevClusterConfig, *, secure: bool = False) -> int:
    RUN.mkdir(exist_ok=True)
    if any((RUN / f"{n}.pid").exists() for n in SERVICES):
        print(
            "a local cluster seems to be running already (.run/*.pid); run `make down` first", file=sys.stderr
        )
        return 1
    taken = [f"{port} ({what})" for port, what in PORTS.items() if _busy(port)]
    if taken:
        print(f"ports in use: {', '.join(taken)}; stop what holds them (or `make down`)", file=sys.stderr)
        return 1
    env = dict(config.environ)
    (RUN / "mcpctl.env").unlink(missing_ok=True)  # a plain cluster is not secured
    workers = [name for name, (module, _) in SERVICES.items() if module == "mcp_worker"]
    if secure and config.etcd_endpoints is not None:
        raise SystemExit("SECURE=1 starts its own etcd (TLS, users): unset MCP_ETCD_ENDPOINTS")
    ids = Identities.create(RUN, workers) if secure else None
    try:
        endpoint = _etcd(config, ids)
    except BaseException:
        (RUN / "mcpctl.env").unlink(missing_ok=True)  # nothing secured runs
        raise
    repo = demo.build_repository(RUN / "models")
    for prefix in ("WORKER", "SCHEDULER", "ROUTER", "HEALTH"):
        env[f"MCP_{prefix}_ETCD_ENDPOINTS"] = endpoint
    env["MCP_WORKER_REPOSITORY"] = str(repo)
    env["MCP_WORKER_KEYRING"] = str(repo / "keyring.json")
    env["MCP_WORKER_CHECKPOINT_DIR"] = str((RUN / "checkpoints").resolve())
    env.setdefault("MCP_ROUTER_TRACE_FILE", str((RUN / "trace.json").resolve()))  # TraceSetting writes here
    for name, (module, flags) in SERVICES.items():
        own = env if ids is None else env | ids.service_env(name, module)
        ready = _start(name, module, flags, own)
        print(f"started {name}: {json.dumps(ready)}")
    admin = None if ids is None else ids.admin
    control = control_pb2_grpc.ModelControlStub(channel(SCHEDULER, admin))
    for spec in demo.DEMO:
        control.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=120)
        print(f"loaded {spec.model} versions {list(spec.versions)} x{spec.replicas}")
    demo.run_client(ROUTER, None if ids is None else ids.client)
    print()
    print(status_table(SCHEDULER, HEALTH, admin), end="")
    print(f"\nrouter: gRPC (mcpapi v1/v2, KServe V2) at {ROUTER}, REST (KServe V2) at {ROUTER_REST}")
    print(f"etcd at {endpoint}; logs in {RUN}/")
    if ids is not None:
        print(ids.how_to_connect(ROUTER, ROUTER_REST, endpoint))
    show = "`make status` or, as above, mcpctl" if ids else "`.venv/bin/mcpctl status`"
    print(f"`make down` stops it; {show} shows it")
    return 0


def _stop(names: list[str], wait_s: float) -> list[str]:
    """SIGTERM each of ``names`` (by pid file) at once, wait up to ``wait_s`` for all, SIGKILL the rest."""
    pids = {}
    for name in names:
        pid_file = RUN / f"{name}.pid"
        with contextlib.suppress(ValueError, ProcessLookupError):
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGTERM)
            pids[name] = pid
        pid_file.unlink()
    deadline = time.monotonic() + wait_s
    while pids and time.monotonic() < deadline:
        for name, pid in list(pids.items()):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # reaps it only if it is our child; up's children are not
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                del pids[name]
        time.sleep(0.05)  # polling a process we cannot wait on: no readiness signal exists
    for pid in pids.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return list(pids)


def down() -> int:
    """Stop the services together (each drains: workers finish their requests, the router its calls)
    while etcd still answers, then etcd: stopped first, it made every drain wait out its etcd timeouts."""
    names = sorted(p.stem for p in RUN.glob("*.pid"))
    services = [n for n in names if n != "etcd"]
    killed = _stop(services, DRAIN_WAIT_S)
    if "etcd" in names:
        killed += _stop(["etcd"], 5.0)
    (RUN / "mcpctl.env").unlink(missing_ok=True)
    print(f"stopped: {', '.join(names) or 'nothing was running'}")
    if killed:
        print(f"killed after no clean stop in time: {', '.join(killed)}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mcp_devcluster", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--secure", action="store_true", help="up: TLS, users and CURVE everywhere")
    args = parser.parse_args(argv)
    if args.action == "up":
        return up(DevClusterConfig.from_env(), secure=args.secure)
    if args.action == "down":
        return down()
    ids = Identities.load(RUN)
    print(status_table(SCHEDULER, HEALTH, None if ids is None else ids.admin), end="")
    return 0
