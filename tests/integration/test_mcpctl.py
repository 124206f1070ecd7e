"""``mcpctl`` through its real entry points (``mcpctl.main`` in this process, and the installed
``.venv/bin/mcpctl`` as a subprocess) against a real etcd, worker, scheduler, router and health service.

Each claim is checked against the processes: a load is RUNNING when a request through the router is
answered with the model's outputs, a route names the worker process's own ZeroMQ endpoint, a dump shows the
router process's own table. Every failure is one line on stderr with its documented exit code, and never a
traceback. The tests share one cluster; each also runs on its own (``models`` loads what it needs).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import pty
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from harness import (
    etcd_get,
    etcd_put,
    full_mesh,
    mlp_reference,
    wait_for,
)

from mcpclient.cluster_cmds import status_table
from mcpclient.mcpctl import main
from mcpcore import wire
from mcpcore.keys import Keyspace

MCPCTL = Path(sys.executable).parent / "mcpctl"  # the console script pyproject.toml installs


@pytest.fixture(scope="module")
def mesh(
    tmp_path_factory: pytest.TempPathFactory, etcd_endpoint: str, repo: Path
) -> Iterator[dict[str, Any]]:
    """One worker, a scheduler, a router and a health service on their own prefix; nothing loaded. The
    worker's lease outlives a short SIGSTOP (the load timeout test)."""
    with full_mesh(tmp_path_factory.mktemp("mcpctl"), etcd_endpoint, repo, lease_ttl_s=30) as m:
        args = [
            *("--scheduler", m.scheduler.endpoints["grpc"], "--router", m.router.endpoints["grpc"]),
            *("--health", m.health.endpoints["grpc"], "--etcd", etcd_endpoint),
        ]
        yield {"prefix": m.prefix, "worker": m.worker, "scheduler": m.scheduler, "router": m.router,
               "health": m.health, "args": args}  # fmt: skip


def ctl(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``mcpctl ARGS`` in this process, through ``main``: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def ctl_json(capsys: pytest.CaptureFixture[str], mesh: dict[str, Any], *args: str) -> Any:
    """``mcpctl <the mesh's addresses> -o json ARGS``, which must succeed: its one JSON document."""
    code, out, err = ctl(capsys, *mesh["args"], "-o", "json", *args)
    assert code == 0, err
    return json.loads(out)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed console script as a subprocess."""
    return subprocess.run([str(MCPCTL), *args], capture_output=True, text=True, timeout=60, check=False)


class Terminal:
    """The console script on a terminal (a pty), as an operator runs it: stderr, and stdout too with
    ``stdout=True``, go to the terminal, whose output is collected as it comes (so the command never blocks
    writing to it)."""

    def __init__(self, *args: str, stdout: bool = False) -> None:
        self._master, slave = pty.openpty()
        self._shown: list[bytes] = []
        self._reader = threading.Thread(target=self._read)
        self._reader.start()
        env = {**os.environ, "TERM": "xterm", "COLUMNS": "160"}
        self.proc = subprocess.Popen([str(MCPCTL), *args], stdout=slave if stdout else subprocess.PIPE,
                                     stderr=slave, text=True, env=env)  # fmt: skip
        os.close(slave)  # the command holds it now: EIO here once it has exited

    def _read(self) -> None:
        with contextlib.suppress(OSError):
            while data := os.read(self._master, 65536):
                self._shown.append(data)

    def shown(self) -> str:
        return b"".join(self._shown).decode(errors="replace")

    def finish(self) -> tuple[int, str]:
        """Wait for the command: (exit code, its stdout when that was not the terminal)."""
        out, _ = self.proc.communicate(timeout=60)
        self._reader.join(30)
        os.close(self._master)
        return self.proc.returncode, out or ""


def frames(shown: str) -> list[str]:
    """A live display's frames, escape codes removed: each redraw erases the lines of the last one."""
    return [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", f) for f in shown.split("\x1b[2K")]


def one_line_error(stderr: str, command: str) -> str:
    """The error line, after checking that it is the only line, names the command and is no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"mcpctl {command}: " if command else "mcpctl: "), stderr
    return lines[0]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- no cluster needed -------------------------------------------------------------------------------------
def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    version = run("--version")  # the console script
    assert version.returncode == 0
    assert version.stdout.strip() == f"mcpctl {importlib.metadata.version('mcpmesh')}"
    code, top, _ = ctl(capsys, "-h")
    assert code == 0
    commands = "status list load unload pause resume traffic breaker drain undrain route infer dump profile"
    for command in (*commands.split(), "encrypt-model", "keygen"):
        assert f"  {command} " in top, command
    assert "Exit codes:" in top and "3  a service could not be reached" in top
    for sub in (["breaker", "set"], ["breaker", "get"], ["infer"], ["status"], ["encrypt-model"]):
        for flag in ("-h", "--help"):
            code, text, _ = ctl(capsys, *sub, flag)
            assert code == 0 and text.startswith(f"Usage: mcpctl {' '.join(sub)} "), sub
    bare = run()
    assert bare.returncode == 2 and bare.stderr.startswith("Usage: mcpctl [OPTIONS] COMMAND")  # the help


@pytest.mark.parametrize(
    ("args", "command", "message"),
    [
        (["infer", "m", "--shape", "1,x"], "infer", "'1,x' is not a shape"),
        (["infer", "m", "--shape", "0,4"], "infer", "'0,4' is not a shape"),
        (["infer", "m", "--input", "INPUT0=/no/such.npy"], "infer", "INPUT0=/no/such.npy: no such file"),
        (["infer", "m", "--input", "INPUT0=[[1, 2], [3]]"], "infer", "not a FP32 tensor"),
        (["infer", "m", "--input", "INPUT0=[[1, 2"], "infer", "not valid JSON"),
        (["infer", "m", "--input", "INPUT0"], "infer", "expected NAME=FILE.npy or NAME=JSON"),
        (["infer", "m", "--input", "A=[1]", "--shape", "1,4"], "infer", "not both"),
        (["infer", "m", "--input", "A=[1]", "--dtype", "FP99"], "infer", "'FP99' is not one of"),
        (["breaker", "demo-mlp"], "breaker set", "LEVEL is missing"),
        (["breaker", "set", "demo-mlp", "7"], "breaker set", "7 is not in the range 0<=x<=3"),
        (["traffic", "m", "1", "--percent", "10"], "traffic", "--canary V and --percent P go together"),
        (["load", "m", "--replicas", "x"], "load", "'x' is not a valid integer"),
        (["status", "--watch", "0"], "status", "0.0 is not in the range x>=0.1"),
        (["encrypt-model", "--repo", "x"], "encrypt-model", "missing option '--model'"),
        (["no-such-command"], "", "no such command 'no-such-command'"),
    ],
)
def test_bad_usage_and_bad_input_exit_2_with_one_line(args: list[str], command: str, message: str) -> None:
    nowhere = f"127.0.0.1:{closed_port()}"  # nothing is sent, so nothing need answer
    r = run("--scheduler", nowhere, "--router", nowhere, *args)
    assert r.returncode == 2 and not r.stdout, (r.stdout, r.stderr)
    assert message in one_line_error(r.stderr, command)


def test_a_bad_npy_file_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = {"x.npy": b"not an array", "c.npy": np.array([1 + 2j]), "s.npy": np.array([b"ab", b"cd"])}
    for name, content in cases.items():
        if isinstance(content, bytes):
            (tmp_path / name).write_bytes(content)
        else:
            np.save(tmp_path / name, content)
    for name, message in (
        ("x.npy", "not a readable .npy file"),
        ("c.npy", "has no tensor type"),
        ("s.npy", "BYTES (string) tensors do not travel over mcpapi.v2"),
    ):
        code, out, err = ctl(capsys, "infer", "demo-mlp", "--input", f"INPUT0={tmp_path / name}")
        assert code == 2 and not out and message in one_line_error(err, "infer"), err


def test_a_service_that_cannot_be_reached_is_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    nowhere = f"127.0.0.1:{closed_port()}"
    for args, command in (
        (["--scheduler", nowhere, "status"], "status"),
        (["list", "--scheduler", nowhere], "list"),  # a command's own option works as well
        (["--router", nowhere, "route", "demo-mlp"], "route"),
        (["--router", nowhere, "infer", "demo-mlp"], "infer"),
        (["--scheduler", nowhere, "load", "demo-mlp"], "load"),
        (["--etcd", nowhere, "dump"], "dump"),
    ):
        code, out, err = ctl(capsys, *args)
        assert code == 3 and not out, (args, err)
        assert nowhere in one_line_error(err, command)


def test_profile_a_real_process_and_its_error_paths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    busy = subprocess.Popen(
        [sys.executable, "-c", "print('ready', flush=True)\nwhile True: sum(range(1000))"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert busy.stdout.readline().strip() == "ready"
        (tmp_path / "busy.pid").write_text(str(busy.pid))  # as `python -m mcp_devcluster up` writes them
        svg = tmp_path / "busy.svg"
        r = run(
            "-o",
            "json",
            "profile",
            "busy",
            "--run-dir",
            str(tmp_path),
            "--duration",
            "1",
            "--output",
            str(svg),
        )
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {
            "service": "busy",
            "pid": busy.pid,
            "duration_s": 1,
            "output": str(svg),
        }
        assert "<svg" in svg.read_text()
        code, _, err = ctl(capsys, "profile", "--pid", str(busy.pid), "--py-spy", str(tmp_path / "no-py-spy"))
        assert code == 1 and "py-spy not found" in one_line_error(err, "profile")
    finally:
        busy.kill()
        busy.wait(10)
    code, _, err = ctl(capsys, "profile", "busy", "--run-dir", str(tmp_path))
    assert code == 1 and "no such process" in one_line_error(err, "profile")
    code, _, err = ctl(capsys, "profile", "router", "--run-dir", str(tmp_path))
    assert code == 2 and "no pid file" in one_line_error(err, "profile") and "pid files there: busy" in err


# --- against the cluster -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def models(mesh: dict[str, Any]) -> None:
    """demo-mlp (versions 1 and 2, fallback 1) and demo-slow, loaded with mcpctl (idempotent: a load of what
    is RUNNING returns at once), so that each test below also runs on its own."""
    for args in (["demo-mlp", "--version", "1", "--version", "2", "--fallback", "1"], ["demo-slow"]):
        assert main([*mesh["args"], "-o", "json", "load", *args]) == 0
    for model, version in (("demo-mlp", "1"), ("demo-mlp", "2"), ("demo-slow", "1")):  # the router follows
        routed = [*mesh["args"], "route", model, "--version", version]
        wait_for(lambda args=routed: main(args) == 0, what=f"{model}/{version} routed")


def test_load_shows_its_progress_until_running(
    mesh: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    worker = mesh["worker"].worker_id
    terminal = Terminal(*mesh["args"], "load", "demo-onnx", "--version", "1", "--version", "2")
    code, out = terminal.finish()
    shown = frames(terminal.shown())
    assert code == 0, shown
    assert out.splitlines()[-1] == "demo-onnx: 2/2 replica(s) RUNNING"  # stdout: the outcome
    assert ["demo-onnx", "1", worker, "RUNNING"] in [line.split()[:4] for line in out.splitlines()]
    for version in ("1", "2"):  # the terminal: the progress, from nothing RUNNING to all of it
        assert re.search(f"demo-onnx/{version} .* 0/1", shown[0]), shown
        assert re.search(f"demo-onnx/{version} .* 1/1", shown[-1]), shown
    doc = ctl_json(capsys, mesh, "load", "demo-onnx", "--version", "2")  # -o json: the final status only
    assert (doc["model"], doc["state"], doc["versions"], doc["replicas_running"]) == (
        "demo-onnx",
        "RUNNING",
        ["1", "2"],
        2,
    )
    assert sorted((r["version"], r["worker"], r["state"]) for r in doc["replicas"]) == [
        ("1", worker, "RUNNING"), ("2", worker, "RUNNING"),
    ]  # fmt: skip
    assert ctl_json(capsys, mesh, "unload", "demo-onnx")["model"] == "demo-onnx"


@pytest.mark.usefixtures("models")
def test_status_and_list_show_the_models_and_the_workers(
    mesh: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    worker = mesh["worker"].worker_id
    listed = {m["model"]: m for m in ctl_json(capsys, mesh, "list")["models"]}
    assert (listed["demo-mlp"]["replicas_running"], listed["demo-slow"]["replicas_running"]) == (2, 1)
    status = wait_for(lambda: (s := ctl_json(capsys, mesh, "status"))["workers"] and s, what="workers listed")
    mlp = next(m for m in status["models"] if m["model"] == "demo-mlp")
    assert sorted((r["version"], r["worker"], r["state"]) for r in mlp["replicas"]) == [
        ("1", worker, "RUNNING"), ("2", worker, "RUNNING"),
    ]  # fmt: skip
    assert (mlp["traffic"]["stable"], mlp["fallback_version"], mlp["breaker"]["level"]) == ("2", "1", 0)
    assert [(w["worker"], w["alive"], w["drained"]) for w in status["workers"]] == [(worker, True, "")]

    code, table, err = ctl(capsys, *mesh["args"], "status")
    assert code == 0, err
    rows = [line.split() for line in table.splitlines()]
    assert rows[0] == ["MODEL", "VERSION", "WORKER", "STATE", "BREAKER", "TRAFFIC", "NOTE"]
    assert ["demo-mlp", "1", worker, "RUNNING", "0", "2"] in rows
    assert ["demo-mlp", "2", worker, "RUNNING"] in rows
    assert ["WORKER", "ALIVE", "HEARTBEAT", "AGE", "REPLICAS", "QUEUE", "NOTE"] in rows
    assert [worker, "true"] in [r[:2] for r in rows]
    launcher = status_table(mesh["scheduler"].endpoints["grpc"], mesh["health"].endpoints["grpc"])
    mlp_rows = [line for line in table.splitlines() if line.startswith("demo-mlp ")]
    assert [line for line in launcher.splitlines() if line.startswith("demo-mlp ")] == mlp_rows
    assert [worker, "true"] in [line.split()[:2] for line in launcher.splitlines()]


@pytest.mark.usefixtures("models")
def test_route_names_the_worker_process(mesh: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    worker = mesh["worker"]
    route = ctl_json(capsys, mesh, "route", "demo-mlp", "--key", "user-1", "--version", "1")
    assert (route["worker"], route["endpoint"], route["version"]) == (
        worker.worker_id,
        worker.endpoints["zmq"],
        "1",
    )
    assert route["breaker_level"] == 0 and route["incarnation"]
    assert isinstance(route["zmq_features"], list) and route["curve_public_key"] == ""  # a plaintext socket
    local = wire.local_endpoint(worker.worker_id, route["incarnation"], route["endpoint"])
    assert "local" in route["zmq_features"] and route["local_endpoint"] == local
    code, table, _ = ctl(capsys, *mesh["args"], "route", "demo-mlp", "--version", "1")
    assert code == 0 and ["WORKER", worker.worker_id] in [line.split() for line in table.splitlines()]


@pytest.mark.usefixtures("models")
def test_infer_answers_with_the_models_outputs(
    mesh: dict[str, Any], capsys: pytest.CaptureFixture[str], repo: Path, tmp_path: Path
) -> None:
    worker = mesh["worker"].worker_id
    x = np.random.default_rng(0).random((1, 64), dtype=np.float32)  # what --shape 1,64 sends
    reply = ctl_json(capsys, mesh, "infer", "demo-mlp", "--version", "1", "--shape", "1,64")
    assert (reply["model"], reply["version"], reply["worker"]) == ("demo-mlp", "1", worker)
    out = {o["name"]: o for o in reply["outputs"]}["OUTPUT0"]
    assert (out["dtype"], out["shape"]) == ("FP32", [1, 16])
    np.testing.assert_allclose(out["data"], mlp_reference(repo, "demo-mlp", "1", x), rtol=1e-5, atol=1e-5)

    x = np.random.default_rng(5).random((2, 64), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    for source in (str(tmp_path / "x.npy"), json.dumps(x.tolist())):
        reply = ctl_json(capsys, mesh, "infer", "demo-mlp", "--version", "2", "--input", f"INPUT0={source}")
        out = {o["name"]: o for o in reply["outputs"]}["OUTPUT0"]
        np.testing.assert_allclose(out["data"], mlp_reference(repo, "demo-mlp", "2", x), rtol=1e-5, atol=1e-5)
    code, text, _ = ctl(capsys, *mesh["args"], "infer", "demo-mlp", "--version", "1")
    assert code == 0 and text.startswith(f"demo-mlp/1 on {worker}\n")  # no client id was given: none shown
    assert [line.split() for line in text.splitlines()][2][:4] == ["OUTPUT0", "FP32", "[1,", "16]"]


@pytest.mark.usefixtures("models")
def test_refusals_from_the_cluster_are_exit_1(
    mesh: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    for args, command, words in (
        (["infer", "no-such-model"], "infer", "no-such-model"),
        (["route", "no-such-model"], "route", "no-such-model"),
        (["unload", "no-such-model"], "unload", "no-such-model"),
        (["pause", "no-such-model"], "pause", "no-such-model"),
        (["traffic", "demo-mlp", "1", "--canary", "1", "--percent", "10"], "traffic", "canary"),
        (["undrain", mesh["worker"].worker_id], "undrain", "not drained"),
        (["infer", "demo-mlp", "--input", "WRONG=[[1.0]]"], "infer", "INPUT0"),
        (["infer", "demo-mlp", "--input", "INPUT0=[[1.0]]", "--dtype", "INT8"], "infer", "INT8"),
    ):
        code, out, err = ctl(capsys, *mesh["args"], *args)
        assert code == 1 and not out, (args, err)
        assert words in one_line_error(err, command), args


@pytest.mark.usefixtures("models")
def test_traffic_and_breaker(mesh: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    split = ctl_json(capsys, mesh, "traffic", "demo-mlp", "1", "--canary", "2", "--percent", "10")
    assert split["traffic"] == {"stable": "1", "canary": "2", "canary_percent": 10} and not split["pending"]
    assert ctl_json(capsys, mesh, "list")["models"][0]["traffic"]["canary_percent"] == 10

    code, out, err = ctl(capsys, *mesh["args"], "breaker", "demo-mlp", "3", "--for-seconds", "60")  # README's
    assert code == 0 and out.startswith("demo-mlp: breaker level 3, until "), err
    forced = ctl_json(capsys, mesh, "breaker", "get", "demo-mlp")
    assert (forced["level"], forced["reason"]) == (3, "forced with mcpctl") and forced["until_unix_ms"] > 0
    route = wait_for(lambda: (r := ctl_json(capsys, mesh, "route", "demo-mlp"))["breaker_level"] == 3 and r,
                     what="the router at level 3")  # fmt: skip
    assert route["version"] == "1"  # level 3 sends everything to the fallback version
    assert ctl_json(capsys, mesh, "breaker", "clear", "demo-mlp")["level"] == 0
    assert ctl_json(capsys, mesh, "breaker", "set", "demo-mlp", "1", "--reason", "drill")["reason"] == "drill"
    assert ctl_json(capsys, mesh, "breaker", "clear", "demo-mlp")["level"] == 0
    assert ctl_json(capsys, mesh, "traffic", "demo-mlp", "2")["traffic"]["canary"] == ""


@pytest.mark.usefixtures("models")
def test_pause_and_resume(mesh: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    paused = ctl_json(capsys, mesh, "pause", "demo-slow")
    assert [r["state"] for r in paused["replicas"]] == ["PAUSED"]
    code, _, err = ctl(capsys, *mesh["args"], "infer", "demo-slow")  # no RUNNING copy to take it
    assert code == 3 and "demo-slow" in one_line_error(err, "infer")
    resumed = ctl_json(capsys, mesh, "resume", "demo-slow", "--version", "1")
    assert [r["state"] for r in resumed["replicas"]] == ["RUNNING"]
    wait_for(lambda: ctl(capsys, *mesh["args"], "infer", "demo-slow")[0] == 0, what="demo-slow answers again")


@pytest.mark.usefixtures("models")
def test_status_watch_redraws_until_ctrl_c(mesh: dict[str, Any]) -> None:
    terminal = Terminal(*mesh["args"], "status", "--watch", "0.1", stdout=True)
    wait_for(lambda: terminal.shown().count("Ctrl-C to stop") >= 2, what="a second frame on the terminal")
    terminal.proc.send_signal(signal.SIGINT)
    code = terminal.finish()[0]
    assert code == 0, f"exit {code} after Ctrl-C; the terminal's last lines: {terminal.shown()[-3000:]!r}"
    last = frames(terminal.shown())[-1]
    assert (
        "every 0.1s, Ctrl-C to stop" in last and "demo-slow" in last and "Traceback" not in terminal.shown()
    )

    for output in ("json", "table"):  # a pipe: one frame after the other
        proc = subprocess.Popen([str(MCPCTL), *mesh["args"], "-o", output, "status", "--watch", "0.1"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        if output == "json":
            docs = [json.loads(proc.stdout.readline()) for _ in range(2)]  # one document per refresh
            assert all({"demo-mlp", "demo-slow"} <= {m["model"] for m in d["models"]} for d in docs)
            assert docs[1]["at"] > docs[0]["at"]
        else:
            lines: list[str] = []
            while sum(line.startswith("MODEL ") for line in lines) < 2:  # two frames, one after the other
                lines.append(proc.stdout.readline())
            assert any(line.startswith("demo-mlp ") for line in lines)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and not err, err


@pytest.mark.usefixtures("models")
def test_dump_shows_etcd_and_each_routers_own_table(
    mesh: dict[str, Any], etcd_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    router, worker, keys = mesh["router"], mesh["worker"], Keyspace(mesh["prefix"])
    wait_for(lambda: etcd_get(etcd_endpoint, keys.router(router.router_id)), what="the router's record")
    ghost = f"127.0.0.1:{closed_port()}"
    etcd_put(etcd_endpoint, keys.router("ghost"), {"router_id": "ghost", "grpc": ghost, "metrics": ghost})

    doc = ctl_json(capsys, mesh, "dump", "--prefix", mesh["prefix"])
    assert (doc["etcd"]["prefix"], doc["etcd"]["endpoints"]) == (mesh["prefix"], [etcd_endpoint])
    assert doc["etcd"]["keys"][keys.model_spec("demo-mlp")]["versions"] == ["1", "2"]  # JSON values decoded
    mine = doc["routers"][router.router_id]
    assert mine["record"]["metrics"] == router.endpoints["metrics"]
    snap = mine["snapshot"]
    assert (snap["router_id"], snap["pid"]) == (router.router_id, router.proc.pid)
    assert snap["revision"] > 0 and snap["features_off"] == []
    mlp = snap["models"]["demo-mlp"]
    assert mlp["versions"] == {
        "1": {"nodes": {worker.worker_id: 1.0}},
        "2": {"nodes": {worker.worker_id: 1.0}},
    }
    assert (mlp["fallback_version"], mlp["default_version"], mlp["breaker"]["level"]) == ("1", "2", 0)
    link = snap["workers"][worker.worker_id]
    assert (link["zmq"], link["link_ok"], link["in_flight"]) == (worker.endpoints["zmq"], True, 0)
    assert f"http://{ghost}/debug/snapshot: no snapshot" in doc["routers"]["ghost"]["error"]
    assert "mcp_requests_total" in router.metrics_text()  # every other path: the metrics, as before


@pytest.mark.usefixtures("models")
def test_load_that_is_not_running_in_time_is_exit_4(
    mesh: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """A stopped worker (SIGSTOP; its lease holds) cannot load: the load times out, and goes on after."""
    worker = mesh["worker"]
    os.kill(worker.proc.pid, signal.SIGSTOP)
    try:
        code, out, err = ctl(capsys, *mesh["args"], "load", "demo-stateful", "--timeout", "1")
    finally:
        os.kill(worker.proc.pid, signal.SIGCONT)
    assert code == 4 and not out
    line = one_line_error(err, "load")
    assert (
        "demo-stateful: 0/1 replica(s) RUNNING after 1s" in line
        and "the load goes on in the background" in line
    )
    assert ctl_json(capsys, mesh, "load", "demo-stateful")["replicas_running"] == 1
    assert ctl_json(capsys, mesh, "unload", "demo-stateful")["model"] == "demo-stateful"
