"""``mcpcore.settings``: the sections every service nests keep the flat names operators use (YAML keys, env
vars, flags) in all four services, each service keeps its own default ports, and the process's options
read the names every process and OpenTelemetry use."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from mcp_health.config import HealthConfig
from mcp_router.config import RouterConfig
from mcp_scheduler.config import SchedulerConfig
from mcp_worker.config import WorkerConfig
from mcpcore.config import add_flags, load_config, overrides_from_args
from mcpcore.errors import InvalidArgument
from mcpcore.settings import Advertise, EtcdSettings, GrpcServing, MetricsServing, ProcessOptions

SERVICES = [
    (RouterConfig, "MCP_ROUTER_", (8001, 9101)),
    (SchedulerConfig, "MCP_SCHEDULER_", (50051, 9102)),
    (HealthConfig, "MCP_HEALTH_", (50053, 9103)),
    (WorkerConfig, "MCP_WORKER_", (0, 0)),
]
IDS = [cls.__name__ for cls, _, _ in SERVICES]
#: The shared settings by the flat names deploy/, tests/integration/harness.py and tools/ pass.
FLAT = {
    "grpc_host": "0.0.0.0", "grpc_port": "7001", "metrics_host": "0.0.0.0", "metrics_port": "7002",
    "advertise_host": "10.1.2.3", "etcd_endpoints": "etcd-0:2379,etcd-1:2379", "etcd_prefix": "/m2",
    "etcd_timeout_s": "250ms",
}  # fmt: skip


def _check(cfg: Any) -> None:
    assert cfg.grpc == GrpcServing("0.0.0.0", 7001)
    assert cfg.metrics == MetricsServing("0.0.0.0", 7002)
    assert cfg.advertise == Advertise("10.1.2.3")
    etcd = cfg.etcd
    assert (etcd.endpoints, etcd.prefix, etcd.timeout_s) == (("etcd-0:2379", "etcd-1:2379"), "/m2", 0.25)


def _id_env(cls: type, prefix: str) -> dict[str, str]:
    return {f"{prefix}WORKER_ID": "w-1"} if cls is WorkerConfig else {}


@pytest.mark.parametrize(("cls", "prefix", "ports"), SERVICES, ids=IDS)
def test_each_service_keeps_its_default_ports(cls, prefix, ports):
    cfg = load_config(cls, env=_id_env(cls, prefix), env_prefix=prefix)
    assert (cfg.grpc.port, cfg.metrics.port) == ports
    assert cfg.grpc.host == cfg.metrics.host == "127.0.0.1" and cfg.advertise.host == ""
    assert cfg.etcd == EtcdSettings()


@pytest.mark.parametrize(("cls", "prefix", "ports"), SERVICES, ids=IDS)
def test_the_shared_settings_keep_their_flat_names_in_every_source(cls, prefix, ports, tmp_path: Path):
    env = {**_id_env(cls, prefix), **{prefix + name.upper(): value for name, value in FLAT.items()}}
    _check(load_config(cls, env=env, env_prefix=prefix))
    yaml_path = tmp_path / "svc.yaml"
    yaml_path.write_text("".join(f"{name}: {value!r}\n" for name, value in FLAT.items()))
    _check(load_config(cls, yaml_path=yaml_path, env=_id_env(cls, prefix), env_prefix=prefix))
    parser = argparse.ArgumentParser()
    add_flags(parser, cls, env_prefix=prefix)
    args = [arg for name, value in FLAT.items() for arg in ("--" + name.replace("_", "-"), value)]
    ns = parser.parse_args(args)
    _check(load_config(cls, env=_id_env(cls, prefix), env_prefix=prefix, overrides=overrides_from_args(ns)))


@pytest.mark.parametrize(("cls", "prefix", "ports"), SERVICES, ids=IDS)
def test_tls_and_etcd_auth_stay_nested_sections(cls, prefix, ports, tmp_path: Path):
    ca = tmp_path / "ca.pem"
    ca.write_text("")
    env = {
        **_id_env(cls, prefix), f"{prefix}TLS__SERVER_NAME": "mesh.local",
        f"{prefix}ETCD_AUTH__CA_FILE": str(ca), f"{prefix}TLS__CONTROL_CLIENTS": "ops,mcpctl",
    }  # fmt: skip
    cfg = load_config(cls, env=env, env_prefix=prefix)
    assert cfg.tls.server_name == "mesh.local" and cfg.tls.control_clients == ("ops", "mcpctl")
    assert cfg.etcd.auth.ca_file == str(ca)


def _process(**env: str) -> ProcessOptions:
    return load_config(HealthConfig, env=env, env_prefix="MCP_HEALTH_").process


def test_log_settings_take_the_names_every_process_reads():
    assert (_process().log_format, _process().log_level) == ("json", "INFO")
    assert _process(MCP_LOG_FORMAT="TEXT", MCP_LOG_LEVEL="debug").log_format == "text"
    assert _process(MCP_LOG_LEVEL="debug").log_level == "DEBUG"
    assert _process(MCP_LOG_FORMAT="text", MCP_HEALTH_LOG_FORMAT="json").log_format == "json"
    assert _process(MCP_LOG_FORMAT="", MCP_LOG_LEVEL=" ").log_format == "json"  # set empty: unset
    with pytest.raises(InvalidArgument, match=r"log_format: use one of json, text, got 'xml'"):
        _process(MCP_LOG_FORMAT="xml")
    with pytest.raises(InvalidArgument, match=r"log_level: use DEBUG, INFO, WARNING, ERROR or CRITICAL"):
        _process(MCP_LOG_LEVEL="LOUD")


def test_tracing_takes_the_standard_opentelemetry_names():
    both = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://all:4317", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "t:4317"}
    assert _process(**both).otlp_endpoint == "http://t:4317"  # traces' first; a bare host:port is plaintext
    assert _process(OTEL_EXPORTER_OTLP_ENDPOINT="http://all:4317").otlp_endpoint == "http://all:4317"
    assert _process().otlp_endpoint == ""  # none: tracing off
    flagged = load_config(
        HealthConfig, env=both, env_prefix="MCP_HEALTH_", overrides={"otlp_endpoint": "https://flag:4317"}
    )
    assert flagged.process.otlp_endpoint == "https://flag:4317"  # the option first
    assert _process().trace_sample_ratio == 1.0
    assert _process(OTEL_TRACES_SAMPLER_ARG="0.25").trace_sample_ratio == 0.25
    for bad, needle in (("1.5", "trace_sample_ratio: give the share"), ("-0.1", "trace_sample_ratio"),
                        ("half", "OTEL_TRACES_SAMPLER_ARG: not a number")):  # fmt: skip
        with pytest.raises(InvalidArgument, match=needle):
            _process(OTEL_TRACES_SAMPLER_ARG=bad)
