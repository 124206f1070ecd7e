"""``--processes N``: N router processes on one host behind the same gRPC and REST ports.

Invariants:
- The processes share nothing but etcd and the ports: the kernel spreads new connections over them
  (``SO_REUSEPORT``; grpc sets it on Linux, the REST server is told to). Each is a whole router with its
  own id (``<router_id>-<i>``), so its own stats lease and keys, its own ZeroMQ links and correlation
  prefix, and its own metrics port (``metrics_port + i``; each its own when ``metrics_port`` is 0).
- A port given as 0 is chosen here once, held (bound with ``SO_REUSEPORT``, never listening) until every
  process is ready, so all of them bind the same one.
- One ready line, once all are ready: the shared ``grpc`` and ``rest`` addresses, the first process's
  ``metrics``, and every process's id, pid and metrics address under ``processes``.
- A process that exits while the supervisor is not stopping is started again under the same index (and
  id), at most once a second; SIGTERM/SIGINT go to every process, and the supervisor exits once they
  have (their own graceful stop: notice period, drain), killing any that outlive the drain timeout.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from mcp_router.config import RouterConfig

__all__ = ["supervise"]

log = logging.getLogger(__name__)
_READY_TIMEOUT_S = 60.0
_RESTART_GAP_S = 1.0


@dataclass
class _Child:
    index: int
    router_id: str
    args: list[str]
    proc: subprocess.Popen[str] | None = None
    started: float = 0.0
    ready: dict[str, Any] = field(default_factory=dict)

    def start(self, *, again: bool = False) -> None:
        """Start it; a restart's ready line is not read (nothing waits for it)."""
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            self.args, stdout=subprocess.DEVNULL if again else subprocess.PIPE, text=True
        )


def _reserve(host: str, port: int) -> tuple[int, socket.socket | None]:
    """``port``, or (0) a free one held bound with SO_REUSEPORT so that nothing else takes it."""
    if port != 0:
        return port, None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, 0))
    return sock.getsockname()[1], sock


def supervise(config: RouterConfig, argv: list[str]) -> int:
    """Run ``config.processes`` routers (``argv``: the flags this process got, which each one gets too)."""
    n = config.processes
    held: list[socket.socket] = []
    grpc_port, sock = _reserve(config.grpc_host, config.grpc_port)
    held += [sock] if sock else []
    rest_port = config.rest_port
    if rest_port >= 0:
        rest_port, sock = _reserve(config.rest_host, rest_port)
        held += [sock] if sock else []
    children = []
    for i in range(n):
        router_id = f"{config.router_id}-{i}"
        metrics_port = config.metrics_port + i if config.metrics_port else 0
        args = [
            sys.executable, "-m", "mcp_router", *argv, "--processes", "1", "--reuse-port",
            "--router-id", router_id, "--grpc-port", str(grpc_port), "--rest-port", str(rest_port),
            "--metrics-port", str(metrics_port),
        ]  # fmt: skip
        children.append(_Child(i, router_id, args))
    stopping: list[int] = []

    def kill_rest(_signum: int, _frame: Any) -> None:
        for child in children:
            if child.proc is not None and child.proc.returncode is None:
                log.error("router process %s outlived its drain; killing it", child.router_id)
                with contextlib.suppress(ProcessLookupError):
                    child.proc.kill()

    def stop(signum: int, _frame: Any) -> None:
        if not stopping:  # their own graceful stop, then whatever outlives it is killed
            signal.signal(signal.SIGALRM, kill_rest)
            signal.alarm(int(config.shutdown_delay_s + config.drain_timeout_s) + 5)
        stopping.append(signum)
        for child in children:
            if child.proc is not None and child.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        for child in children:
            child.start()
        if not _await_ready(children, stopping):
            stop(signal.SIGTERM, None)
            _reap(children, stopping, config)
            return 1
    finally:
        for sock in held:  # every process has bound the ports (or is gone): nothing needs the hold
            sock.close()
    first = children[0].ready
    ready = {
        "event": "ready", "router_id": config.router_id, "grpc": f"{config.grpc_host}:{grpc_port}",
        "metrics": first.get("metrics", ""),
        "processes": [  # as started (a process started again keeps its id and metrics port)
            {"router_id": c.router_id, "pid": c.ready.get("pid", 0), "metrics": c.ready.get("metrics", "")}
            for c in children
        ],
    }  # fmt: skip
    if rest_port >= 0:
        ready["rest"] = f"{config.rest_host}:{rest_port}"
    print(json.dumps(ready), flush=True)
    log.info("serving with %d router processes on gRPC port %d", n, grpc_port)
    return _reap(children, stopping, config)


def _reap(children: list[_Child], stopping: list[int], config: RouterConfig) -> int:
    """Wait for the processes (blocking on the kernel: a signal's handler runs meanwhile); start again
    one that exits while not stopping. Returns once none is left: 0, or 1 if one failed its stop."""
    by_pid = {c.proc.pid: c for c in children if c.proc is not None}
    failed = False
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:  # none left
            return 1 if failed else 0
        child = by_pid.pop(pid, None)
        if child is None or child.proc is None:
            continue
        child.proc.returncode = code = os.waitstatus_to_exitcode(status)
        if stopping:
            failed = failed or code not in (0, -signal.SIGTERM)
            continue
        log.error("router process %s exited (%s); starting it again", child.router_id, code)
        gap = child.started + _RESTART_GAP_S - time.monotonic()
        if gap > 0:
            time.sleep(gap)  # a process that dies at once is started at most once a second
        if stopping:
            continue
        if child.proc.stdout is not None:
            child.proc.stdout.close()
        child.start(again=True)
        by_pid[child.proc.pid] = child


def _await_ready(children: list[_Child], stopping: list[int]) -> bool:
    """Read every process's ready line; False if one exits first, a signal comes, or time runs out."""
    sel = selectors.DefaultSelector()
    waiting = {}
    for child in children:
        assert child.proc is not None and child.proc.stdout is not None
        sel.register(child.proc.stdout, selectors.EVENT_READ, child)
        waiting[child.index] = child
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while waiting and not stopping:
        left = deadline - time.monotonic()
        if left <= 0:
            log.error("router processes %s not ready in %.0f s", sorted(waiting), _READY_TIMEOUT_S)
            return False
        for key, _ in sel.select(min(left, 0.5)):
            child = key.data
            line = key.fileobj.readline()  # type: ignore[union-attr]
            if not line:
                log.error("router process %s exited before it was ready", child.router_id)
                return False
            child.ready = json.loads(line)
            sel.unregister(key.fileobj)
            del waiting[child.index]
    return not waiting
