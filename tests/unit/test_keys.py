import pytest

from mcpcore.errors import InvalidArgument
from mcpcore.keys import Keyspace, ReplicaId

K = Keyspace()


def test_design_section_4_keys():
    assert K.worker("w1") == "/mcp/workers/w1"
    assert K.worker_load("w1") == "/mcp/workers/w1/load"
    assert K.model_spec("demo-mlp") == "/mcp/models/demo-mlp/spec"
    assert K.model_traffic("demo-mlp") == "/mcp/models/demo-mlp/traffic"
    assert K.replica("demo-mlp", "2", "w1") == "/mcp/replicas/demo-mlp/2/w1"
    assert K.breaker("demo-mlp") == "/mcp/breakers/demo-mlp"
    assert K.breaker_config() == "/mcp/config/breaker"
    assert K.stats("r1", "demo-mlp") == "/mcp/stats/r1/demo-mlp"
    assert K.leader("scheduler") == "/mcp/leader/scheduler"
    assert K.leader("health") == "/mcp/leader/health"
    assert K.model_routing("demo-mlp") == "/mcp/models/demo-mlp/routing"
    assert K.demand("demo-mlp", "r1") == "/mcp/demand/demo-mlp/r1"
    assert K.drain("w1") == "/mcp/drain/w1"


def test_prefix_is_configurable():
    assert Keyspace("/prod/mcp").replica("m", "1", "w") == "/prod/mcp/replicas/m/1/w"


@pytest.mark.parametrize("prefix", ["mcp", "/mcp/", "/a//b", ""])
def test_bad_prefix(prefix):
    with pytest.raises(InvalidArgument, match="key prefix"):
        Keyspace(prefix)


@pytest.mark.parametrize("name", ["a/b", "", "../x", "-x", "x" * 129, "a b"])
def test_names_cannot_escape_their_slot(name):
    with pytest.raises(InvalidArgument, match="model name"):
        K.model_spec(name)


@pytest.mark.parametrize("version", ["0", "v1", "1.0", "", "01"])
def test_bad_versions(version):
    with pytest.raises(InvalidArgument, match="version"):
        K.replica("m", version, "w")


def test_parse_round_trips():
    assert K.parse_replica_key(K.replica("m", "3", "w-1")) == ReplicaId("m", "3", "w-1")
    assert K.parse_worker_key(K.worker("w1")) == ("w1", False)
    assert K.parse_worker_key(K.worker_load("w1")) == ("w1", True)
    assert K.parse_model_key(K.model_traffic("m")) == ("m", "traffic")
    assert K.parse_breaker_key(K.breaker("m")) == "m"
    assert K.parse_stats_key(K.stats("r", "m")) == ("r", "m")
    assert K.parse_model_key(K.model_routing("m")) == ("m", "routing")
    assert K.parse_demand_key(K.demand("m", "r")) == ("m", "r")
    assert K.parse_drain_key(K.drain("w")) == "w"


@pytest.mark.parametrize(
    "key", ["/mcp/replicas/m/1", "/mcp/replicas/m/x/w", "/other/replicas/m/1/w", "/mcp/replicas/m/1/w/extra"]
)
def test_parse_rejects_foreign_keys(key):
    assert K.parse_replica_key(key) is None


def test_prefixes_nest():
    assert K.replica("m", "1", "w").startswith(K.replicas_prefix("m", "1"))
    assert K.replicas_prefix("m", "1").startswith(K.replicas_prefix("m"))
    assert K.replicas_prefix("m").startswith(K.replicas_prefix())
    assert not K.replicas_prefix("m").startswith(K.replicas_prefix("m2")) and not K.replicas_prefix(
        "m2"
    ).startswith(K.replicas_prefix("m"))
