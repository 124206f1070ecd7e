"""mcp_health.alerts without a network: Alertmanager payloads, log lines, dedupe, retries, queue bound."""

from __future__ import annotations

import asyncio
import json
import logging
import threading

import pytest

from mcp_health.alerts import Alert, Alerter, breaker_open, rfc3339, worker_down, worker_sick

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
URL = "http://alertmanager.invalid/api/v2/alerts"


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakePost:
    """Records bodies; answers the scripted statuses (then 200), or raises a scripted exception."""

    def __init__(self, *answers: int | Exception) -> None:
        self.answers = list(answers)
        self.bodies: list[list[dict]] = []

    def __call__(self, url: str, body: bytes, timeout_s: float) -> int:
        assert url == URL
        self.bodies.append(json.loads(body))
        answer = self.answers.pop(0) if self.answers else 200
        if isinstance(answer, Exception):
            raise answer
        return answer


class FakeSleep:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def make(post: FakePost, **kw) -> tuple[Alerter, list[str], FakeClock]:
    errors: list[str] = []
    clock = FakeClock()
    kw.setdefault("sleep", FakeSleep())
    alerter = Alerter(URL, post=post, on_error=errors.append, clock=clock, wall=lambda: T0 + 60, **kw)
    return alerter, errors, clock


def down(worker: str = "w1") -> Alert:
    return worker_down(
        worker, replicas=["demo-onnx:2", "demo-mlp:1"], last_active=T0, reason="lease expired", now=T0 + 10
    )


def log_lines(caplog: pytest.LogCaptureFixture, event: str = "alert") -> list[tuple[int, dict]]:
    out = []
    for record in caplog.records:
        if record.name == "mcp_health.alerts":
            line = json.loads(record.getMessage())
            if line["event"] == event:
                out.append((record.levelno, line))
    return out


def test_rfc3339_is_utc_with_z() -> None:
    assert rfc3339(T0) == "2023-11-14T22:13:20.000Z"
    assert rfc3339(T0 + 0.25) == "2023-11-14T22:13:20.250Z"


async def test_payload_is_alertmanager_v2_postable_alerts() -> None:
    post = FakePost()
    alerter, _, _ = make(post, generator_url="http://health:9103/")
    await alerter.fire(down())
    await alerter.flush()
    assert post.bodies == [
        [
            {
                "labels": {"alertname": "WorkerDown", "severity": "critical", "worker": "w1"},
                "annotations": {
                    "summary": "Worker w1 is down: lease expired",
                    "description": (
                        "Worker w1 was last active at 2023-11-14T22:13:20.000Z (unix 1700000000.000)."
                        " Its replicas (demo-mlp:1,demo-onnx:2) go to ERROR"
                        " and are recovered on other workers."
                    ),
                    "replicas": "demo-mlp:1,demo-onnx:2",
                    "last_active": "2023-11-14T22:13:20.000Z",
                    "last_active_unix": "1700000000.000",
                },
                "startsAt": "2023-11-14T22:13:30.000Z",
                "generatorURL": "http://health:9103/",
            }
        ]
    ]
    await alerter.resolve(down())
    await alerter.flush()
    resolved = post.bodies[1][0]
    assert resolved["startsAt"] == "2023-11-14T22:13:30.000Z"
    assert resolved["endsAt"] == "2023-11-14T22:14:20.000Z"  # wall() at resolve
    assert resolved["labels"] == post.bodies[0][0]["labels"]
    await alerter.close()


async def test_starts_at_defaults_to_first_fire_and_generator_url_is_optional() -> None:
    post = FakePost()
    alerter, _, clock = make(post, dedupe_s=10)
    alert = Alert("BreakerOpen", "warning", {"model": "m"}, {"summary": "s"})
    await alerter.fire(alert)
    clock.now += 11
    await alerter.fire(alert)  # re-sent after the dedupe interval: same startsAt
    await alerter.flush()
    first, second = (a for body in post.bodies for a in body)
    assert set(first) == {"labels", "annotations", "startsAt"}
    assert first["startsAt"] == second["startsAt"] == rfc3339(T0 + 60)
    await alerter.close()


async def test_every_alert_is_one_structured_log_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mcp_health.alerts")
    alerter = Alerter()  # no webhook: the log line is all there is
    await alerter.fire(down())
    await alerter.resolve(down())
    (fired_level, fired), (resolved_level, resolved) = log_lines(caplog)
    assert fired_level == logging.WARNING
    assert resolved_level == logging.INFO
    assert fired["status"] == "firing"
    assert resolved["status"] == "resolved"
    assert fired["alertname"] == "WorkerDown"
    assert fired["labels"] == {"worker": "w1"}
    assert fired["annotations"]["last_active"] == "2023-11-14T22:13:20.000Z"
    assert fired["annotations"]["last_active_unix"] == "1700000000.000"
    assert fired["annotations"]["replicas"] == "demo-mlp:1,demo-onnx:2"
    assert fired["startsAt"] == "2023-11-14T22:13:30.000Z"
    assert fired["endsAt"] is None
    assert resolved["endsAt"] is not None
    assert fired["webhook"] is False
    record = next(r for r in caplog.records if r.name == "mcp_health.alerts")
    assert record.alert["alertname"] == "WorkerDown"  # the same fields for structured handlers
    await alerter.close()


async def test_dedupe_sends_once_per_interval_but_logs_every_time(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mcp_health.alerts")
    post = FakePost()
    alerter, _, clock = make(post, dedupe_s=30)
    await alerter.fire(down("w1"))
    await alerter.fire(down("w1"))  # same name and labels: not sent
    await alerter.fire(down("w2"))  # other labels: sent
    clock.now += 29
    await alerter.fire(down("w1"))  # still inside the interval
    clock.now += 2
    await alerter.fire(down("w1"))  # past it: sent again
    await alerter.flush()
    sent = [a["labels"]["worker"] for body in post.bodies for a in body]
    assert sent == ["w1", "w2", "w1"]
    assert [line["deduped"] for _, line in log_lines(caplog)] == [False, True, False, True, False]
    await alerter.close()


async def test_resolve_is_always_sent_and_frees_the_dedupe_slot() -> None:
    post = FakePost()
    alerter, _, _ = make(post, dedupe_s=300)
    await alerter.fire(down())
    await alerter.resolve(down())
    await alerter.fire(down())  # fires again at once: a new incident
    await alerter.flush()
    sent = [("endsAt" in a) for body in post.bodies for a in body]
    assert sent == [False, True, False]
    await alerter.close()


async def test_server_errors_are_retried_with_backoff() -> None:
    post = FakePost(503, ConnectionRefusedError("refused"), 200)
    sleep = FakeSleep()
    alerter, errors, _ = make(post, attempts=3, backoff_s=0.1, sleep=sleep)
    await alerter.fire(down())
    await alerter.flush()
    assert len(post.bodies) == 3
    assert post.bodies[0] == post.bodies[2]
    assert sleep.calls == [0.1, 0.2]
    assert (alerter.sent, alerter.failed, errors) == (1, 0, [])
    await alerter.close()


async def test_rejected_payload_is_not_retried(caplog: pytest.LogCaptureFixture) -> None:
    post = FakePost(400)
    alerter, errors, _ = make(post, attempts=3)
    await alerter.fire(down())
    await alerter.flush()
    assert len(post.bodies) == 1
    assert (alerter.sent, alerter.failed, errors) == (0, 1, ["alert_webhook"])
    ((level, line),) = log_lines(caplog, "alert_webhook_failed")
    assert level == logging.ERROR
    assert line["error"] == "HTTP 400"
    assert line["alerts"] == ["WorkerDown"]
    await alerter.close()


async def test_exhausted_attempts_are_counted_and_never_raise() -> None:
    post = FakePost(*([TimeoutError("timed out")] * 3))
    alerter, errors, _ = make(post, attempts=3)
    await alerter.fire(down())  # must not raise
    await alerter.flush()
    assert (alerter.sent, alerter.failed, errors) == (0, 1, ["alert_webhook"])
    await alerter.fire(breaker_open("m", level=1, action="reduce_batch_size", error_rate=0.4))
    await alerter.flush()
    assert alerter.sent == 1  # the sender went on


async def test_a_failing_on_error_callback_does_not_stop_deliveries() -> None:
    def on_error(kind: str) -> None:
        raise RuntimeError("metrics broke")

    post = FakePost(500)
    alerter = Alerter(URL, post=post, attempts=1, on_error=on_error)
    await alerter.fire(down("w1"))
    await alerter.flush()
    await alerter.fire(down("w2"))
    await alerter.flush()
    assert (alerter.failed, alerter.sent) == (1, 1)
    await alerter.close()


async def test_queue_is_bounded_and_drops_the_oldest(caplog: pytest.LogCaptureFixture) -> None:
    started, gate = threading.Event(), threading.Event()
    bodies: list[list[str]] = []

    def post(url: str, body: bytes, timeout_s: float) -> int:
        bodies.append([a["labels"]["worker"] for a in json.loads(body)])
        started.set()
        gate.wait(10)
        return 200

    errors: list[str] = []
    alerter = Alerter(URL, post=post, max_queue=3, max_batch=10, on_error=errors.append)
    await alerter.fire(down("w0"))
    assert await asyncio.to_thread(started.wait, 10)  # w0 is in flight; the webhook hangs
    for i in range(1, 6):
        await alerter.fire(down(f"w{i}"))
    gate.set()
    await alerter.flush()
    assert bodies == [["w0"], ["w3", "w4", "w5"]]  # queued alerts go out as one array
    assert alerter.dropped == 2
    assert errors == ["alert_queue_full", "alert_queue_full"]
    assert [line["alertname"] for _, line in log_lines(caplog, "alert_dropped")] == ["WorkerDown"] * 2
    await alerter.close()


def test_alert_is_immutable_and_validated() -> None:
    labels = {"worker": "w1"}
    alert = Alert("WorkerDown", "critical", labels)
    labels["worker"] = "changed"
    assert alert.labels == {"worker": "w1"}
    with pytest.raises(TypeError):
        alert.labels["worker"] = "x"  # type: ignore[index]
    assert hash(alert) == hash(Alert("WorkerDown", "critical", {"worker": "w1"}, {"summary": "other"}))
    with pytest.raises(ValueError, match="alertname"):
        Alert("WorkerDown", "critical", {"alertname": "x"})
    with pytest.raises(ValueError, match="strings"):
        Alert("WorkerDown", "critical", {"replicas": 3})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="required"):
        Alert("", "critical")


def test_builders_carry_the_worker_and_model_labels() -> None:
    sick = worker_sick("w2", replicas=["m:1"], last_active=T0, errors=25, now=T0)
    assert sick.name == "WorkerSick"
    assert sick.labels == {"worker": "w2"}
    assert sick.annotations["last_active_unix"] == "1700000000.000"
    assert "25 failed requests" in sick.annotations["summary"]
    breaker = breaker_open("demo-mlp", level=2, action="disable_secondary_features", error_rate=0.65)
    assert breaker.labels == {"model": "demo-mlp"}
    assert breaker.annotations["level"] == "2"
    assert down().annotations["replicas"] == "demo-mlp:1,demo-onnx:2"
