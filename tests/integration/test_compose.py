"""The compose deployment validates for both profiles and wires the services the way the code expects.

Fast: ``docker-compose config`` only, no engine. ``make compose-test`` (tools/compose_test.py) builds and
runs the cpu profile for real; the gpu profile is only validated here (these machines have no GPU).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from mcp_worker.server import _advertised

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "deploy" / "compose"
COMPOSE = COMPOSE_DIR / "docker-compose.yml"
CONTROL = {"etcd", "scheduler", "router", "health", "init", "prometheus", "alertmanager"}
MESH = ("scheduler", "router", "health", "init")


def _config(*files: Path) -> dict[str, Any]:
    """The merged, interpolated configuration, as ``docker-compose config`` (1.29) prints it."""
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose not installed: make setup installs it")
    cmd = ["docker-compose", *(a for f in files or (COMPOSE,) for a in ("-f", str(f))), "config"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def _profile(config: dict[str, Any], profile: str) -> dict[str, Any]:
    """The services ``--profile PROFILE up`` starts (1.29's ``config`` lists every service)."""
    return {n: s for n, s in config["services"].items() if profile in s.get("profiles", [profile])}


def _published(service: dict[str, Any]) -> dict[int, str]:
    """Host port -> host address of each ``ports`` entry ("[IP:]HOST:CONTAINER" or the long form)."""
    out = {}
    for port in service.get("ports", []):
        if isinstance(port, dict):
            out[int(port["published"])] = port.get("host_ip", "0.0.0.0")
        else:
            parts = str(port).split("/")[0].split(":")
            out[int(parts[-2])] = parts[0] if len(parts) == 3 else "0.0.0.0"
    return out


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return _config()


@pytest.fixture(scope="module")
def cpu(config: dict[str, Any]) -> dict[str, Any]:
    return _profile(config, "cpu")


@pytest.fixture(scope="module")
def gpu(config: dict[str, Any]) -> dict[str, Any]:
    return _profile(config, "gpu")


def test_profiles_pick_the_workers(config: dict[str, Any], cpu: dict[str, Any], gpu: dict[str, Any]) -> None:
    assert set(cpu) == CONTROL | {"cpu-worker-1", "cpu-worker-2"}
    assert set(gpu) == CONTROL | {"worker-1", "worker-2"}
    assert set(_profile(config, "grafana")) == CONTROL | {"grafana"}
    for services, prefix, flavour in ((cpu, "cpu-", "cpu"), (gpu, "", "gpu")):
        for n in ("1", "2"):
            worker = services[f"{prefix}worker-{n}"]
            env = worker["environment"]
            # the same container name in both profiles: Prometheus' targets and the advertised host hold
            assert worker["container_name"] == env["MCP_WORKER_ADVERTISE_HOST"] == f"mcpmesh-worker-{n}"
            assert (
                env["MCP_WORKER_WORKER_ID"] == f"worker-{n}"
                and env["MCP_WORKER_ETCD_ENDPOINTS"] == "etcd:2379"
            )
            assert worker["image"] == f"mcpmesh:{flavour}"
        for name in MESH:
            assert services[name]["image"] == "mcpmesh:cpu"


def test_each_gpu_worker_gets_its_own_gpu(gpu: dict[str, Any]) -> None:
    ids = []
    for name in ("worker-1", "worker-2"):
        (device,) = gpu[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"] and "count" not in device
        ids.append(device["device_ids"])
        build = gpu[name]["build"]["args"]
        assert build["CUDA"] == "1" and "cuda" in build["BASE_IMAGE"] and "devel" in build["BUILD_IMAGE"]
        assert gpu[name]["environment"]["MCP_WORKER_NUMA_PIN"] == "true"
    assert ids == [["0"], ["1"]]


def test_services_wait_for_healthy_dependencies(cpu: dict[str, Any]) -> None:
    for name, service in cpu.items():
        if name != "init":  # a one-shot job: it exits 0
            assert service["healthcheck"]["test"][0] == "CMD", name
        for dependency, how in service.get("depends_on", {}).items():
            assert how["condition"] == "service_healthy", (name, dependency)
    assert set(cpu["init"]["depends_on"]) == {"scheduler", "router", "health"}
    assert cpu["init"]["command"] == ["init"] and cpu["init"]["restart"] == "no"
    for name in ("scheduler", "router", "health", "cpu-worker-1", "cpu-worker-2"):
        assert cpu[name]["depends_on"]["etcd"]["condition"] == "service_healthy"


def test_etcd_compacts_and_stays_off_the_host(cpu: dict[str, Any]) -> None:
    etcd = cpu["etcd"]
    assert "--auto-compaction-mode=periodic" in etcd["command"]
    assert "--auto-compaction-retention=10m" in etcd["command"]
    assert "ports" not in etcd
    asked = _config(COMPOSE, COMPOSE_DIR / "docker-compose.etcd-port.yml")["services"]["etcd"]
    assert _published(asked) == {2379: "127.0.0.1"}
    published = {port: ip for s in cpu.values() for port, ip in _published(s).items()}
    assert published == {
        8000: "0.0.0.0", 8001: "0.0.0.0", 50051: "127.0.0.1", 50053: "127.0.0.1",
        9090: "127.0.0.1", 9093: "127.0.0.1",
    }  # fmt: skip


def test_alerts_and_scrapes_reach_the_services(cpu: dict[str, Any]) -> None:
    assert (
        cpu["health"]["environment"]["MCP_HEALTH_ALERT_WEBHOOK"] == "http://alertmanager:9093/api/v2/alerts"
    )
    assert cpu["router"]["environment"]["MCP_ROUTER_SCHEDULER"] == "scheduler:50051"
    prometheus = yaml.safe_load((COMPOSE_DIR / "prometheus" / "prometheus.yml").read_text())
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in prometheus["scrape_configs"]}
    workers = [
        f"{cpu[w]['container_name']}:{cpu[w]['environment']['MCP_WORKER_METRICS_PORT']}"
        for w in ("cpu-worker-1", "cpu-worker-2")
    ]
    assert targets["mcp-worker"] == workers
    assert prometheus["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    alertmanager = yaml.safe_load((COMPOSE_DIR / "alertmanager" / "alertmanager.yml").read_text())
    assert alertmanager["route"]["receiver"] in {r["name"] for r in alertmanager["receivers"]}


def test_the_test_override_keeps_everything_on_loopback() -> None:
    services = _profile(_config(COMPOSE, COMPOSE_DIR / "docker-compose.test.yml"), "cpu")
    for name, service in services.items():
        assert service["network_mode"] == "host", name
        env = service.get("environment", {})
        assert all("etcd:" not in str(v) and "scheduler:" not in str(v) for v in env.values()), name
    for name in ("etcd", "prometheus", "alertmanager"):
        assert services[name]["build"]["context"].endswith("deploy/compose/local"), name


def test_dockerignore_keeps_the_context_small() -> None:
    lines = [
        line
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert lines[0] == "*"  # an allow-list: .git, .venv, .run, .tools, models... never go in
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert not allowed & {".git", ".venv", ".run", ".tools", ".whl", "models", "certs", "tests"}


def test_workers_publish_the_host_others_dial() -> None:
    assert _advertised("tcp://0.0.0.0:5561", "worker-1") == "tcp://worker-1:5561"
    assert _advertised("tcp://127.0.0.1:5561", "") == "tcp://127.0.0.1:5561"
    assert _advertised("ipc:///tmp/w.sock", "worker-1") == "ipc:///tmp/w.sock"
