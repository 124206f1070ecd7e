"""Hosts made of Linux network namespaces: a private bridge, one namespace per host, veth pairs.

``Network.create()`` makes a bridge ``mcpbr<run>`` in the root namespace with the first address of a free
``10.77.N.0/24``; ``add_host("h1")`` a namespace ``mcp-<run>-h1`` joined to it by a veth pair (``mcpv<run>h1``
on the bridge, ``eth0`` inside), with its own address and loopback up. ``<run>`` is five hex digits per
run, so parallel runs never share a name; the root namespace reaches every host through the bridge (the
test drives etcd, the schedulers and the workers' metrics from there).

Invariants:
- Nothing is made before the run's state file (``/run/mcpmesh-multihost/<run>.json``: owner pid and its
  start time) exists, and it is removed last, so ``sweep_stale`` can tell an aborted run (owner gone) from
  a live one; it removes only names of this scheme, only of runs whose owner is gone.
- ``destroy`` kills every process still inside the run's namespaces (by pid, from ``ip netns pids``),
  deletes the namespaces and the bridge, and ``leftovers`` says what of the run is still there.
- ``Host.cut`` drops every packet in and out of the host but its loopback (iptables in its namespace:
  already open connections stall, as in a real partition); ``heal`` removes those rules.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

STATE_DIR = Path("/run/mcpmesh-multihost")
SUBNETS = "10.77.0.0/16"  # one /24 of it per run
_NAME = re.compile(r"^(?:mcp-(?P<ns>[0-9a-f]{5})-\w+|mcpv(?P<veth>[0-9a-f]{5})\w+|mcpbr(?P<br>[0-9a-f]{5}))$")


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (the message says why)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def preflight() -> None:
    """Raise ``NetnsUnavailable`` with the reason when namespaces, veth pairs or iptables are missing."""
    if os.geteuid() != 0:
        raise NetnsUnavailable("needs root (network namespaces, veth pairs and iptables)")
    tools = (("ip", "iproute2"), ("unshare", "util-linux"), ("iptables", "iptables"), ("etcd", "etcd-server"))
    for tool, package in tools:
        if shutil.which(tool) is None:
            raise NetnsUnavailable(f"`{tool}` is not installed (Debian package {package})")
    done = subprocess.run(
        ["unshare", "--net", "true"], capture_output=True, text=True, timeout=30, check=False
    )
    if done.returncode != 0:
        raise NetnsUnavailable(f"cannot make a network namespace (unshare --net: {done.stderr.strip()})")
    try:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise NetnsUnavailable(f"cannot write {STATE_DIR}: {err}") from err
    # what the hosts need, tried on a probe namespace and veth pair (named outside the runs' scheme)
    probe = f"mcpq{os.getpid()}"  # an interface name has at most 15 characters
    try:
        for what, args in (
            ("ip netns add", ["netns", "add", probe]),
            (
                "a veth pair",
                ["link", "add", f"{probe}a", "type", "veth", "peer", "name", "eth0", "netns", probe],
            ),
            ("iptables in a namespace", ["netns", "exec", probe, "iptables", "-w", "-S", "INPUT"]),
        ):
            done = _ip(*args, check=False)
            if done.returncode != 0:
                raise NetnsUnavailable(f"{what} failed: {done.stderr.strip()[-300:]}")
    finally:
        _ip("link", "delete", f"{probe}a", check=False)
        _ip("netns", "delete", probe, check=False)


def _start_time(pid: int) -> str | None:
    """A process's start time (``/proc/<pid>/stat`` field 22): with the pid, who it is (pids are reused)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]


def _links() -> list[str]:
    out = _ip("-o", "link", "show").stdout
    return [line.split(":", 2)[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def _run_of(name: str) -> str | None:
    m = _NAME.match(name)
    return None if m is None else (m["ns"] or m["veth"] or m["br"])


def _kill_inside(netns: str) -> list[int]:
    """SIGKILL every process in a namespace of ours; the pids that were there."""
    pids = [int(p) for p in _ip("netns", "pids", netns, check=False).stdout.split()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)  # poll interval: until the kernel has reaped them (zombies are their parents')
    return pids


def running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    return _state(pid) != "Z"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def _remove_run(run: str) -> None:
    for ns in [n for n in _namespaces() if _run_of(n) == run]:
        _kill_inside(ns)
        _ip("netns", "delete", ns, check=False)
    for link in [n for n in _links() if _run_of(n) == run]:
        _ip("link", "delete", link, check=False)


def sweep_stale() -> list[str]:
    """Remove what aborted runs of this test left (their owner process is gone); the run ids removed."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    live: set[str] = set()
    swept: list[str] = []
    for state in STATE_DIR.glob("*.json"):
        try:
            doc = json.loads(state.read_text())
        except (OSError, ValueError):
            doc = {}
        run = state.stem
        if doc and _start_time(int(doc["pid"])) == doc["start_time"]:
            live.add(run)
            continue
        _remove_run(run)
        state.unlink(missing_ok=True)
        swept.append(run)
    # names of this scheme with no state file: a run whose file went first (made after it, removed before)
    for name in [*_namespaces(), *_links()]:
        run = _run_of(name)
        if run is not None and run not in live and not (STATE_DIR / f"{run}.json").exists():
            _remove_run(run)
            swept.append(run)
    return sorted(set(swept))


@dataclass
class Host:
    name: str
    netns: str
    ip: str
    veth: str
    cut_off: bool = False

    def cmd(self, *args: str) -> list[str]:
        """``args`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *args]

    def run(self, *args: str) -> str:
        done = subprocess.run(self.cmd(*args), capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{self.name}: {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def cut(self, port: int | None = None) -> None:
        """Drop every packet in and out of this host (both directions), loopback excepted; with ``port``,
        only TCP to and from that port (etcd's peer port: a member cut off from its peers, not clients)."""
        if port is None:
            rules = [["-j", "DROP"]]
        else:
            rules = [["-p", "tcp", side, str(port), "-j", "DROP"] for side in ("--dport", "--sport")]
        for chain, iface in (("INPUT", "-i"), ("OUTPUT", "-o")):
            self.run("iptables", "-w", "-A", chain, iface, "lo", "-j", "ACCEPT")
            for rule in rules:
                self.run("iptables", "-w", "-A", chain, *rule)
        self.cut_off = port is None

    def heal(self) -> None:
        for chain in ("INPUT", "OUTPUT"):
            self.run("iptables", "-w", "-F", chain)
        self.cut_off = False


@dataclass
class Network:
    run: str
    subnet: ipaddress.IPv4Network
    bridge: str
    hosts: dict[str, Host] = field(default_factory=dict)

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    @classmethod
    def create(cls) -> Network:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        with (STATE_DIR / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one run at a time picks a subnet and makes its bridge
            run = secrets.token_hex(3)[:5]
            while (STATE_DIR / f"{run}.json").exists():
                run = secrets.token_hex(3)[:5]
            subnet = _free_subnet()
            state = {"pid": os.getpid(), "start_time": _start_time(os.getpid()), "subnet": str(subnet)}
            (STATE_DIR / f"{run}.json").write_text(json.dumps(state))
            net = cls(run, subnet, f"mcpbr{run}")
            try:
                _ip("link", "add", net.bridge, "type", "bridge")
                _ip("addr", "add", f"{net.gateway}/{subnet.prefixlen}", "dev", net.bridge)
                _ip("link", "set", net.bridge, "up")
            except BaseException:
                net.destroy()
                raise
        return net

    def add_host(self, name: str, index: int) -> Host:
        """Host ``name`` at the subnet's address ``index`` (10.77.N.<index>)."""
        host = Host(
            name, f"mcp-{self.run}-{name}", str(self.subnet.network_address + index), f"mcpv{self.run}{name}"
        )
        self.hosts[name] = host
        _ip("netns", "add", host.netns)
        _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        _ip("link", "set", host.veth, "master", self.bridge, "up")
        _ip("-n", host.netns, "addr", "add", f"{host.ip}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        _ip("-n", host.netns, "link", "set", "lo", "up")
        return host

    def destroy(self) -> None:
        """Kill what runs in the run's namespaces, delete them and the bridge, then the state file."""
        _remove_run(self.run)
        (STATE_DIR / f"{self.run}.json").unlink(missing_ok=True)

    def leftovers(self) -> list[str]:
        """Namespaces, links, processes and the state file of this run still there (none after destroy)."""
        left = [n for n in [*_namespaces(), *_links()] if _run_of(n) == self.run]
        left += [f"pid {p}" for p in _pids_in_netns_of(self)]
        if (STATE_DIR / f"{self.run}.json").exists():
            left.append(str(STATE_DIR / f"{self.run}.json"))
        return left


def _pids_in_netns_of(net: Network) -> list[int]:
    pids: list[int] = []
    for ns in _namespaces():
        if _run_of(ns) == net.run:
            pids += [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split()]
    return pids


def _free_subnet() -> ipaddress.IPv4Network:
    """The first /24 of ``SUBNETS`` that no address or route of the root namespace overlaps."""
    used = []
    for line in _ip("-4", "-o", "addr", "show").stdout.splitlines():
        used.append(ipaddress.IPv4Interface(line.split()[3]).network)
    for line in _ip("-4", "route", "show", "table", "all").stdout.splitlines():
        word = line.split()[0] if line.split() else ""
        with contextlib.suppress(ValueError):
            if word not in ("default", "local", "broadcast", "unreachable", "prohibit", "blackhole"):
                used.append(ipaddress.IPv4Network(word, strict=False))
    for subnet in ipaddress.IPv4Network(SUBNETS).subnets(new_prefix=24):
        if not any(subnet.overlaps(u) for u in used):
            return subnet
    raise NetnsUnavailable(f"no free /24 left in {SUBNETS}")
