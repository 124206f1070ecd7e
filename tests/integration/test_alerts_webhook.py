"""mcp_health.alerts against a real local HTTP receiver: delivery, a 500 retried, a dead or hung webhook."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator

import pytest
from webhook_receiver import WebhookReceiver

from mcp_health.alerts import Alerter, worker_down

T0 = 1_700_000_000.0


def down(worker: str = "w1"):
    return worker_down(
        worker, replicas=["demo-mlp:1", "demo-mlp:2"], last_active=T0, reason="lease expired", now=T0 + 12
    )


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as hook:
        yield hook


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A loopback port that is bound but not listening: connections are refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/api/v2/alerts"


@pytest.fixture
def hung_url() -> Iterator[str]:
    """A loopback port that accepts connections (into the backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/api/v2/alerts"


async def test_fired_alert_reaches_the_webhook(receiver: WebhookReceiver) -> None:
    alerter = Alerter(receiver.url, generator_url="http://127.0.0.1:9103/metrics")
    await alerter.fire(down())
    (post,) = await receiver.wait_for_async(lambda posts: len(posts) >= 1)
    assert post.path == "/api/v2/alerts"
    assert post.content_type == "application/json"
    (alert,) = post.body
    assert alert["labels"] == {"alertname": "WorkerDown", "severity": "critical", "worker": "w1"}
    assert alert["annotations"]["last_active"] == "2023-11-14T22:13:20.000Z"
    assert alert["annotations"]["last_active_unix"] == "1700000000.000"
    assert "2023-11-14T22:13:20.000Z" in alert["annotations"]["description"]
    assert alert["annotations"]["replicas"] == "demo-mlp:1,demo-mlp:2"
    assert alert["startsAt"] == "2023-11-14T22:13:32.000Z"
    assert alert["generatorURL"] == "http://127.0.0.1:9103/metrics"
    assert "endsAt" not in alert

    await alerter.resolve(down())
    posts = await receiver.wait_for_async(lambda posts: len(posts) >= 2)
    (resolved,) = posts[1].body
    assert resolved["labels"] == alert["labels"]
    assert resolved["endsAt"] >= resolved["startsAt"]
    await alerter.close()
    assert alerter.sent == 2


async def test_a_500_is_retried_and_then_delivered() -> None:
    errors: list[str] = []
    with WebhookReceiver(statuses=[500]) as hook:
        alerter = Alerter(hook.url, attempts=3, backoff_s=0.01, on_error=errors.append)
        await alerter.fire(down())
        posts = await hook.wait_for_async(lambda posts: any(p.status == 200 for p in posts))
        await alerter.close()
    assert [p.status for p in posts] == [500, 200]
    assert posts[0].body == posts[1].body
    assert (alerter.sent, alerter.failed, errors) == (1, 0, [])


async def test_dead_webhook_is_logged_counted_and_the_service_goes_on(
    refused_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    errors: list[str] = []
    alerter = Alerter(refused_url, attempts=2, backoff_s=0.01, on_error=errors.append)
    await alerter.fire(down("w1"))  # no exception
    await alerter.flush()
    await alerter.fire(down("w2"))  # the sender is still there
    await alerter.flush()
    await alerter.close()
    assert (alerter.sent, alerter.failed, errors) == (0, 2, ["alert_webhook", "alert_webhook"])
    failures = [
        json.loads(r.getMessage())
        for r in caplog.records
        if r.name == "mcp_health.alerts" and r.levelno == logging.ERROR
    ]
    assert [f["event"] for f in failures] == ["alert_webhook_failed"] * 2
    assert failures[0]["attempts"] == 2
    assert "refused" in failures[0]["error"].lower()
    fired = [r for r in caplog.records if r.name == "mcp_health.alerts" and r.levelno == logging.WARNING]
    assert len(fired) == 2  # each alert still got its log line


async def test_hung_webhook_times_out_off_the_event_loop(hung_url: str) -> None:
    errors: list[str] = []
    alerter = Alerter(hung_url, timeout_s=0.3, attempts=1, on_error=errors.append)
    started = time.monotonic()
    await alerter.fire(down())
    assert time.monotonic() - started < 0.1  # the POST runs in a thread, not in fire()
    await alerter.flush()
    assert time.monotonic() - started >= 0.25  # it waited for the timeout
    await alerter.close()
    assert (alerter.failed, errors) == (1, ["alert_webhook"])
