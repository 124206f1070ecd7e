"""Service log lines (``mcpcore.logs``): the JSON formatter's fields, request fields bound in context (and
carried onto a worker's executor thread), the text format, the options that choose, and the lines a real
worker process writes to stderr in each format.

The real process is a worker whose etcd is unreachable: it serves anyway (and says so, at WARNING), so it
needs nothing else; its "ready" line on stdout is waited for, never a sleep.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mcp_worker.batching import BatchConfig, Dispatcher, ModelShare
from mcp_worker.config import WorkerConfig
from mcpcore import logs, runner

TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: .*")


def _record(msg: str = "hello %s", *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("mcp_test.here", logging.WARNING, __file__, 1, msg, args or ("world",), None)
    record.__dict__.update(extra)
    return record


def test_a_json_line_has_the_fields_and_the_bound_ones():
    formatter = logs.JsonFormatter({"service": "mcp-test", "worker": "w-1", "empty": ""})
    record = _record()
    fields, token = logs.bind(request_id="r-1", model="m", trace_id="", client_request_id="c-1")
    try:
        fields["worker"] = "w-2"  # learnt later in the request (the router's worker tried)
        doc = json.loads(formatter.format(record))
    finally:
        logs.reset(token)
    assert TS.fullmatch(doc["ts"])
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    assert doc["ts"] == f"{stamp}.{int(record.msecs):03d}Z"  # UTC, milliseconds
    assert doc["level"] == "WARNING" and doc["logger"] == "mcp_test.here" and doc["msg"] == "hello world"
    assert doc["service"] == "mcp-test" and doc["worker"] == "w-2"  # bound fields win over the process's
    assert doc["request_id"] == "r-1" and doc["model"] == "m" and doc["client_request_id"] == "c-1"
    assert "trace_id" not in doc and "empty" not in doc and "exc" not in doc  # empty fields are left out
    assert "request_id" not in json.loads(formatter.format(_record()))  # reset: outside the request again


def test_extra_fields_exceptions_and_newlines_stay_on_one_line():
    formatter = logs.JsonFormatter()
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "two\nlines", (), sys.exc_info())
    record.__dict__.update(batch_size=8, request_id="explicit", odd=object())
    _, token = logs.bind(request_id="bound")
    try:
        line = formatter.format(record)
    finally:
        logs.reset(token)
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["msg"] == "two\nlines" and doc["batch_size"] == 8
    assert doc["request_id"] == "explicit"  # a call's extra= wins over the bound fields
    assert doc["exc"].startswith("Traceback") and "ValueError: bad\nvalue" in doc["exc"]
    assert doc["odd"].startswith("<object object")  # not JSON: its str


def test_a_bind_replaces_what_was_bound_before():
    _, outer = logs.bind(request_id="a", trace_id="t")
    _, inner = logs.bind(request_id="b")
    assert dict(logs.bound()) == {"request_id": "b"}  # no trace id left over from another request
    logs.reset(inner)
    assert logs.bound()["trace_id"] == "t"
    logs.reset(outer)
    assert dict(logs.bound()) == {}


def test_setup_writes_text_or_json_and_refuses_what_it_does_not_know():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        text, as_json = io.StringIO(), io.StringIO()
        logs.setup("text", level="debug", stream=text)
        logging.getLogger("mcp_test").info("plain %d", 1)
        assert TEXT_LINE.fullmatch(text.getvalue().strip()) and text.getvalue().endswith(
            "mcp_test: plain 1\n"
        )
        logs.setup("json", static={"service": "s"}, stream=as_json)
        logging.getLogger("mcp_test").info("structured")
        assert json.loads(as_json.getvalue())["msg"] == "structured"
        with pytest.raises(ValueError, match="xml"):
            logs.setup("xml")
        with pytest.raises(ValueError):
            logs.setup("json", level="LOUD")
        assert root.handlers[0].stream is as_json  # a refused setup changed nothing
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_log_format_comes_from_the_flag_then_the_environment(monkeypatch):
    monkeypatch.delenv("MCP_LOG_FORMAT", raising=False)
    args = ["--worker-id", "w-x"]
    assert runner.parse_args("mcp-worker", WorkerConfig, "MCP_WORKER_", args)[1].log_format == "json"
    monkeypatch.setenv("MCP_LOG_FORMAT", "TEXT")
    assert runner.parse_args("mcp-worker", WorkerConfig, "MCP_WORKER_", args)[1].log_format == "text"
    flagged = runner.parse_args("mcp-worker", WorkerConfig, "MCP_WORKER_", [*args, "--log-format", "json"])
    assert flagged[1].log_format == "json"
    monkeypatch.setenv("MCP_LOG_FORMAT", "xml")
    assert runner.main("mcp-worker", WorkerConfig, "MCP_WORKER_", lambda c: None, args) == 2  # type: ignore[arg-type,return-value]


async def test_a_batch_logs_with_its_requests_on_the_executor_thread():
    """The worker admits requests without a task each: a batch binds its own fields, and its run on the
    executor thread sees them (a copy of its context)."""
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(logs.JsonFormatter({"worker": "w-9"}))
    backend = logging.getLogger("mcp_test.backend")
    backend.addHandler(handler)
    backend.setLevel(logging.INFO)

    def model(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        backend.info("running %d rows", len(inputs["INPUT0"]))
        return {"OUTPUT0": inputs["INPUT0"]}

    dispatcher = Dispatcher()
    try:
        queue = dispatcher.add_model("demo/1", BatchConfig(max_batch_size=8), model, ModelShare(1, 0.5))
        _, token = logs.bind(request_id="not-this", model="nor-this")  # the sender's, around the enqueue
        try:
            answer = asyncio.get_running_loop().create_future()
            queue.enqueue("req-7", {"INPUT0": np.zeros((2, 3), np.float32)}, answer.set_result)
            assert isinstance(await answer, dict)
        finally:
            logs.reset(token)
    finally:
        backend.removeHandler(handler)
        await dispatcher.close()
    doc = json.loads(handler.stream.getvalue())
    assert (doc["msg"], doc["model"], doc["request_id"], doc["worker"]) == (
        "running 2 rows",
        "demo",
        "req-7",
        "w-9",
    )


# --- a real worker process --------------------------------------------------------------------------------


def _worker_stderr(tmp_path: Path, *flags: str) -> tuple[str, list[str]]:
    """Start a worker (etcd unreachable), wait for its ready line, stop it; its id and stderr lines."""
    worker_id = f"w-logs-{os.getpid()}"
    err = tmp_path / "stderr.log"
    args = [
        sys.executable, "-m", "mcp_worker", "--worker-id", worker_id, "--etcd-endpoints", "127.0.0.1:1",
        "--etcd-timeout-s", "0.5", "--repository", str(tmp_path), "--checkpoint-dir", str(tmp_path / "ck"),
        *flags,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_", "OTEL_"))}
    with err.open("w") as stderr:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=tmp_path)
    try:
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        assert sel.select(30), f"not ready: {err.read_text()[-2000:]}"
        ready = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        assert ready["event"] == "ready" and ready["worker_id"] == worker_id  # stdout: the ready line alone
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    return worker_id, err.read_text().splitlines()


def test_a_worker_writes_json_lines_that_name_it(tmp_path):
    worker_id, lines = _worker_stderr(tmp_path)
    docs = [json.loads(line) for line in lines]  # every line is one JSON object
    assert docs and all(TS.fullmatch(d["ts"]) and d["service"] == "mcp-worker" for d in docs)
    assert all(d["worker"] == worker_id and {"level", "logger", "msg"} <= d.keys() for d in docs)
    assert any(d["level"] == "WARNING" and "etcd is not reachable" in d["msg"] for d in docs)


def test_log_format_text_writes_the_lines_for_people(tmp_path):
    _, lines = _worker_stderr(tmp_path, "--log-format", "text")
    assert lines and all(TEXT_LINE.fullmatch(line) for line in lines)
    assert any(" WARNING mcp_worker.server: etcd is not reachable" in line for line in lines)
