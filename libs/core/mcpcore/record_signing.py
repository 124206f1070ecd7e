"""Worker records signed with the worker's TLS key, so that whoever can write etcd cannot redirect tensors.

A worker with a TLS certificate signs the part of its record that says where requests go: its id, its
incarnation, its ZeroMQ endpoint, its CURVE public key and its control (gRPC) address (``payload``). The
record carries the certificate (PEM) and the signature (base64). Routers (from etcd) and SDK clients
(from ``Route``) that are given the CA verify, before sending a tensor, that:

- the certificate was issued by the CA and is valid now;
- it names the worker id in a URI SAN ``urn:mcpmesh:worker:<id>`` (``worker_uri``), which only that worker's
  certificate carries (DNS names are shared by design: every certificate may name the same hosts), so one
  worker's key, or an application's, cannot vouch for another id;
- the signature over the payload verifies with the certificate's key (EC P-256/P-384 ECDSA-SHA256, RSA
  PKCS#1 v1.5 SHA-256, or Ed25519).

A worker that offers its same-host endpoint signs that offer too (``local_claim``, the record's
``record_local_signature``): a verifying sender uses the endpoint only when it verifies, so whoever can
write etcd cannot add the offer to a worker that does not listen there and have a local process bind the
name.

A forged record (another endpoint or CURVE key, unsigned, signed by another CA or for another id) fails,
and the verifier says why in one line. A certificate is checked once and remembered; the signature is
checked on every record change (a fraction of a millisecond).
"""

from __future__ import annotations

import base64
import binascii
import datetime
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

__all__ = ["RecordSigner", "RecordVerifier", "local_claim", "payload", "worker_uri"]

_CACHE_MAX = 4096
_URN = "urn:mcpmesh:worker:"


def worker_uri(worker_id: str) -> str:
    """The URI SAN that names a worker in its certificate."""
    return f"urn:mcpmesh:worker:{worker_id}"


def payload(worker_id: str, incarnation: str, zmq: str, curve_public_key: str, grpc: str) -> bytes:
    """The signed bytes: what decides where a request's tensors and a worker's control calls go."""
    fields = ("mcpmesh worker record v1", worker_id, incarnation, zmq, curve_public_key, grpc)
    return "\n".join(fields).encode()


def local_claim(signed_payload: bytes) -> bytes:
    """The bytes of ``record_local_signature``: the record's payload and its offer of a same-host endpoint
    (``zmq_features`` "local", whose name ``wire.local_endpoint`` derives from the payload's fields). A
    separate signature, so records signed before it existed verify as they did."""
    return signed_payload + b"\noffers its same-host endpoint"


class RecordSigner:
    """Signs with a worker's TLS key (``tls.key_file``); the record carries ``tls.cert_file``'s leaf."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.certificate = Path(cert_file).read_text()
        self._key: Any = serialization.load_pem_private_key(Path(key_file).read_bytes(), password=None)

    def sign(self, data: bytes) -> str:
        key = self._key
        if isinstance(key, ec.EllipticCurvePrivateKey):
            sig = key.sign(data, ec.ECDSA(hashes.SHA256()))
        elif isinstance(key, rsa.RSAPrivateKey):
            sig = key.sign(data, padding.PKCS1v15(), hashes.SHA256())
        elif isinstance(key, ed25519.Ed25519PrivateKey):
            sig = key.sign(data)
        else:
            raise ValueError(f"tls.key_file: {type(key).__name__} keys cannot sign worker records")
        return base64.b64encode(sig).decode()

    def fields(self, data: bytes) -> dict[str, str]:
        """The record's ``record_certificate`` and ``record_signature``."""
        return {"record_certificate": self.certificate, "record_signature": self.sign(data)}


class RecordVerifier:
    """Checks signed records against the CA in ``ca_file``."""

    def __init__(self, ca_file: str) -> None:
        self._cas = x509.load_pem_x509_certificates(Path(ca_file).read_bytes())
        self._certs: dict[str, tuple[Any, frozenset[str], datetime.datetime]] = {}

    def verify(self, worker_id: str, data: bytes, certificate: Any, signature: Any) -> str:
        """Why the record cannot be trusted ("" when it can)."""
        if not certificate or not signature:
            return "the record is not signed (the worker needs tls.cert_file and tls.key_file)"
        if not isinstance(certificate, str) or not isinstance(signature, str):
            return "record_certificate and record_signature must be strings"
        checked = self._certificate(certificate)
        if isinstance(checked, str):
            return checked
        key, names, not_after = checked
        if datetime.datetime.now(datetime.UTC) > not_after:
            return f"the record's certificate expired at {not_after:%Y-%m-%d %H:%M} UTC"
        if worker_uri(worker_id) not in names:
            shown = sorted(names) or "no worker"
            return f"the record's certificate names {shown}, not {worker_uri(worker_id)!r}"
        try:
            raw = base64.b64decode(signature, validate=True)
            if isinstance(key, ec.EllipticCurvePublicKey):
                key.verify(raw, data, ec.ECDSA(hashes.SHA256()))
            elif isinstance(key, rsa.RSAPublicKey):
                key.verify(raw, data, padding.PKCS1v15(), hashes.SHA256())
            else:
                key.verify(raw, data)
        except (InvalidSignature, binascii.Error, ValueError):
            return "the record's signature does not match its endpoint and CURVE key"
        return ""

    def _certificate(self, pem: str) -> tuple[Any, frozenset[str], datetime.datetime] | str:
        known = self._certs.get(pem)
        if known is not None:
            return known
        try:
            cert = x509.load_pem_x509_certificate(pem.encode())
        except ValueError:
            return "record_certificate is not a PEM certificate"
        if not any(_issued_by(cert, ca) for ca in self._cas):
            return f"the record's certificate ({cert.subject.rfc4514_string()}) was not issued by the CA"
        if datetime.datetime.now(datetime.UTC) < cert.not_valid_before_utc:
            return "the record's certificate is not valid yet"
        key = cert.public_key()
        if not isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey | ed25519.Ed25519PublicKey):
            return f"the record's certificate has a {type(key).__name__}, which cannot sign records"
        entry = (key, _names(cert), cert.not_valid_after_utc)
        if len(self._certs) >= _CACHE_MAX:
            self._certs.clear()
        self._certs[pem] = entry
        return entry


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _names(cert: x509.Certificate) -> frozenset[str]:
    """The certificate's worker URIs."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return frozenset()
    return frozenset(u for u in san.get_values_for_type(x509.UniformResourceIdentifier) if u.startswith(_URN))
