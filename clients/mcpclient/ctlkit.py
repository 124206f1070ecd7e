"""What every ``mcpctl`` command shares: its settings (``Ctl``), gRPC calls with their errors, the exit codes,
and the two output forms (a table for people, one JSON document for programs).

Invariants:
- A command never prints an error itself and never exits: it raises. ``mcpctl.main`` turns what it raises
  into exactly one line on stderr and an exit code (``exit_code``); a ``Failure`` carries its own code.
- Every gRPC call has a deadline, and its ``grpc.RpcError`` becomes an ``MCPError`` through
  ``mcpcore.transport.grpc_status.from_rpc_error`` (the one client table), here and nowhere else in the CLI.
- ``-o json`` writes one JSON document on stdout (``status --watch``: one per line, per refresh) and
  nothing else there; progress displays and notes go to stderr.
- Addresses come from the group's options (``mcpctl --scheduler ... status``), which take their defaults
  from the environment; a command's own option of the same name (``mcpctl status --scheduler ...``)
  overrides the group's for that call. Nothing is read from the environment at import.
"""

from __future__ import annotations

import functools
import io
import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click
import grpc
from rich.console import Console, RenderableType

from mcpapi.v2 import control_pb2_grpc, health_pb2_grpc, inference_pb2_grpc
from mcpcore.errors import MCPError
from mcpcore.etcd_store import EtcdAuth
from mcpcore.tls import TLSConfig
from mcpcore.tls import channel as tls_channel
from mcpcore.transport.grpc_status import from_rpc_error

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TIMED_OUT",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "Ctl",
    "Failure",
    "apply_security",
    "connects",
    "exit_code",
    "output_option",
    "pass_ctl",
    "prefix_option",
    "render_text",
    "security_options",
]

EXIT_OK = 0
EXIT_FAILED = 1  # the cluster refused or failed it (an MCPError that is not retryable)
EXIT_USAGE = 2  # bad usage or invalid input, found before anything was sent
EXIT_UNREACHABLE = 3  # UNAVAILABLE / DEADLINE_EXCEEDED talking to a service
EXIT_TIMED_OUT = 4  # load: the replicas were not RUNNING in time
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), except where it is the normal end (status --watch)

_STUBS: dict[str, Callable[[grpc.Channel], Any]] = {
    "scheduler": control_pb2_grpc.ModelControlStub,
    "router": inference_pb2_grpc.InferenceStub,
    "health": health_pb2_grpc.HealthStub,
}
CALL_TIMEOUT_S = 30.0
_WHAT = {
    "scheduler": "the scheduler",
    "router": "a router",
    "health": "the health service",
    "etcd": "etcd endpoints",
}


class Failure(Exception):
    """A command's failure found by the CLI itself (not an error status from a service), with its exit
    code: e.g. a load that timed out (4), a pid that is gone (1)."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def exit_code(err: MCPError) -> int:
    """3 for what is worth retrying (UNAVAILABLE, DEADLINE_EXCEEDED: the service could not be reached or
    did not answer in time), 1 for every other refusal or failure."""
    return EXIT_UNREACHABLE if err.retryable else EXIT_FAILED


@dataclass
class Ctl:
    """One invocation's settings, and the channels it opened (closed when the command ends)."""

    scheduler: str = ""
    router: str = ""
    health: str = ""
    etcd: str = ""
    output: str = "table"
    command: str = "mcpctl"  # the running command's path, e.g. "mcpctl breaker set", for its error line
    tls: TLSConfig | None = None  # --tls-*: TLS / mutual TLS to the services
    etcd_auth: EtcdAuth | None = None  # --etcd-*: TLS and user/password to etcd (dump)
    _channels: dict[str, grpc.Channel] = field(default_factory=dict, repr=False)

    @property
    def json(self) -> bool:
        return self.output == "json"

    def address(self, service: str) -> str:
        return str(getattr(self, service))

    def stub(self, service: str) -> Any:
        address = self.address(service)
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = tls_channel(address, self.tls)
        return _STUBS[service](channel)

    def call(self, service: str, method: str, request: Any, timeout: float = CALL_TIMEOUT_S) -> Any:
        """One unary call to ``service`` (scheduler, router or health); errors as ``MCPError``."""
        try:
            return getattr(self.stub(service), method)(request, timeout=timeout)
        except grpc.RpcError as err:
            raise self.rpc_error(service, err) from None

    def rpc_error(self, service: str, err: grpc.RpcError) -> MCPError:
        """``err`` as an MCPError; one worth retrying names the service and address it was talking to."""
        mapped = from_rpc_error(err)
        if mapped.retryable:
            mapped.message = f"{service} at {self.address(service)}: {mapped.message}"
        return mapped

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    # -- output ----------------------------------------------------------------------------------------
    def emit(self, doc: Any, view: Callable[[], RenderableType | list[RenderableType]]) -> None:
        """``doc`` as one JSON document with ``-o json``, else what ``view()`` renders, for people."""
        if self.json:
            click.echo(json.dumps(doc, indent=2))
            return
        rendered = view()
        write_renderables(rendered if isinstance(rendered, list) else [rendered])


def write_renderables(items: list[RenderableType]) -> None:
    """Print to stdout: a terminal gets rich's rendering at its width; a pipe or file gets plain text
    as wide as the content needs (no colours, no trailing blanks), so scripts and ``grep`` see whole rows."""
    console = Console(file=sys.stdout)
    if console.is_terminal:
        for item in items:
            console.print(item)
    else:
        sys.stdout.write(render_text(items))
        sys.stdout.flush()


def render_text(items: Iterable[RenderableType]) -> str:
    """Plain text of rich renderables, each as wide as it needs (tables are not squeezed to 80 columns)."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=10_000, color_system=None, highlight=False, soft_wrap=False)
    for item in items:
        console.print(item)
    return "".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines())


# -- options -------------------------------------------------------------------------------------------
F = TypeVar("F", bound=Callable[..., Any])


def pass_ctl(fn: F) -> F:
    """Call the command with the invocation's ``Ctl`` first, after noting the command's name in it."""

    @functools.wraps(fn)
    def command(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        ctl = ctx.find_object(Ctl)
        if ctl is None:
            raise RuntimeError("an mcpctl command runs under the mcpctl group (mcpctl.main)")
        ctl.command = ctx.command_path
        return fn(ctl, *args, **kwargs)

    return command  # type: ignore[return-value]


def _override(name: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is not None:
            setattr(ctx.find_object(Ctl), name, value)  # the group's callback made it, before this ran

    return callback


#: Each service's variable, default address and what it is (the group's options; ``connects`` overrides).
ADDRESSES = {
    "scheduler": ("MCP_SCHEDULER", "127.0.0.1:50051", "the scheduler (ModelControl)"),
    "router": ("MCP_ROUTER", "127.0.0.1:8001", "a router (Inference)"),
    "health": ("MCP_HEALTH", "127.0.0.1:50053", "the health service"),
    "etcd": ("MCP_ETCD_ENDPOINTS", "127.0.0.1:2379", "etcd endpoints (only dump reads etcd)"),
}


def address_options(fn: F) -> F:
    """The group's ``--scheduler``/``--router``/``--health``/``--etcd``, each from its MCP_* variable."""
    for service in reversed(ADDRESSES):
        env, default, what = ADDRESSES[service]
        fn = click.option(
            f"--{service}", envvar=env, default=default, show_default=True, show_envvar=True,
            metavar="HOST:PORT,..." if service == "etcd" else "HOST:PORT", help=what,
        )(fn)  # fmt: skip
    return fn


_SECURITY = (
    ("--tls-ca", "MCPCTL_TLS_CA", "the CA that issued the services' certificates (TLS)"),
    ("--tls-cert", "MCPCTL_TLS_CERT", "this operator's certificate (mutual TLS; make certs: admin)"),
    ("--tls-key", "MCPCTL_TLS_KEY", "its private key"),
    ("--etcd-ca", "MCPCTL_ETCD_CA", "etcd's CA (dump reads etcd over TLS)"),
    ("--etcd-user", "MCPCTL_ETCD_USER", "etcd user (with --etcd-password-file)"),
    ("--etcd-password-file", "MCPCTL_ETCD_PASSWORD_FILE", "a file holding that user's password"),
)


def security_options(fn: F) -> F:
    """The group's TLS and etcd credentials options (README "Securing a cluster"), each from MCPCTL_*."""
    for flag, env, what in reversed(_SECURITY):
        metavar = "NAME" if flag == "--etcd-user" else "FILE"
        fn = click.option(flag, envvar=env, default="", show_envvar=True, metavar=metavar, help=what)(fn)
    return fn


def apply_security(ctl: Ctl, options: dict[str, str]) -> None:
    """Set ``ctl.tls`` and ``ctl.etcd_auth`` from the options; a missing file is a usage error."""
    o = options
    try:
        ctl.tls = TLSConfig(ca_file=o["tls_ca"], cert_file=o["tls_cert"], key_file=o["tls_key"])
        ctl.etcd_auth = EtcdAuth(
            ca_file=o["etcd_ca"], user=o["etcd_user"], password_file=o["etcd_password_file"]
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def connects(*services: str) -> Callable[[F], F]:
    """A command's own ``--scheduler``/``--router``/``--health``/``--etcd`` (for the services it talks
    to): each overrides the group's option of the same name for this call."""

    def decorate(fn: F) -> F:
        for service in reversed(services):
            fn = click.option(
                f"--{service}",
                metavar="HOST:PORT",
                default=None,
                expose_value=False,
                callback=_override(service),
                help=f"{_WHAT[service]} (default: the group's --{service})",
            )(fn)
        return fn

    return decorate


def output_option(fn: F) -> F:
    """``-o/--output table|json`` on a command; overrides the group's ``-o``."""
    return click.option(
        "-o",
        "--output",
        type=click.Choice(["table", "json"]),
        default=None,
        expose_value=False,
        callback=_override("output"),
        help="table (for people) or json (one document on stdout)",
    )(fn)


def prefix_option(why: str) -> Callable[[F], F]:
    """``--prefix`` (``MCP_ETCD_PREFIX``, default ``/mcp``): the cluster's etcd key prefix; ``why`` says
    what the command reads under it."""
    return click.option(
        "--prefix",
        envvar="MCP_ETCD_PREFIX",
        default="/mcp",
        show_default=True,
        show_envvar=True,
        help=f"the cluster's etcd key prefix{why}",
    )
