"""mcpcore.metrics: a real /metrics server on a free port, scraped over HTTP, then stopped."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from mcpcore.metrics import STANDARD, CommonMetrics, Metrics, RequestMetrics, start_metrics_server


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        return resp.read().decode()


def port_is_closed(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_serve_scrape_and_stop() -> None:
    metrics = RequestMetrics(CollectorRegistry())
    server, port = start_metrics_server(0, registry=metrics.registry)
    try:
        assert port > 0 and port == server.port
        metrics.observe_request("demo-mlp", "1", "v2", "ok", seconds=0.003)
        metrics.observe_request(
            "demo-mlp", "1", "v2", "DEADLINE_EXCEEDED", seconds=0.2, error_class="timeout"
        )
        metrics.count_loop_error("replica_watch")
        body = scrape(port)
    finally:
        server.stop()
    assert 'mcp_requests_total{api_version="v2",model="demo-mlp",outcome="ok",version="1"} 1.0' in body
    assert 'mcp_request_errors_total{class="timeout",model="demo-mlp",version="1"} 1.0' in body
    assert 'mcp_loop_errors_total{loop="replica_watch"} 1.0' in body
    assert "mcp_request_duration_seconds_bucket" in body
    assert port_is_closed(port)
    server.stop()  # idempotent


def test_each_service_has_its_own_registry() -> None:
    a, b = CommonMetrics(CollectorRegistry()), CommonMetrics(CollectorRegistry())
    a.count_config_rejected("/mcp/config/breaker")
    with start_metrics_server(0, registry=b.registry)[0] as server:
        body = scrape(server.port)
    assert "mcp_config_rejected_total" in body  # declared ...
    assert 'key="/mcp/config/breaker"' not in body  # ... but a's sample is not b's
    assert port_is_closed(server.port)


def test_every_standard_metric_can_be_created() -> None:
    m = Metrics()
    for name in STANDARD:
        m.standard(name)


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("counter", "mcp_requests"),
        ("gauge", "mcp_things_total"),
        ("gauge", "requests_bytes"),
        ("gauge", "mcp_X"),
    ],
)
def test_bad_names_are_refused(kind: str, name: str) -> None:
    with pytest.raises(ValueError, match="metric name"):
        getattr(Metrics(), kind)(name, "doc")


def test_standard_names_cannot_be_redefined_differently() -> None:
    with pytest.raises(ValueError, match="standard"):
        Metrics().counter("mcp_requests_total", "doc", ("model",))


def test_service_specific_metric() -> None:
    m = Metrics()
    decrypt = m.histogram("mcp_model_decrypt_seconds", "Decrypt time.", ("model",))
    decrypt.labels("demo-mlp-enc").observe(0.01)
    assert m.registry.get_sample_value("mcp_model_decrypt_seconds_count", {"model": "demo-mlp-enc"}) == 1.0
