"""mcpcore.config: precedence, every field type, nested sections, durations, and errors that name the field
and the source."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mcp_health.config import HealthConfig
from mcp_router.config import RouterConfig
from mcp_scheduler.config import SchedulerConfig
from mcp_worker.config import WorkerConfig
from mcpcore.config import (
    add_flags,
    describe,
    env_names,
    flat,
    load_config,
    overrides_from_args,
    parse_bool,
    parse_duration,
    shared_env,
)
from mcpcore.errors import InvalidArgument


@dataclass(frozen=True)
class EtcdSection:
    endpoints: tuple[str, ...] = ("127.0.0.1:2379",)
    timeout_s: float = 5.0
    prefix: str = "/mcp"


@dataclass(frozen=True)
class BreakerSection:
    cool_down_s: float = 300.0
    metrics_window_s: float = 30.0


@dataclass(frozen=True)
class DemoConfig:
    grpc_port: int = 8001
    host: str = "127.0.0.1"
    ratio: float = 0.5
    debug: bool = False
    models: tuple[str, ...] = ()
    ports: tuple[int, ...] = ()
    heartbeat_s: float = 2.0
    keyring: str | None = None
    etcd: EtcdSection = field(default_factory=EtcdSection)
    breaker: BreakerSection = BreakerSection(cool_down_s=60.0)

    def __post_init__(self) -> None:
        if self.grpc_port < 0:
            raise ValueError(f"grpc_port: must be >= 0, got {self.grpc_port}")


@dataclass(frozen=True)
class NeedsName:
    worker_id: str
    port: int = 0


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "svc.yaml"
    path.write_text(text)
    return path


def message(exc: pytest.ExceptionInfo[InvalidArgument]) -> str:
    return exc.value.message


def test_defaults_only() -> None:
    cfg = load_config(DemoConfig)
    assert cfg == DemoConfig()
    assert cfg.breaker.cool_down_s == 60.0  # a default section instance keeps its own values


def test_precedence_defaults_yaml_env_flags(tmp_path: Path) -> None:
    path = write(tmp_path, "grpc_port: 1000\nhost: yaml-host\nratio: 0.25\n")
    env = {"MCP_ROUTER_GRPC_PORT": "2000", "MCP_ROUTER_HOST": "env-host", "OTHER_VAR": "x"}
    cfg = load_config(DemoConfig, yaml_path=path, env=env, overrides={"grpc_port": "3000"})
    assert cfg.grpc_port == 3000  # flag beats env beats YAML
    assert cfg.host == "env-host"  # env beats YAML
    assert cfg.ratio == 0.25  # YAML beats default
    assert cfg.debug is False  # default


def test_env_is_not_read_unless_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCP_ROUTER_GRPC_PORT", "1234")
    assert load_config(DemoConfig).grpc_port == 8001


def test_every_type_from_env() -> None:
    env = {
        "MCP_ROUTER_GRPC_PORT": " 9000 ",
        "MCP_ROUTER_HOST": "0.0.0.0",
        "MCP_ROUTER_RATIO": "0.75",
        "MCP_ROUTER_DEBUG": "yes",
        "MCP_ROUTER_MODELS": "demo-mlp, demo-onnx,,",
        "MCP_ROUTER_PORTS": "1,2,3",
        "MCP_ROUTER_HEARTBEAT_S": "250ms",
        "MCP_ROUTER_KEYRING": "/etc/keys",
    }
    cfg = load_config(DemoConfig, env=env)
    assert cfg.grpc_port == 9000
    assert cfg.host == "0.0.0.0"
    assert cfg.ratio == 0.75
    assert cfg.debug is True
    assert cfg.models == ("demo-mlp", "demo-onnx")
    assert cfg.ports == (1, 2, 3)
    assert cfg.heartbeat_s == pytest.approx(0.25)
    assert cfg.keyring == "/etc/keys"


def test_every_type_from_yaml(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
grpc_port: 9000
debug: true
ratio: 1
models: [a, b]
ports: "4, 5"
heartbeat_s: 1.5s
keyring: null
etcd:
  endpoints: [h1:2379, h2:2379]
  timeout_s: 250ms
breaker:
  cool_down_s: 5m
""",
    )
    cfg = load_config(DemoConfig, yaml_path=path)
    assert cfg.grpc_port == 9000
    assert cfg.debug is True
    assert cfg.ratio == 1.0 and isinstance(cfg.ratio, float)
    assert cfg.models == ("a", "b")
    assert cfg.ports == (4, 5)
    assert cfg.heartbeat_s == 1.5
    assert cfg.keyring is None
    assert cfg.etcd == EtcdSection(endpoints=("h1:2379", "h2:2379"), timeout_s=0.25)
    assert cfg.breaker == BreakerSection(cool_down_s=300.0, metrics_window_s=30.0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("true", True), ("FALSE", False), ("1", True), ("0", False), ("Yes", True), ("no", False)],
)
def test_bool_spellings(text: str, expected: bool) -> None:
    assert parse_bool(text) is expected
    assert load_config(DemoConfig, env={"MCP_ROUTER_DEBUG": text}).debug is expected


def test_nested_env_and_dotted_overrides() -> None:
    env = {"MCP_ROUTER_ETCD__ENDPOINTS": "a:1,b:2", "MCP_ROUTER_BREAKER__COOL_DOWN_S": "5m"}
    cfg = load_config(DemoConfig, env=env, overrides={"etcd.prefix": "/x"})
    assert cfg.etcd.endpoints == ("a:1", "b:2")
    assert cfg.etcd.prefix == "/x"
    assert cfg.etcd.timeout_s == 5.0
    assert cfg.breaker.cool_down_s == 300.0
    assert cfg.breaker.metrics_window_s == 30.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("5m", 300.0),
        ("250ms", 0.25),
        ("1.5s", 1.5),
        ("1h30m", 5400.0),
        ("100us", 1e-4),
        ("2", 2.0),
        (3, 3.0),
        (0.5, 0.5),
    ],
)
def test_parse_duration(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "5 parsecs", "-1s", "-3", "nan", "inf", "s", "1.5.2s", True])
def test_parse_duration_rejects(text: object) -> None:
    with pytest.raises(InvalidArgument):
        parse_duration(text)  # type: ignore[arg-type]


def test_unknown_yaml_key_suggests_closest(tmp_path: Path) -> None:
    path = write(tmp_path, "grpc_prot: 1\n")
    with pytest.raises(InvalidArgument) as exc:
        load_config(DemoConfig, yaml_path=path)
    assert message(exc) == f"router config: {path}: grpc_prot: unknown key (did you mean 'grpc_port'?)"


def test_unknown_nested_yaml_key(tmp_path: Path) -> None:
    path = write(tmp_path, "etcd:\n  endpoint: [a]\n")
    with pytest.raises(InvalidArgument, match=r"etcd\.endpoint: unknown key \(did you mean 'endpoints'\?\)"):
        load_config(DemoConfig, yaml_path=path)


def test_unknown_env_vars_are_ignored_with_one_warning_that_suggests_closest(caplog) -> None:
    """Kubernetes injects MCP_ROUTER_PORT, MCP_ROUTER_SERVICE_HOST ... for a Service named mcp-router."""
    env = {"MCP_ROUTER_GRPC_PROT": "1", "MCP_ROUTER_PORT": "tcp://10.0.0.1:8001", "MCP_ROUTER_GRPC_PORT": "9"}
    with caplog.at_level("WARNING", logger="mcpcore.config"):
        cfg = load_config(DemoConfig, env=env)
    assert cfg.grpc_port == 9  # the known ones still apply
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert warnings[0] == (
        "router config: ignoring environment variables that name no setting: "
        "MCP_ROUTER_GRPC_PROT (did you mean 'MCP_ROUTER_GRPC_PORT'?), "
        "MCP_ROUTER_PORT (did you mean 'MCP_ROUTER_PORTS'?)"
    )


def test_the_real_router_config_starts_beside_kubernetes_service_variables(caplog) -> None:
    env = {
        "MCP_ROUTER_PORT": "tcp://10.96.0.7:8001", "MCP_ROUTER_PORT_8001_TCP": "tcp://10.96.0.7:8001",
        "MCP_ROUTER_SERVICE_HOST": "10.96.0.7", "MCP_ROUTER_SERVICE_PORT": "8001",
        "MCP_ROUTER_SERVICE_PORT_GRPC": "8001", "MCP_ROUTER_ROUTER_ID": "r-0",
    }  # fmt: skip
    with caplog.at_level("WARNING", logger="mcpcore.config"):
        cfg = load_config(RouterConfig, env=env, env_prefix="MCP_ROUTER_")
    assert cfg.router_id == "r-0"
    assert "MCP_ROUTER_SERVICE_HOST" in caplog.text


def test_mcp_etcd_endpoints_is_read_by_every_service_below_its_own_variable() -> None:
    shared = {"MCP_ETCD_ENDPOINTS": "etcd-0.etcd:2379,etcd-1.etcd:2379"}
    for cls, prefix in (
        (RouterConfig, "MCP_ROUTER_"), (SchedulerConfig, "MCP_SCHEDULER_"), (HealthConfig, "MCP_HEALTH_"),
        (WorkerConfig, "MCP_WORKER_"),
    ):  # fmt: skip
        extra = {"MCP_WORKER_WORKER_ID": "w-1"} if cls is WorkerConfig else {}
        cfg = load_config(cls, env={**shared, **extra}, env_prefix=prefix)
        assert cfg.etcd.endpoints == ("etcd-0.etcd:2379", "etcd-1.etcd:2379"), cls
        own = load_config(
            cls, env={**shared, **extra, f"{prefix}ETCD_ENDPOINTS": "own:2379"}, env_prefix=prefix
        )
        assert own.etcd.endpoints == ("own:2379",), cls
        flag = load_config(
            cls, env={**shared, **extra}, env_prefix=prefix, overrides={"etcd_endpoints": "f:1"}
        )
        assert flag.etcd.endpoints == ("f:1",), cls


def test_a_bad_shared_variable_names_itself() -> None:
    @dataclass(frozen=True)
    class WithEtcd:
        etcd_endpoints: tuple[int, ...] = field(default=(), metadata=shared_env("MCP_ETCD_ENDPOINTS"))

    with pytest.raises(InvalidArgument) as exc:
        load_config(WithEtcd, env={"MCP_ETCD_ENDPOINTS": "a:1"})
    assert message(exc) == "router config: MCP_ETCD_ENDPOINTS: not an integer: 'a:1'"


@dataclass(frozen=True)
class Serving:
    host: str = "127.0.0.1"
    port: int = 0


@dataclass(frozen=True)
class Store:
    endpoints: tuple[str, ...] = field(default=("e:1",), metadata=shared_env("MCP_SHARED_EP", "MCP_OLD_EP"))
    auth: BreakerSection = field(default_factory=BreakerSection)  # a plain section inside a flat one


@dataclass(frozen=True)
class FlatConfig:
    name: str = ""
    grpc: Serving = field(default_factory=lambda: Serving(port=8001), metadata=flat("grpc_"))
    store: Store = field(default_factory=Store, metadata=flat("store_"))


def test_a_flat_section_keeps_flat_names_in_every_source(tmp_path: Path) -> None:
    assert load_config(FlatConfig).grpc == Serving(port=8001)  # the config's own default instance
    yaml_path = write(tmp_path, "grpc_port: 9\nstore_auth: {cool_down_s: 5}\n")
    cfg = load_config(FlatConfig, yaml_path=yaml_path)
    assert (cfg.grpc, cfg.store.auth.cool_down_s) == (Serving(port=9), 5.0)
    env = {"MCP_ROUTER_GRPC_HOST": "h", "MCP_ROUTER_STORE_AUTH__COOL_DOWN_S": "1m"}
    cfg = load_config(FlatConfig, yaml_path=yaml_path, env=env)
    assert (cfg.grpc, cfg.store.auth.cool_down_s) == (Serving("h", 9), 60.0)
    ns = parser_for(FlatConfig).parse_args(["--grpc-port", "7", "--store-auth.cool-down-s", "2"])
    cfg = load_config(FlatConfig, yaml_path=yaml_path, env=env, overrides=overrides_from_args(ns))
    assert (cfg.grpc, cfg.store.auth.cool_down_s) == (Serving("h", 7), 2.0)
    assert env_names(FlatConfig, "MCP_ROUTER_") == {
        "MCP_ROUTER_NAME", "MCP_ROUTER_GRPC_HOST", "MCP_ROUTER_GRPC_PORT", "MCP_ROUTER_STORE_ENDPOINTS",
        "MCP_ROUTER_STORE_AUTH__COOL_DOWN_S", "MCP_ROUTER_STORE_AUTH__METRICS_WINDOW_S", "MCP_SHARED_EP",
        "MCP_OLD_EP",
    }  # fmt: skip


def test_a_flat_section_has_no_nested_name(tmp_path: Path, caplog) -> None:
    with pytest.raises(InvalidArgument) as exc:
        load_config(FlatConfig, yaml_path=write(tmp_path, "grpc: {port: 1}\n"))
    assert (
        message(exc)
        == f"router config: {tmp_path / 'svc.yaml'}: grpc: unknown key (did you mean 'grpc_port'?)"
    )
    with caplog.at_level("WARNING", logger="mcpcore.config"):
        assert load_config(FlatConfig, env={"MCP_ROUTER_GRPC__PORT": "1"}).grpc.port == 8001
    assert "MCP_ROUTER_GRPC__PORT" in caplog.text


def test_two_fields_with_one_name_are_a_bug() -> None:
    @dataclass(frozen=True)
    class Clash:
        grpc_port: int = 0
        grpc: Serving = field(default_factory=Serving, metadata=flat("grpc_"))

    with pytest.raises(TypeError, match="two fields are named 'grpc_port'"):
        load_config(Clash)


def test_describe_names_each_setting_as_operators_do() -> None:
    by_name = {setting.name: setting for setting in describe(FlatConfig, "MCP_ROUTER_")}
    endpoints = by_name["store_endpoints"]
    assert endpoints.flag == "--store-endpoints" and endpoints.default == ("e:1",)
    assert endpoints.env == ("MCP_ROUTER_STORE_ENDPOINTS", "MCP_SHARED_EP", "MCP_OLD_EP")
    assert (endpoints.owner, endpoints.field) == (Store, "endpoints")
    assert by_name["grpc_port"].default == 8001  # the config's default instance, not the section's
    assert by_name["store_auth.cool_down_s"].flag == "--store-auth.cool-down-s"
    assert describe(NeedsName, "MCP_WORKER_")[0].default is dataclasses.MISSING


def test_shared_variables_first_name_wins_below_the_prefixed_one() -> None:
    def endpoints(**env: str) -> tuple[str, ...]:
        return load_config(FlatConfig, env=env).store.endpoints

    assert endpoints() == ("e:1",)
    assert endpoints(MCP_OLD_EP="o:1") == ("o:1",)
    assert endpoints(MCP_OLD_EP="o:1", MCP_SHARED_EP="s:1") == ("s:1",)
    assert endpoints(MCP_OLD_EP="o:1", MCP_SHARED_EP="s:1", MCP_ROUTER_STORE_ENDPOINTS="p:1") == ("p:1",)


def test_env_vars_of_other_services_are_ignored() -> None:
    cfg = load_config(DemoConfig, env={"MCP_WORKER_WHATEVER": "1", "MCP_ETCD_ENDPOINTS": "x"})
    assert cfg == DemoConfig()  # no field of it names the shared variable: it sets nothing


def test_bad_env_type_names_the_var() -> None:
    with pytest.raises(InvalidArgument) as exc:
        load_config(DemoConfig, env={"MCP_ROUTER_GRPC_PORT": "abc"})
    assert message(exc) == "router config: MCP_ROUTER_GRPC_PORT: not an integer: 'abc'"


def test_bad_yaml_type_names_file_and_field(tmp_path: Path) -> None:
    path = write(tmp_path, "etcd:\n  timeout_s: soon\n")
    with pytest.raises(InvalidArgument) as exc:
        load_config(DemoConfig, yaml_path=path)
    assert message(exc).startswith(f"router config: {path}: etcd.timeout_s: not a duration: 'soon'")


@pytest.mark.parametrize(
    ("yaml_text", "needle"),
    [
        ("grpc_port: true\n", "grpc_port: not an integer: True"),
        ("host: 12\n", "host: expected a string, got 12"),
        ("debug: maybe\n", "debug: not a boolean"),
        ("ratio: .nan\n", "ratio: not a finite number"),
        ("ratio: [1]\n", "ratio: not a number"),
        ("models: {a: 1}\n", "models: expected a list"),
        ("etcd: 5\n", "etcd: expected a mapping, got int"),
        ("- 1\n", "top level: expected a mapping, got list"),
        ("grpc_port: [\n", "not valid YAML"),
    ],
)
def test_bad_yaml_values(tmp_path: Path, yaml_text: str, needle: str) -> None:
    path = write(tmp_path, yaml_text)
    with pytest.raises(InvalidArgument) as exc:
        load_config(DemoConfig, yaml_path=path)
    assert needle in message(exc)
    assert str(path) in message(exc)


def test_bad_value_is_caught_even_when_overridden(tmp_path: Path) -> None:
    path = write(tmp_path, "grpc_port: abc\n")
    with pytest.raises(InvalidArgument, match="grpc_port: not an integer"):
        load_config(DemoConfig, yaml_path=path, overrides={"grpc_port": 1})


def test_missing_yaml_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="cannot read"):
        load_config(DemoConfig, yaml_path=tmp_path / "nope.yaml")


def test_empty_yaml_file_means_defaults(tmp_path: Path) -> None:
    assert load_config(DemoConfig, yaml_path=write(tmp_path, "")) == DemoConfig()


def test_required_field_names_its_sources() -> None:
    with pytest.raises(InvalidArgument) as exc:
        load_config(NeedsName, env_prefix="MCP_WORKER_")
    assert message(exc) == (
        "worker config: worker_id: required; set it in YAML, MCP_WORKER_WORKER_ID or --worker-id"
    )
    cfg = load_config(NeedsName, env={"MCP_WORKER_WORKER_ID": "w1"}, env_prefix="MCP_WORKER_")
    assert cfg == NeedsName(worker_id="w1")


def test_post_init_rule_becomes_invalid_argument() -> None:
    with pytest.raises(InvalidArgument) as exc:
        load_config(DemoConfig, overrides={"grpc_port": -1}, name="demo")
    assert message(exc) == "demo config: grpc_port: must be >= 0, got -1"


def test_not_a_frozen_dataclass_is_a_bug() -> None:
    @dataclass
    class Mutable:
        x: int = 1

    with pytest.raises(TypeError, match="frozen"):
        load_config(Mutable)


def test_unsupported_field_type_is_a_bug() -> None:
    with pytest.raises(TypeError, match="unsupported config field type"):
        load_config(WithDict)


@dataclass(frozen=True)
class WithDict:
    labels: dict[str, str] = field(default_factory=dict)


def parser_for(cls: type) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    add_flags(parser, cls, env_prefix="MCP_ROUTER_")
    return parser


def test_flags_override_and_only_given_ones_count() -> None:
    ns = parser_for(DemoConfig).parse_args(
        ["--config", "x.yaml", "--grpc-port", "7000", "--debug", "--models", "a,b", "--heartbeat-s", "5m"]
    )
    overrides = overrides_from_args(ns)
    assert overrides == {"grpc_port": "7000", "debug": True, "models": "a,b", "heartbeat_s": "5m"}
    cfg = load_config(
        DemoConfig, env={"MCP_ROUTER_GRPC_PORT": "1", "MCP_ROUTER_HOST": "h"}, overrides=overrides
    )
    assert (cfg.grpc_port, cfg.debug, cfg.models, cfg.heartbeat_s, cfg.host) == (
        7000,
        True,
        ("a", "b"),
        300,
        "h",
    )


def test_no_bool_flag_and_section_flags() -> None:
    parser = parser_for(DemoConfig)
    assert overrides_from_args(parser.parse_args(["--no-debug"])) == {"debug": False}
    assert overrides_from_args(parser.parse_args([])) == {}
    given = overrides_from_args(
        parser.parse_args(["--etcd.timeout-s", "250ms", "--breaker.cool-down-s", "1"])
    )
    assert given == {"etcd.timeout_s": "250ms", "breaker.cool_down_s": "1"}
    cfg = load_config(DemoConfig, overrides=given)
    assert (cfg.etcd.timeout_s, cfg.breaker.cool_down_s, cfg.breaker.metrics_window_s) == (0.25, 1.0, 30.0)
    with pytest.raises(SystemExit):
        parser.parse_args(["--etcd", "x"])  # a section is no setting
    assert "MCP_ROUTER_GRPC_PORT" in parser.format_help()
    assert "MCP_ROUTER_BREAKER__COOL_DOWN_S" in parser.format_help()


def test_bad_flag_value_names_the_flag() -> None:
    ns = parser_for(DemoConfig).parse_args(["--grpc-port", "abc"])
    with pytest.raises(InvalidArgument) as exc:
        load_config(DemoConfig, overrides=overrides_from_args(ns))
    assert message(exc) == "router config: --grpc-port: not an integer: 'abc'"


def test_unknown_override_suggests_closest() -> None:
    with pytest.raises(InvalidArgument, match=r"--grpc-prot: unknown option \(did you mean 'grpc_port'\?\)"):
        load_config(DemoConfig, overrides={"grpc_prot": 1})


def test_the_routers_grpc_server_is_one_it_knows() -> None:
    assert load_config(RouterConfig, env={}, env_prefix="MCP_ROUTER_").grpc_server == "native"
    chosen = load_config(RouterConfig, env={"MCP_ROUTER_GRPC_SERVER": "aio"}, env_prefix="MCP_ROUTER_")
    assert chosen.grpc_server == "aio"
    with pytest.raises(InvalidArgument) as exc:
        load_config(RouterConfig, env={"MCP_ROUTER_GRPC_SERVER": "grpcio"}, env_prefix="MCP_ROUTER_")
    assert message(exc) == "router config: grpc_server: must be one of native, aio, got 'grpcio'"


def test_the_routers_coalesce_flush_at_is_a_count_or_zero() -> None:
    assert load_config(RouterConfig, env={}, env_prefix="MCP_ROUTER_").coalesce_flush_at == 8
    off = load_config(RouterConfig, env={"MCP_ROUTER_COALESCE_FLUSH_AT": "0"}, env_prefix="MCP_ROUTER_")
    assert off.coalesce_flush_at == 0
    with pytest.raises(InvalidArgument) as exc:
        load_config(RouterConfig, env={"MCP_ROUTER_COALESCE_FLUSH_AT": "-1"}, env_prefix="MCP_ROUTER_")
    assert message(exc) == (
        "router config: coalesce_flush_at: must be >= 0 (0: only at the next loop iteration), got -1"
    )
