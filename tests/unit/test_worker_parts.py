"""Pure parts of the worker: memory budget, heartbeat interval rule, config validation."""

from __future__ import annotations

import pytest

from mcp_worker.config import WorkerConfig
from mcp_worker.memory import MemoryBudget
from mcp_worker.registration import effective_interval
from mcpcore.config import load_config
from mcpcore.errors import InvalidArgument, ResourceExhausted


def test_budget_reserves_replaces_and_releases():
    budget = MemoryBudget(100, owner="worker w1")
    budget.reserve("a/1", 60)
    budget.reserve("a/1", 70)  # re-measured: replaces, does not add
    assert (budget.used, budget.free) == (70, 30)
    with pytest.raises(ResourceExhausted, match="b/1 needs 40 B but only 30 B of 100 B is free on worker w1"):
        budget.reserve("b/1", 40)
    assert budget.used == 70 and budget.held("b/1") == 0  # a refused reservation changes nothing
    assert budget.release("a/1") == 70 and budget.used == 0


@pytest.mark.parametrize(
    ("configured", "mean_exec", "ttl", "expected"),
    [
        (1.0, 0.001, 5, 1.0),  # fast model: the configured interval stands
        (1.0, 0.5, 5, 1.5),  # 3x the mean inference time
        (1.0, 2.0, 5, 2.5),  # but always below half the lease TTL, or the lease would lapse
    ],
)
def test_heartbeat_interval_is_at_least_three_inference_times(configured, mean_exec, ttl, expected):
    assert effective_interval(configured, mean_exec, ttl) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"MCP_WORKER_HEARTBEAT_INTERVAL_S": "6"}, "heartbeat_interval_s: must be > 0 and below lease_ttl_s"),
        ({"MCP_WORKER_LEASE_TTL_S": "0.5"}, "lease_ttl_s: must be >= 1"),
        ({"MCP_WORKER_WORKER_ID": "a/b"}, "worker_id 'a/b' is not valid"),
        ({"MCP_WORKER_LABELS": "gpu"}, "labels: 'gpu' must look like key=value"),
        ({"MCP_WORKER_EXEC_SLOTS": "0"}, "exec_slots: must be >= 1"),
        ({"MCP_WORKER_BLAS_THREADS": "-1"}, "blas_threads: must be >= 0"),
        ({"MCP_WORKER_INLINE_BATCH_MS": "-1"}, "inline_batch_ms: must be 0 \\(off\\) to 10 ms"),
        ({"MCP_WORKER_INLINE_BATCH_MS": "50"}, "inline_batch_ms: must be 0 \\(off\\) to 10 ms"),
        ({"MCP_WORKER_ZMQ_CURVE_CLIENTS_DIR": "/tmp"}, "zmq_curve_clients_dir needs zmq_curve_secret"),
        ({"MCP_WORKER_TLS__CERT_FILE": "/nonexistent.pem"}, "cert_file and key_file go together"),
        ({"MCP_WORKER_ETCD_AUTH__USER": "mesh"}, "etcd_auth: user and password_file go together"),
    ],
)
def test_worker_config_rejects_bad_values_by_name(env, match):
    with pytest.raises(InvalidArgument, match=match):
        load_config(WorkerConfig, env=env, env_prefix="MCP_WORKER_", name="worker")


def test_worker_config_defaults_and_env():
    cfg = load_config(
        WorkerConfig,
        env={
            "MCP_WORKER_WORKER_ID": "w1",
            "MCP_WORKER_LABELS": "gpu=h200,zone=a",
            "MCP_WORKER_LEASE_TTL_S": "2.5",
        },
        env_prefix="MCP_WORKER_",
    )
    assert cfg.worker_id == "w1" and cfg.label_map == {"gpu": "h200", "zone": "a"} and cfg.lease_ttl == 3
    assert load_config(WorkerConfig, env={}, env_prefix="MCP_WORKER_").worker_id  # defaults to host-pid
