"""A test certificate authority and every identity a secured mesh needs, in one folder: ``make certs``
(``python -m mcp_devcluster.certs``), and ``make up SECURE=1``'s identities.

Writes (``--out``, default ``certs/``; private keys mode 0600)::

    ca.pem  ca.key                 the CA (EC P-256), valid --days
    <name>.pem  <name>.key         one leaf per name: mcp-router, mcp-scheduler, mcp-health, etcd (its
                                   server), admin (mcpctl), client (an application: inference only), and
                                   each --workers id
    curve/<name>.key[_secret]      ZeroMQ CURVE key pairs (zmq.auth format): mcp-router, client, workers
    curve/clients/<name>.key       the public keys workers accept (zmq_curve_clients_dir): mcp-router, client

Each leaf's common name is its name (what ``tls.control_clients`` matches). Servers (services, etcd,
workers) also have DNS SANs for ``localhost`` and the --hosts entries and an IP SAN for 127.0.0.1; ``admin``
and ``client`` are client certificates only, with no host names. A worker's certificate also carries the
URI SAN ``urn:mcpmesh:worker:<id>``: routers and SDK clients accept a worker record only when it is signed
by the certificate with that id (``mcpcore.record_signing``). For production, issue the same names from
your CA.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

import zmq.auth
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["make_certs"]

SERVICES = ("mcp-router", "mcp-scheduler", "mcp-health", "etcd", "admin", "client")
CLIENTS = ("admin", "client")  # client authentication only
CURVE_CLIENTS = ("mcp-router", "client")


_CA_USAGE = x509.KeyUsage(
    digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
    key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
    decipher_only=False,
)  # fmt: skip


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # never readable by others
    os.fchmod(fd, 0o600)  # a file that was there keeps its mode through O_CREAT
    with os.fdopen(fd, "wb") as f:
        f.write(pem)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _ca(out: Path, days: int) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("mcpmesh test CA"))
        .issuer_name(_name("mcpmesh test CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_CA_USAGE, critical=True)
        .sign(key, hashes.SHA256())
    )
    (out / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(out / "ca.key", key)
    return cert, key


def _leaf(  # noqa: PLR0917  (one identity: where, who, by whom, for what, where it serves, how long)
    out: Path,
    name: str,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    role: str,
    hosts: Iterable[str],
    days: int,
) -> None:
    """``role``: "client" (an application or an operator: client authentication only, no host names),
    "service" or "worker" (servers too: the hosts; a worker also its ``urn:mcpmesh:worker:<id>``)."""
    ca_cert, ca_key = ca
    key = _key()
    names: list[x509.GeneralName] = [x509.DNSName(name)]
    usage = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if role != "client":
        usage.append(ExtendedKeyUsageOID.SERVER_AUTH)
        names += [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
    if role == "worker":
        names.append(x509.UniformResourceIdentifier(f"urn:mcpmesh:worker:{name}"))
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (out / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(out / f"{name}.key", key)


def make_certs(out: Path, *, workers: Iterable[str] = (), hosts: Iterable[str] = (), days: int = 365) -> Path:
    """Write the CA, the services' and workers' certificates and the CURVE keys under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    workers, hosts = list(workers), list(hosts)
    ca = _ca(out, days)
    for name in (*SERVICES, *workers):
        role = "worker" if name in workers else "client" if name in CLIENTS else "service"
        _leaf(out, name, ca, role, hosts, days)
    curve = out / "curve"
    curve.mkdir(exist_ok=True)
    clients = curve / "clients"
    clients.mkdir(exist_ok=True)
    for name in (*CURVE_CLIENTS, *workers):
        umask = os.umask(0o077)  # zmq.auth writes both files with the umask's mode: the secret never open
        try:
            zmq.auth.create_certificates(curve, name)
        finally:
            os.umask(umask)
        os.chmod(curve / f"{name}.key", 0o644)
        if name in CURVE_CLIENTS:
            shutil.copyfile(curve / f"{name}.key", clients / f"{name}.key")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("certs"))
    parser.add_argument(
        "--workers", default="worker-1,worker-2", help="worker ids, comma separated (default: make up's)"
    )
    parser.add_argument("--hosts", default="", help="more host names or IPs for every certificate")
    parser.add_argument("--days", type=int, default=365)
    args = parser.parse_args(argv)
    split = lambda text: [s for s in text.split(",") if s]  # noqa: E731
    out = make_certs(args.out, workers=split(args.workers), hosts=split(args.hosts), days=args.days)
    print(f"certificates and CURVE keys in {out}/ (CA: {out}/ca.pem; keep {out}/ca.key private)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
