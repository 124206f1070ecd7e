"""A real single-member etcd as a child process, on free loopback ports with its own data dir.

Used by the test fixtures, ``make bench`` and the development cluster (``launcher``). Invariants: no
fixed sleeps (the server is polled for health with a bounded deadline); a server that does not come up
fails with the tail of its log; every server started here is killed at interpreter exit if its owner did
not stop it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import random
import shutil
import socket
import ssl
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path

__all__ = ["EtcdServer", "EtcdStartError", "free_ports"]


class EtcdStartError(RuntimeError):
    """etcd is missing or did not become healthy; the message has the tail of its log."""


_START_TIMEOUT_S = 20.0
_POLL_S = 0.02
_RUNNING: set[EtcdServer] = set()


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports below the kernel's ephemeral range.

    Not ``bind(0)``: that hands out ephemeral ports, and while a test has etcd stopped, a client
    reconnecting to it can be given that very port as its source port (a TCP self-connect), or any
    outgoing connection can take it, and etcd then cannot come back on it.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default; elsewhere this is only a best effort
    ports: list[int] = []
    with contextlib.ExitStack() as stack:  # hold them all until chosen, so that they differ
        for port in random.sample(range(max(1024, low - 20_000), low), 200):
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            ports.append(port)
            if len(ports) == count:
                return ports
    raise RuntimeError(f"no {count} free loopback ports below {low}")


class EtcdServer:
    """One single-member etcd in ``base_dir``, on its own client and peer ports (kept across restarts)."""

    def __init__(
        self,
        base_dir: Path,
        *,
        client_port: int | None = None,
        peer_port: int | None = None,
        detached: bool = False,
        auto_compaction: str = "10m",
        tls: tuple[Path, Path, Path] | None = None,
    ) -> None:
        """``detached``: the server outlives this process (its own session, no kill at exit), as ``make up``
        wants; otherwise it is killed at interpreter exit if its owner did not stop it.
        ``tls``: (CA, certificate, key): clients speak TLS to it (https://; see README "Securing").
        ``auto_compaction``: history kept (etcd's periodic auto-compaction; "0" keeps all): without it, one
        write per worker per second fills etcd's quota and etcd turns read-only."""
        binary = shutil.which("etcd")
        if binary is None:
            raise EtcdStartError("etcd is not installed: run `make setup` (it installs Debian's etcd)")
        self.binary = binary
        self.name = f"test-{uuid.uuid4().hex[:12]}"
        self.base_dir = base_dir
        self.data_dir = base_dir / "data"
        self.log_path = base_dir / "etcd.log"
        ports = free_ports(2) if client_port is None or peer_port is None else [client_port, peer_port]
        self.client_port, self.peer_port = ports
        self.detached = detached
        self.auto_compaction = auto_compaction
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.endpoint}"

    def _command(self) -> list[str]:
        client, peer = self.url, f"http://127.0.0.1:{self.peer_port}"
        tls = [] if self.tls is None else [f"--cert-file={self.tls[1]}", f"--key-file={self.tls[2]}"]
        return [
            self.binary,
            *tls,
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={self.name}={peer}",
            "--initial-cluster-state=new",
            "--auto-compaction-mode=periodic",
            f"--auto-compaction-retention={self.auto_compaction}",
            "--heartbeat-interval=10",
            "--election-timeout=100",
            "--logger=zap",
            "--log-level=error",
        ]

    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        self.base_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=self.detached,
                # No preexec_fn: it forces a plain fork(), and gRPC's fork handlers can then abort
                # the child before it execs etcd (seen: "epoll_wait error: Bad file descriptor").
            )
        if not self.detached:
            _RUNNING.add(self)
        self.wait_healthy()

    def wait_healthy(self, timeout_s: float = _START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        url = f"{self.url}/health"
        context = None if self.tls is None else ssl.create_default_context(cafile=str(self.tls[0]))
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                self._fail(f"etcd exited with status {code} while starting")
            try:
                with urllib.request.urlopen(url, timeout=0.5, context=context) as resp:  # noqa: S310
                    body = json.loads(resp.read())
                if body.get("health") == "true":
                    return
                last = f"health: {body}"
            except (OSError, ValueError) as exc:  # refused, reset, timeout, not JSON yet
                last = repr(exc)
            time.sleep(_POLL_S)  # poll interval, not synchronization
        self._fail(f"etcd at {self.endpoint} not healthy within {timeout_s:g} s ({last})")

    def _fail(self, why: str) -> None:
        tail = self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""
        self.kill()
        raise EtcdStartError(f"{why}\n--- {self.log_path} (tail) ---\n{tail}")

    def stop(self, timeout_s: float = 5.0) -> None:
        """Terminate (SIGTERM: a clean shutdown), and kill if it does not exit in time."""
        proc, self.proc = self.proc, None
        _RUNNING.discard(self)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        """SIGKILL: a crash, with no clean shutdown."""
        proc, self.proc = self.proc, None
        _RUNNING.discard(self)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def restart(self) -> None:
        """Stop, then start again on the same ports and data dir, and wait until healthy."""
        self.stop()
        self.start()

    def save_snapshot(self, path: Path) -> None:
        """``etcdctl snapshot save``: a consistent copy of the running server's data (a backup)."""
        self._etcdctl("snapshot", "save", str(path), f"--endpoints={self.endpoint}")

    def restore_snapshot(self, path: Path) -> None:
        """Stop, replace the data with ``path`` (``etcdctl snapshot restore``), start on the same ports.

        What an operator does to recover a lost or corrupted etcd from a backup: the store then holds the
        backup's keys at the backup's (lower) revision."""
        self.stop()
        peer = f"http://127.0.0.1:{self.peer_port}"
        restored = self.base_dir / "restored"
        shutil.rmtree(restored, ignore_errors=True)
        self._etcdctl(
            "snapshot", "restore", str(path), f"--name={self.name}", f"--data-dir={restored}",
            f"--initial-cluster={self.name}={peer}", f"--initial-advertise-peer-urls={peer}",
        )  # fmt: skip
        shutil.rmtree(self.data_dir, ignore_errors=True)
        restored.rename(self.data_dir)
        self.start()

    def enable_auth(self, passwords: Mapping[str, str], prefix: str) -> None:
        """Turn on etcd's users as an operator does: ``passwords`` (name -> password) must name ``root``
        (etcd wants it before ``auth enable``); every other user gets a role of its own name that may
        read and write the keys under ``prefix``. Needs ``tls``: a password never crosses in clear."""
        if self.tls is None or "root" not in passwords:
            raise ValueError("enable_auth needs a TLS server and a password for root")
        endpoint = [f"--endpoints={self.url}", f"--cacert={self.tls[0]}"]
        for user, password in passwords.items():  # on stdin: a command line is readable by every user
            self._etcdctl("user", "add", user, "--interactive=false", *endpoint, stdin=password + "\n")
            if user != "root":
                self._etcdctl("role", "add", user, *endpoint)
                grant = ("role", "grant-permission", user, "--prefix=true", "readwrite", prefix)
                self._etcdctl(*grant, *endpoint)
                self._etcdctl("user", "grant-role", user, user, *endpoint)
        self._etcdctl("auth", "enable", *endpoint)

    def _etcdctl(self, *args: str, stdin: str | None = None) -> None:
        binary = shutil.which("etcdctl")
        if binary is None:
            raise EtcdStartError("etcdctl is not installed: run `make setup` (Debian's etcd-client)")
        done = subprocess.run(
            [binary, *args],
            capture_output=True,
            text=True,
            env={"ETCDCTL_API": "3"},
            timeout=60,
            check=False,
            input=stdin,
        )
        if done.returncode != 0:
            raise EtcdStartError(f"etcdctl {' '.join(args[:2])} failed: {done.stderr.strip()[-2000:]}")


@atexit.register
def _stop_all() -> None:
    for server in list(_RUNNING):
        server.kill()
