"""``make up SECURE=1``: the development cluster with every door locked, and the identities that open them.

``Identities.create(run)`` writes, fresh for each ``up``: the certificates and CURVE keys of every id the
cluster runs (``certs.make_certs``: the services, ``admin`` for operators, ``client`` for applications,
each worker) in ``<run>/certs``, random etcd passwords in ``<run>/secrets`` (0600), and ``<run>/mcpctl.env``,
which marks the cluster as secured (``status`` reads it, ``down`` removes it). From it the launcher takes
etcd's certificate and users (``etcd_tls``, ``enable_etcd_auth``), each service's settings
(``service_env``: mutual TLS under its own certificate, etcd over TLS as ``mesh``, CURVE keys on the tensor
path), the operator's and the application's identities (``admin``, ``client``) and what ``up`` prints
(``how_to_connect``).
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from mcp_devcluster.certs import make_certs
from mcp_devcluster.localetcd import EtcdServer
from mcpcore.tls import TLSConfig

__all__ = ["ETCD_USER", "Identities"]

ETCD_USER = "mesh"  # the services' etcd user: read and write under the cluster's prefix, nothing else
_PREFIX = "/mcp/"
_SERVICE_CERTS = {"mcp_router": "mcp-router", "mcp_scheduler": "mcp-scheduler", "mcp_health": "mcp-health"}


def _secret(path: Path) -> str:
    value = secrets.token_urlsafe(24)
    path.write_text(value + "\n")
    os.chmod(path, 0o600)
    return value


@dataclass(frozen=True)
class Identities:
    """Where a secured cluster's certificates, keys and passwords are (absolute paths)."""

    certs: Path
    secrets: Path
    env_file: Path

    @classmethod
    def create(cls, run: Path, workers: list[str]) -> Identities:
        run = run.resolve()
        ids = cls(certs=run / "certs", secrets=run / "secrets", env_file=run / "mcpctl.env")
        for stale in (ids.certs, ids.secrets):  # a fresh CA and passwords each time, like etcd's data
            shutil.rmtree(stale, ignore_errors=True)
        make_certs(ids.certs, workers=workers)
        (ids.certs / "ca.key").unlink()  # nothing more is issued from this CA: no key to steal
        ids.secrets.mkdir(mode=0o700, exist_ok=True)
        for user in ("root", ETCD_USER):
            _secret(ids.secrets / f"etcd-{user}")
        env = ids.mcpctl_env().items()
        ids.env_file.write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env))
        return ids

    @classmethod
    def load(cls, run: Path) -> Identities | None:
        """The identities of the secured cluster running from ``run``; None when it is not secured."""
        run = run.resolve()
        env_file = run / "mcpctl.env"
        return cls(run / "certs", run / "secrets", env_file) if env_file.is_file() else None

    def _pem(self, name: str) -> tuple[str, str]:
        return str(self.certs / f"{name}.pem"), str(self.certs / f"{name}.key")

    @property
    def ca(self) -> str:
        return str(self.certs / "ca.pem")

    @property
    def etcd_tls(self) -> tuple[Path, Path, Path]:
        return self.certs / "ca.pem", self.certs / "etcd.pem", self.certs / "etcd.key"

    def enable_etcd_auth(self, etcd: EtcdServer) -> None:
        users = ("root", ETCD_USER)
        etcd.enable_auth({u: (self.secrets / f"etcd-{u}").read_text().strip() for u in users}, _PREFIX)

    def _tls(self, name: str) -> TLSConfig:
        cert, key = self._pem(name)
        return TLSConfig(ca_file=self.ca, cert_file=cert, key_file=key)

    @property
    def admin(self) -> TLSConfig:
        """An operator (``tls.control_clients``' default): may call every control method."""
        return self._tls("admin")

    @property
    def client(self) -> TLSConfig:
        """An application: may infer and read, nothing else."""
        return self._tls("client")

    def service_env(self, name: str, module: str) -> dict[str, str]:
        """The settings of the service ``name`` (a worker's name is its id) run as ``python -m module``."""
        prefix = f"MCP_{module.removeprefix('mcp_').upper()}_"
        identity = _SERVICE_CERTS.get(module, name)
        cert, key = self._pem(identity)
        env = {
            f"{prefix}TLS__CA_FILE": self.ca,
            f"{prefix}TLS__CERT_FILE": cert,
            f"{prefix}TLS__KEY_FILE": key,
            f"{prefix}ETCD_AUTH__CA_FILE": self.ca,
            f"{prefix}ETCD_AUTH__USER": ETCD_USER,
            f"{prefix}ETCD_AUTH__PASSWORD_FILE": str(self.secrets / f"etcd-{ETCD_USER}"),
        }
        curve = self.certs / "curve"
        if module == "mcp_worker":  # its own key pair; only the allow-listed keys may send it tensors
            env[f"{prefix}ZMQ_CURVE_SECRET_KEY_FILE"] = str(curve / f"{identity}.key_secret")
            env[f"{prefix}ZMQ_CURVE_CLIENTS_DIR"] = str(curve / "clients")
        elif module == "mcp_router":
            env[f"{prefix}ZMQ_CURVE_SECRET_KEY_FILE"] = str(curve / "mcp-router.key_secret")
        return env

    def mcpctl_env(self) -> dict[str, str]:
        """mcpctl's variables for the operator's identity (``.run/mcpctl.env``)."""
        cert, key = self._pem("admin")
        return {
            "MCPCTL_TLS_CA": self.ca,
            "MCPCTL_TLS_CERT": cert,
            "MCPCTL_TLS_KEY": key,
            "MCPCTL_ETCD_CA": self.ca,
            "MCPCTL_ETCD_USER": ETCD_USER,
            "MCPCTL_ETCD_PASSWORD_FILE": str(self.secrets / f"etcd-{ETCD_USER}"),
        }

    def how_to_connect(self, router: str, rest: str, etcd: str) -> str:
        """The lines ``up`` prints: mcpctl, tritonclient (gRPC and HTTP), curl and etcdctl, as this
        cluster wants them."""
        cert, key = self._pem("client")
        here = Path.cwd()
        rel = lambda p: os.path.relpath(p, here)  # noqa: E731
        ca, cert, key = rel(self.ca), rel(cert), rel(key)
        password = rel(self.secrets / f"etcd-{ETCD_USER}")
        return "\n".join([
            "secured: mutual TLS on every gRPC and REST port, CURVE on the workers' ZeroMQ sockets, "
            f"etcd over TLS with users; identities in {rel(self.certs)}/ (operators: admin, "
            f"applications: client), etcd passwords in {rel(self.secrets)}/",
            f"mcpctl (as admin):  . {rel(self.env_file)} && .venv/bin/mcpctl status",
            f"tritonclient gRPC (as client):  tritonclient.grpc.InferenceServerClient(\"{router}\", "
            "ssl=True, "
            f"root_certificates=\"{ca}\", private_key=\"{key}\", certificate_chain=\"{cert}\")",
            f"tritonclient HTTP (as client):  tritonclient.http.InferenceServerClient(\"{rest}\", ssl=True, "
            f"ssl_options={{\"ca_certs\": \"{ca}\", \"certfile\": \"{cert}\", \"keyfile\": \"{key}\"}}, "
            "ssl_context_factory=gevent.ssl.create_default_context)  # import gevent.ssl",
            f"curl:  curl --cacert {ca} --cert {cert} --key {key} https://{rest}/v2/health/ready",
            f"etcdctl:  ETCDCTL_USER={ETCD_USER}:$(cat {password}) etcdctl --endpoints=https://{etcd} "
            f"--cacert={ca} get --prefix --keys-only /mcp/",
        ])  # fmt: skip
