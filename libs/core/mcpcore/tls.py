"""TLS and mutual TLS for every gRPC server and client of the mesh, who may call the control APIs, and
the ZeroMQ CURVE key files.

A ``TLSConfig`` is the ``tls`` section of each service's config (env ``MCP_<SERVICE>_TLS__CA_FILE`` ...) and
what the SDK and mcpctl take. One service uses one identity for its server and for the calls it makes (the
scheduler's calls to workers, health's EmergencyStop, the router's calls to the scheduler and workers).

Modes, by which files are set:
- none: plaintext (the default, for a laptop or a trusted network);
- ``cert_file`` + ``key_file``: TLS; servers prove who they are, clients are not asked for a certificate;
- with ``ca_file`` too: mutual TLS. Servers refuse a client without a certificate issued by that CA (the
  handshake fails: the client sees UNAVAILABLE), clients verify the server against it, and the control
  methods (``CONTROL_METHODS``) further require the client certificate's common name to be allowed for
  that method: an operator's (``control_clients``), a service identity whose rights name it
  (``SERVICE_RIGHTS``: least privilege), or, for registering shared memory, one of ``shm_clients``;
  other callers get PERMISSION_DENIED naming the certificate and who is allowed. (Only the common name:
  DNS SANs name hosts, which many certificates share.)

Invariants:
- The allow-list is checked on the server, per call, from the TLS session (``auth_context``), never from
  metadata a client could write. It is decided once per method at registration (``Access.check_for``).
- A config that names a missing file or half a key pair fails at start with a message naming the field.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from mcpcore.errors import PermissionDenied
from mcpcore.transport.guarded import Check

__all__ = [
    "CONTROL_METHODS",
    "DEFAULT_CONTROL_CLIENTS",
    "SERVICE_RIGHTS",
    "SHM_METHODS",
    "Access",
    "TLSConfig",
    "aio_channel",
    "channel",
    "http_peer_names",
    "load_curve_keypair",
]

#: Operators' certificate names (``make certs``' "admin"): they may call every control method.
DEFAULT_CONTROL_CLIENTS = ("admin",)

_WORKER = "/mcpapi.v2.WorkerControl/"
_MODEL = "/mcpapi.v2.ModelControl/"
_KSERVE = "/inference.GRPCInferenceService/"

#: Registering Triton system shared memory with the router: its own permission (``tls.shm_clients``), as
#: the router maps what a region names.
SHM_METHODS = frozenset(
    f"{_KSERVE}{kind}SharedMemory{verb}" for kind in ("System", "Cuda") for verb in ("Register", "Unregister")
)

#: Methods that change the mesh (or stop a worker): mTLS clients need a name allowed for the method.
CONTROL_METHODS = frozenset(
    {
        *(
            f"{_MODEL}{m}"
            for m in (
                "LoadModel", "UnloadModel", "SetTraffic", "PauseModel", "ResumeModel", "SetBreaker", "Drain",
                "Undrain",
            )
        ),
        "/mcpapi.v1.ModelControl/LoadModel",
        "/mcpapi.v1.ModelControl/UnloadModel",
        *(f"{_WORKER}{m}" for m in ("Load", "Unload", "Pause", "Resume", "EmergencyStop")),
        *(
            f"{_KSERVE}{m}"
            for m in ("RepositoryModelLoad", "RepositoryModelUnload", "LogSettings", "TraceSetting")
        ),
        *SHM_METHODS,
    }
)  # fmt: skip

#: Least privilege: what each service's own identity (``make certs`` names them) may call of the others'
#: control methods, besides the operators of ``control_clients``. The scheduler places copies on workers,
#: the health service stops a sick worker, the router forwards Triton's repository load and unload to the
#: scheduler; a router's certificate cannot pause a worker's models, an application's can do none of it.
SERVICE_RIGHTS: dict[str, frozenset[str]] = {
    "mcp-scheduler": frozenset(f"{_WORKER}{m}" for m in ("Load", "Unload", "Pause", "Resume")),
    "mcp-health": frozenset({f"{_WORKER}EmergencyStop"}),
    "mcp-router": frozenset(
        f"/mcpapi.{v}.ModelControl/{m}" for v in ("v1", "v2") for m in ("LoadModel", "UnloadModel")
    ),
}


@dataclass(frozen=True)
class TLSConfig:
    #: The CA that issued the peers' certificates; set: mutual TLS (servers require client certificates).
    ca_file: str = ""
    #: This process's certificate (PEM, leaf first) and its private key.
    cert_file: str = ""
    key_file: str = ""
    #: Operators: certificate common names allowed to call every control method under mutual TLS (the
    #: services' own identities have their fixed rights: ``SERVICE_RIGHTS``).
    control_clients: tuple[str, ...] = DEFAULT_CONTROL_CLIENTS
    #: Certificate common names that may register system shared memory with the router (besides the
    #: operators); none by default: a client that maps its memory into the router is trusted with it.
    shm_clients: tuple[str, ...] = ()
    #: The name to verify in servers' certificates instead of the address's host (e.g. a Service's DNS name).
    server_name: str = ""

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("tls: cert_file and key_file go together (both or neither)")
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ValueError(f"tls.{name}: no such file {path!r} (make certs writes a test set)")

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file or self.ca_file)

    @property
    def mutual(self) -> bool:
        return bool(self.ca_file and self.cert_file)

    def _read(self, name: str) -> bytes | None:
        path = getattr(self, name)
        return Path(path).read_bytes() if path else None

    def server_credentials(self) -> grpc.ServerCredentials:
        if not self.cert_file:
            raise ValueError("tls: a server needs cert_file and key_file")
        pair = [(self._read("key_file"), self._read("cert_file"))]
        ca = self._read("ca_file")
        return grpc.ssl_server_credentials(pair, root_certificates=ca, require_client_auth=ca is not None)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self._read("ca_file"),
            private_key=self._read("key_file"),
            certificate_chain=self._read("cert_file"),
        )

    def ssl_context(self) -> ssl.SSLContext:
        """A server-side context for the REST port: the same certificate, and with a CA, client
        certificates required (mutual TLS), as on the gRPC ports."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        if self.ca_file:
            context.load_verify_locations(self.ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def channel_options(self) -> list[tuple[str, Any]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def aio_channel(
    address: str, tls: TLSConfig | None, options: Sequence[tuple[str, Any]] = ()
) -> grpc.aio.Channel:
    """A grpc.aio channel to ``address``: TLS with this process's identity when ``tls`` is enabled."""
    if tls is None or not tls.enabled:
        return grpc.aio.insecure_channel(address, options=list(options))
    opts = [*options, *tls.channel_options()]
    return grpc.aio.secure_channel(address, tls.channel_credentials(), options=opts)


def channel(address: str, tls: TLSConfig | None, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    """The blocking twin of ``aio_channel`` (mcpctl)."""
    if tls is None or not tls.enabled:
        return grpc.insecure_channel(address, options=list(options))
    opts = [*options, *tls.channel_options()]
    return grpc.secure_channel(address, tls.channel_credentials(), options=opts)


class Access:
    """Per-method authorization on a server: control methods under mutual TLS need an allowed name."""

    def __init__(self, tls: TLSConfig | None) -> None:
        mutual = tls is not None and tls.mutual
        self._operators = frozenset(tls.control_clients) if tls is not None and mutual else None
        self._shm = frozenset(tls.shm_clients) if tls is not None and mutual else frozenset()

    def allowed(self, method: str) -> frozenset[str]:
        """The certificate names that may call ``method`` (a control method; any name: not one)."""
        assert self._operators is not None
        services = {name for name, methods in SERVICE_RIGHTS.items() if method in methods}
        return self._operators | services | (self._shm if method in SHM_METHODS else frozenset())

    def check_for(self, method: str) -> Check | None:
        """The check to run before ``method``'s behaviour (None: nothing to check)."""
        if self._operators is None or method not in CONTROL_METHODS:
            return None
        allowed = self.allowed(method)
        return lambda context: self.require(method, peer_names(context.auth_context()), allowed)

    def require_method(self, method: str, what: str, names: set[str]) -> None:
        """``require`` for the control method ``method`` (full gRPC name), reached as ``what`` (REST)."""
        if self._operators is not None:
            self.require(what, names, self.allowed(method))

    def require(self, what: str, names: set[str], allowed: frozenset[str]) -> None:
        """Raise PermissionDenied unless one of the caller's certificate ``names`` is ``allowed``."""
        if not names & allowed:
            shown = ", ".join(sorted(names)) or "none"
            raise PermissionDenied(
                f"{what} needs a client certificate whose common name is one of {sorted(allowed)} "
                f"(operators: tls.control_clients; services: their own rights); this one's is {shown}"
            )


def peer_names(auth: dict[str, Sequence[bytes]]) -> set[str]:
    """A verified client certificate's common name (gRPC's view of the session)."""
    raw = auth.get("x509_common_name", ())
    return {v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in raw}


def http_peer_names(peercert: dict[str, Any] | None) -> set[str]:
    """The same from ``ssl``'s view of a verified peer certificate (REST)."""
    if not peercert:
        return set()
    return {value for rdn in peercert.get("subject", ()) for key, value in rdn if key == "commonName"}


def load_curve_keypair(path: str) -> tuple[bytes, bytes]:
    """(public, secret) z85 CURVE keys from a ``*.key_secret`` file written by ``zmq.auth`` (make certs)."""
    import zmq.auth  # noqa: PLC0415  (only processes configured for CURVE need it)

    try:
        public, secret = zmq.auth.load_certificate(Path(path))
    except (OSError, ValueError) as exc:
        raise ValueError(f"CURVE key file {path!r}: {exc}") from None
    if secret is None:
        raise ValueError(f"CURVE key file {path!r} holds no secret key (use the .key_secret file)")
    return public, secret
