"""``make down`` (``mcp_devcluster down``): services stop together while etcd answers, etcd last."""

from __future__ import annotations

import subprocess
import sys
import time

from mcp_devcluster import launcher

# Each fake service writes "<name> <event> <monotonic time>" lines to one log, so order is observable.
FAKE = r"""
import signal, sys, time
name, log, stubborn = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
def term(*_):
    with open(log, "a") as f:
        f.write(f"{name} term {time.monotonic()}\n")
    if not stubborn:
        sys.exit(0)
signal.signal(signal.SIGTERM, term)
with open(log, "a") as f:
    f.write(f"{name} ready {time.monotonic()}\n")
while True:
    time.sleep(0.01)
"""


def _spawn(tmp_path, name: str, *, stubborn: bool = False) -> subprocess.Popen[bytes]:
    log = tmp_path / "events.log"
    proc = subprocess.Popen([sys.executable, "-c", FAKE, name, str(log), "1" if stubborn else "0"])
    (tmp_path / f"{name}.pid").write_text(str(proc.pid))
    deadline = time.monotonic() + 10
    while f"{name} ready" not in (log.read_text() if log.exists() else ""):  # its readiness line
        assert time.monotonic() < deadline, f"{name} did not start"
        time.sleep(0.01)
    return proc


def test_down_stops_services_before_etcd_and_kills_only_the_stubborn(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(launcher, "RUN", tmp_path)
    monkeypatch.setattr(launcher, "DRAIN_WAIT_S", 1.0)
    procs = {name: _spawn(tmp_path, name) for name in ("etcd", "router", "worker-1")}
    procs["worker-2"] = _spawn(tmp_path, "worker-2", stubborn=True)
    assert launcher.down() == 0
    for proc in procs.values():
        proc.wait(timeout=10)
    events = [line.split() for line in (tmp_path / "events.log").read_text().splitlines()]
    terms = {name: float(t) for name, event, t in events if event == "term"}
    assert set(terms) == {"etcd", "router", "worker-1", "worker-2"}
    assert terms["etcd"] > max(terms[n] for n in ("router", "worker-1", "worker-2"))  # etcd last
    assert procs["worker-2"].returncode == -9  # ignored SIGTERM: killed after the wait
    assert procs["router"].returncode == 0 and procs["etcd"].returncode == 0
    assert not list(tmp_path.glob("*.pid"))
    out = capsys.readouterr()
    assert "killed after no clean stop in time: worker-2" in out.err
