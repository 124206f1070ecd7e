"""make compose-test: the compose deployment's cpu profile, built and run for real here, then checked.

Steps (each prints one line with its time; the last line is the whole run's):

1. Docker: Debian's ``docker.io`` and ``docker-compose`` when missing; ``dockerd`` started
   with its own log (``.run/compose-test/dockerd.log``) when none answers, and stopped at the end only then.
2. The base image: ``MCP_CPU_BASE_IMAGE`` if set; else debian:bookworm-slim, pulled if not here; else the
   local ``mcpmesh-base:bookworm``, made once with ``debootstrap --variant=minbase`` and ``docker import``.
3. The wheelhouse (tools/compose/wheelhouse.sh), then the images: mcpmesh's (deploy/compose/Dockerfile) and,
   through docker-compose.test.yml, etcd, Prometheus and Alertmanager from Debian's packages.
4. ``docker-compose --profile cpu up``, on host networking and 127.0.0.1 only (docker-compose.test.yml's
   ports, none of ``make up``'s); waits for every service to be healthy and for ``init`` to load the models.
5. Checks: inference with tritonclient (gRPC and REST) through the router; a canary flip (``mcpctl
   traffic``) answered by both versions, then a full flip; Prometheus scraping every service; a worker
   container killed: the health service's WorkerDown and Prometheus' WorkerDown reach Alertmanager, and
   the router still answers.
6. ``docker-compose down -v``, on success or failure (the logs of the run are printed on failure).

Usage: ``.venv/bin/python tools/compose_test.py [--keep]`` (``--keep`` leaves the cluster up to look at).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_DIR = ROOT / "deploy" / "compose"
WORK = ROOT / ".run" / "compose-test"
VENV_BIN = Path(sys.executable).parent
PROJECT = "mcpmesh-test"
DEFAULT_BASE = "debian:bookworm-slim"
LOCAL_BASE = "mcpmesh-base:bookworm"
MIRROR = os.environ.get("MCP_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# docker-compose.test.yml's addresses
ROUTER_GRPC, ROUTER_REST, SCHEDULER = "127.0.0.1:18001", "127.0.0.1:18000", "127.0.0.1:15051"
PROMETHEUS, ALERTMANAGER = "http://127.0.0.1:19090", "http://127.0.0.1:19093"
JOBS = {"mcp-router": 1, "mcp-scheduler": 1, "mcp-health": 1, "mcp-worker": 2}
SERVICES = [
    "etcd",
    "alertmanager",
    "prometheus",
    "scheduler",
    "router",
    "health",
    "cpu-worker-1",
    "cpu-worker-2",
]
KILLED, KILLED_ID, KILLED_METRICS = "mcpmesh-test-worker-2", "worker-2", "127.0.0.1:19111"

T0 = time.monotonic()


def say(message: str) -> None:
    print(f"compose-test [{time.monotonic() - T0:6.1f} s] {message}", flush=True)


def run(cmd: list[str], *, timeout: float = 600, env: dict[str, str] | None = None, quiet: bool = False,
        check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """Run ``cmd``. ``quiet``: its output is captured (and shown if it fails); else it goes to ours."""
    done = subprocess.run(
        cmd, capture_output=quiet, text=True, timeout=timeout, env=env, check=False, **kwargs
    )
    if check and done.returncode != 0:
        tail = ((done.stdout or "") + (done.stderr or ""))[-4000:]
        raise SystemExit(f"compose-test: failed ({done.returncode}): {' '.join(cmd)}\n{tail}")
    return done


def wait_for(what: str, probe: Callable[[], Any], timeout_s: float, interval_s: float = 1.0) -> Any:
    """Poll ``probe`` until it returns something truthy (no event exists to wait on: services over HTTP)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except Exception as exc:  # a service not up yet: connection refused, a 503, a gRPC UNAVAILABLE
            last = exc
        else:
            if last:
                return last
        time.sleep(interval_s)
    raise SystemExit(f"compose-test: timed out after {timeout_s:.0f} s waiting for {what} (last: {last!r})")


def apt_install(*packages: str) -> None:
    say(f"installing Debian's {' '.join(packages)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], env=env, quiet=True)
    run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages], env=env, quiet=True)


# --- 1. the Docker engine -------------------------------------------------------------------------------


def docker_answers() -> bool:
    return run(["docker", "info"], quiet=True, check=False, timeout=30).returncode == 0


@contextlib.contextmanager
def docker_engine(keep: bool) -> Iterator[None]:
    """A Docker engine that answers; one this started is stopped on the way out (unless ``keep``)."""
    if shutil.which("docker-compose") is None:
        apt_install("docker-compose")
    if shutil.which("docker") and docker_answers():
        say("docker: an engine is running already (left running at the end)")
        yield
        return
    if shutil.which("dockerd") is None:
        apt_install("docker.io")
    WORK.mkdir(parents=True, exist_ok=True)
    log = WORK / "dockerd.log"
    # Everything in the test uses the host's network (containers and builds): no bridge, no iptables rules.
    with log.open("ab") as out:
        proc = subprocess.Popen(["dockerd", "--bridge=none", "--iptables=false", "--ip6tables=false"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not docker_answers():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"compose-test: dockerd did not start; {log}:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        say(f"docker: started dockerd (pid {proc.pid}, log {log.relative_to(ROOT)})")
        yield
    finally:
        if keep:
            say(f"docker: the dockerd this run started stays up (--keep): kill {proc.pid} stops it")
        else:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            say("docker: stopped the dockerd this run started")


# --- 2. the base image ----------------------------------------------------------------------------------


def have_image(name: str) -> bool:
    return run(["docker", "image", "inspect", name], quiet=True, check=False, timeout=30).returncode == 0


def base_image() -> str:
    if os.environ.get("MCP_CPU_BASE_IMAGE"):
        return os.environ["MCP_CPU_BASE_IMAGE"]
    if have_image(DEFAULT_BASE):
        return DEFAULT_BASE
    try:
        pulled = run(["docker", "pull", DEFAULT_BASE], quiet=True, check=False, timeout=60).returncode == 0
    except subprocess.TimeoutExpired:
        pulled = False
    if pulled:
        say(f"base image: pulled {DEFAULT_BASE}")
        return DEFAULT_BASE
    if have_image(LOCAL_BASE):
        say(f"base image: {DEFAULT_BASE} cannot be pulled; {LOCAL_BASE} (made earlier by debootstrap)")
        return LOCAL_BASE
    say(f"base image: {DEFAULT_BASE} cannot be pulled; making {LOCAL_BASE} with debootstrap from {MIRROR}")
    if shutil.which("debootstrap") is None:
        apt_install("debootstrap")
    scratch = Path(tempfile.mkdtemp(prefix="mcpmesh-debootstrap-", dir="/var/tmp"))
    try:
        run(["debootstrap", "--variant=minbase", "bookworm", str(scratch / "root"), MIRROR], quiet=True,
            timeout=600)  # fmt: skip
        root = scratch / "root"
        (root / "etc/apt/sources.list").write_text(
            f"deb {MIRROR} bookworm main\ndeb {MIRROR} bookworm-updates main\n"
            "deb http://deb.debian.org/debian-security bookworm-security main\n"
        )
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (root / junk).glob("*"):
                if path.is_file():
                    path.unlink()
        with subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE) as tar:
            run(
                ["docker", "import", "--change", 'CMD ["bash"]', "-", LOCAL_BASE],
                stdin=tar.stdout,
                quiet=True,
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return LOCAL_BASE


# --- 3-4. build and start -------------------------------------------------------------------------------


class Compose:
    """docker-compose on docker-compose.yml + docker-compose.test.yml, the cpu profile, project mcpmesh-test.

    It runs the two files' merged configuration (``docker-compose config``) written to
    ``.run/compose-test/docker-compose.yml``, less the ``ports`` of the services on host networking: those
    publish nothing there, and docker-compose 1.29 refuses to create such a container.
    """

    def __init__(self, base: str) -> None:
        self.env = {
            **os.environ,
            "COMPOSE_PROJECT_NAME": PROJECT,
            "MCP_IMAGE": PROJECT,  # mcpmesh-test:cpu, mcpmesh-test-etcd:local, ...: a real deployment's stay
            "MCP_CPU_BASE_IMAGE": base,
            "COMPOSE_DOCKER_CLI_BUILD": "0",  # docker-compose's own (classic) builder: no buildx needed
            "DOCKER_BUILDKIT": "0",
        }
        files = [
            "-f",
            str(COMPOSE_DIR / "docker-compose.yml"),
            "-f",
            str(COMPOSE_DIR / "docker-compose.test.yml"),
        ]
        merged = run(
            ["docker-compose", *files, "--profile", "cpu", "config"], env=self.env, quiet=True
        ).stdout
        config = yaml.safe_load(merged)
        for service in config["services"].values():
            if service.get("network_mode") == "host":
                service.pop("ports", None)
        WORK.mkdir(parents=True, exist_ok=True)
        self.file = WORK / "docker-compose.yml"
        self.file.write_text(yaml.safe_dump(config, sort_keys=False))

    def __call__(self, *args: str, timeout: float = 600, quiet: bool = True, check: bool = True) -> str:
        cmd = ["docker-compose", "-f", str(self.file), "--profile", "cpu", *args]
        return run(cmd, env=self.env, timeout=timeout, quiet=quiet, check=check).stdout or ""

    def build(self) -> None:
        """mcpmesh's image and the local etcd's side by side (apt downloads and pip installs overlap), then
        Prometheus' and Alertmanager's, which reuse the etcd image's package layer. Logs: WORK/build-*.log."""
        cmd = ["docker-compose", "-f", str(self.file), "--profile", "cpu", "build"]
        jobs = {}
        for name in ("scheduler", "etcd"):  # scheduler: the image every mcpmesh service runs
            log = WORK / f"build-{name}.log"
            with log.open("w") as out:
                jobs[name] = (
                    subprocess.Popen([*cmd, name], stdout=out, stderr=subprocess.STDOUT, env=self.env),
                    log,
                )
        try:
            for name, (proc, log) in jobs.items():
                if proc.wait(timeout=900) != 0:
                    raise SystemExit(
                        f"compose-test: building {name} failed; {log}:\n{log.read_text()[-4000:]}"
                    )
        finally:
            for proc, _ in jobs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        self("build", "prometheus", "alertmanager", timeout=600)

    def logs(self) -> None:
        print(self("logs", "--no-color", "--tail=60", check=False), flush=True)

    def down(self) -> None:
        self("down", "-v", "--remove-orphans", "--timeout", "20", check=False, timeout=180)
        say("docker-compose down -v: done")


def container(name: str) -> dict[str, Any]:
    out = run(["docker", "inspect", name], quiet=True, check=False, timeout=30).stdout
    return (json.loads(out) or [{}])[0] if out.strip() else {}


def wait_healthy(compose: Compose) -> None:
    ids = {svc: compose("ps", "-q", svc).strip() for svc in SERVICES}

    def all_healthy() -> bool:
        states = {svc: container(cid).get("State", {}) for svc, cid in ids.items()}
        dead = [svc for svc, s in states.items() if s.get("Status") not in ("running", "created")]
        if dead:
            raise SystemExit(f"compose-test: not running: {', '.join(dead)}")
        waiting = [svc for svc, s in states.items() if s.get("Health", {}).get("Status") != "healthy"]
        return not waiting

    wait_for("every service healthy", all_healthy, 240, interval_s=2)
    say(f"healthy: {', '.join(SERVICES)}")
    init = compose("ps", "-q", "init").strip()
    code = run(["docker", "wait", init], quiet=True, timeout=300).stdout.strip()
    init_log = run(["docker", "logs", init], quiet=True, check=False).stdout.strip().splitlines()
    if code != "0":
        raise SystemExit("compose-test: init exited " + code + ":\n" + "\n".join(init_log[-20:]))
    say(init_log[-1] if init_log else "init: done")


# --- 5. checks ------------------------------------------------------------------------------------------


def triton_grpc_infer(model: str, version: str = "") -> tuple[str, list[int]]:
    import numpy as np  # noqa: PLC0415 - the venv's, imported only once the cluster is up
    import tritonclient.grpc as triton  # noqa: PLC0415

    client = triton.InferenceServerClient(ROUTER_GRPC)
    x = np.random.default_rng(0).random((2, 64), dtype=np.float32)
    tensor = triton.InferInput("INPUT0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer(model, [tensor], model_version=version, client_timeout=10)
    out = result.as_numpy("OUTPUT0")
    assert out is not None and np.isfinite(out).all(), f"{model}: OUTPUT0 {out!r}"
    return result.get_response().model_version, list(out.shape)


def triton_rest_infer(model: str) -> list[int]:
    import numpy as np  # noqa: PLC0415
    import tritonclient.http as triton_http  # noqa: PLC0415

    client = triton_http.InferenceServerClient(ROUTER_REST)
    x = np.ones((1, 64), dtype=np.float32)
    tensor = triton_http.InferInput("INPUT0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return list(client.infer(model, [tensor]).as_numpy("OUTPUT0").shape)


def check_inference() -> None:
    for model in ("demo-mlp", "demo-onnx"):
        version, shape = wait_for(f"{model} through the router", lambda m=model: triton_grpc_infer(m), 60)
        say(f"tritonclient gRPC {ROUTER_GRPC}: {model} version {version} -> OUTPUT0 {shape}")
    say(f"tritonclient REST {ROUTER_REST}: demo-mlp -> OUTPUT0 {triton_rest_infer('demo-mlp')}")


def mcpctl(*args: str) -> str:
    return run([str(VENV_BIN / "mcpctl"), "--scheduler", SCHEDULER, *args], quiet=True, timeout=120).stdout


def versions_answering(n: int) -> list[str]:
    return [triton_grpc_infer("demo-mlp")[0] for _ in range(n)]


def check_canary() -> None:
    mcpctl("traffic", "demo-mlp", "1", "--canary", "2", "--percent", "50")

    def both() -> list[str] | None:
        versions = versions_answering(20)
        return versions if {"1", "2"} <= set(versions) else None

    seen = wait_for("answers from versions 1 and 2 of demo-mlp", both, 60)
    say(f"canary demo-mlp 1 + 2@50%: 20 answers, {seen.count('1')} from version 1, {seen.count('2')} from 2")
    mcpctl("traffic", "demo-mlp", "2")
    wait_for("every answer from version 2", lambda: set(versions_answering(10)) == {"2"}, 60)
    say("flip demo-mlp to version 2: 10 answers of 10 from version 2")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as reply:  # noqa: S310 - our own loopback address
        return json.load(reply)


def check_scrapes() -> None:
    def every_target_up() -> dict[str, int] | None:
        targets = get_json(f"{PROMETHEUS}/api/v1/targets?state=active")["data"]["activeTargets"]
        up: dict[str, int] = {}
        for t in targets:
            if t["health"] == "up":
                up[t["labels"]["job"]] = up.get(t["labels"]["job"], 0) + 1
        return up if up == JOBS else None

    up = wait_for("Prometheus scraping every service", every_target_up, 90, interval_s=2)

    def router_requests() -> float:  # the requests above, once a scrape after them is in
        query = urllib.parse.quote('sum(mcp_requests_total{job="mcp-router"})')
        series = get_json(f"{PROMETHEUS}/api/v1/query?query={query}")["data"]["result"]
        return float(series[0]["value"][1]) if series else 0.0

    total = wait_for("the router's mcp_requests_total in Prometheus", router_requests, 30)
    say(f"Prometheus: every target up {up}; the router's mcp_requests_total = {total:.0f}")


def worker_down_alerts() -> list[dict[str, Any]]:
    flt = urllib.parse.quote('alertname="WorkerDown"')
    return get_json(f"{ALERTMANAGER}/api/v2/alerts?filter={flt}")


def check_worker_down() -> None:
    run(["docker", "kill", KILLED], quiet=True)
    killed_at = time.monotonic()
    say(f"killed container {KILLED} ({KILLED_ID})")

    def from_health() -> bool:  # the health service's alert names the worker and lists its replicas
        return any(a["labels"].get("worker") == KILLED_ID and "replicas" in a["annotations"]
                   for a in worker_down_alerts())  # fmt: skip

    def from_prometheus() -> bool:  # the rule's scrape arm names the metrics endpoint that stopped answering
        return any(a["labels"].get("instance") == KILLED_METRICS for a in worker_down_alerts())

    wait_for("the health service's WorkerDown in Alertmanager", from_health, 60)
    say(f"Alertmanager has the health service's WorkerDown for {KILLED_ID} "
        f"({time.monotonic() - killed_at:.0f} s after the kill)")  # fmt: skip
    wait_for("Prometheus' WorkerDown in Alertmanager", from_prometheus, 120, interval_s=2)
    say(f"Alertmanager has Prometheus' WorkerDown for {KILLED_METRICS} "
        f"({time.monotonic() - killed_at:.0f} s after the kill; the rule waits 30 s)")  # fmt: skip
    version, _ = wait_for(
        "demo-mlp answered without the killed worker", lambda: triton_grpc_infer("demo-mlp"), 60
    )
    say(f"the router still answers demo-mlp (version {version}) with {KILLED_ID} gone")


# --- main -----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--keep", action="store_true", help="leave the cluster running (docker-compose down -v later)"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally blocks run: down, stop dockerd
    ok = False
    try:
        with docker_engine(args.keep):
            base = base_image()
            say(f"base image: {base}")
            run([str(ROOT / "tools" / "compose" / "wheelhouse.sh")], timeout=600)
            compose = Compose(base)
            compose.down()  # what an interrupted earlier run left
            compose.build()
            say("built the images: mcpmesh-test:cpu and the local etcd, Prometheus and Alertmanager")
            try:
                compose("up", "-d", "--no-build", timeout=600)
                say("docker-compose --profile cpu up -d: started")
                wait_healthy(compose)
                check_inference()
                check_canary()
                check_scrapes()
                check_worker_down()
                ok = True
            except BaseException:
                compose.logs()
                raise
            finally:
                if not args.keep:
                    compose.down()
    finally:
        minutes, seconds = divmod(time.monotonic() - T0, 60)
        print(
            f"compose-test: {'passed' if ok else 'FAILED'} in {int(minutes)} min {seconds:.0f} s", flush=True
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
