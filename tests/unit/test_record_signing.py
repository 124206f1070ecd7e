"""Signed worker records (mcpcore.record_signing) and the pure parts of mcpcore.tls, against make
certs' output."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcp_devcluster.certs import main as certs_main
from mcp_devcluster.certs import make_certs
from mcpcore.errors import PermissionDenied
from mcpcore.record_signing import RecordSigner, RecordVerifier, payload
from mcpcore.tls import Access, TLSConfig, http_peer_names, peer_names


def _make_certs(out: Path, workers: list[str]) -> Path:
    return make_certs(out, workers=workers)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return _make_certs(tmp_path_factory.mktemp("certs"), ["w-1", "w-2"])


@pytest.fixture(scope="module")
def rogue(tmp_path_factory):
    return _make_certs(tmp_path_factory.mktemp("rogue"), ["w-1"])


DATA = payload("w-1", "inc-1", "tcp://10.0.0.1:5555", "k" * 40, "10.0.0.1:7000")


def _signed(certs: Path, name: str = "w-1") -> dict[str, str]:
    return RecordSigner(str(certs / f"{name}.pem"), str(certs / f"{name}.key")).fields(DATA)


def test_a_record_signed_for_its_worker_verifies(certs):
    doc = _signed(certs)
    assert RecordVerifier(str(certs / "ca.pem")).verify("w-1", DATA, **_args(doc)) == ""


def _args(doc: dict) -> dict:
    return {"certificate": doc.get("record_certificate"), "signature": doc.get("record_signature")}


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda d: {}, "not signed"),
        (lambda d: {**d, "record_signature": "!!not base64!!"}, "signature does not match"),
        (
            lambda d: {**d, "record_signature": d["record_signature"][:-8] + "AAAAAAA="},
            "signature does not match",
        ),
        (lambda d: {**d, "record_certificate": "-----BEGIN CERTIFICATE-----\nxx\n"}, "not a PEM certificate"),
        (lambda d: {**d, "record_certificate": 42}, "must be strings"),
    ],
)
def test_a_tampered_record_says_why(certs, change, why):
    verifier = RecordVerifier(str(certs / "ca.pem"))
    assert why in verifier.verify("w-1", DATA, **_args(change(_signed(certs))))


def test_other_values_another_id_or_another_ca_fail(certs, rogue):
    verifier = RecordVerifier(str(certs / "ca.pem"))
    doc = _signed(certs)
    other = payload("w-1", "inc-1", "tcp://6.6.6.6:5555", "k" * 40, "10.0.0.1:7000")  # endpoint rewritten
    assert "signature does not match" in verifier.verify("w-1", other, **_args(doc))
    control = payload("w-1", "inc-1", "tcp://10.0.0.1:5555", "k" * 40, "6.6.6.6:7000")  # control address
    assert "signature does not match" in verifier.verify("w-1", control, **_args(doc))
    assert "not 'urn:mcpmesh:worker:w-1'" in verifier.verify("w-1", DATA, **_args(_signed(certs, "w-2")))
    # a service's or an application's certificate names no worker, whatever its DNS names
    for name in ("mcp-router", "client"):
        assert "no worker" in verifier.verify("w-1", DATA, **_args(_signed(certs, name)))
    assert "not issued by the CA" in verifier.verify("w-1", DATA, **_args(_signed(rogue)))


def test_access_checks_control_methods_only_under_mutual_tls(certs):
    mutual = TLSConfig(str(certs / "ca.pem"), str(certs / "mcp-router.pem"), str(certs / "mcp-router.key"))
    access = Access(mutual)
    assert access.check_for("/mcpapi.v2.Inference/Infer") is None
    check = access.check_for("/mcpapi.v2.ModelControl/LoadModel")

    class Context:
        def __init__(self, cn: bytes) -> None:
            self._auth = {"x509_common_name": [cn], "x509_subject_alternative_name": [cn, b"localhost"]}

        def auth_context(self) -> dict:
            return self._auth

    check(Context(b"admin"))
    with pytest.raises(PermissionDenied, match="this one's is client"):
        check(Context(b"client"))
    tls_only = TLSConfig(cert_file=str(certs / "mcp-router.pem"), key_file=str(certs / "mcp-router.key"))
    assert Access(tls_only).check_for("/mcpapi.v2.ModelControl/LoadModel") is None
    assert Access(None).check_for("/mcpapi.v2.WorkerControl/EmergencyStop") is None


def test_shared_memory_registration_is_granted_by_shm_clients_only(certs):
    files = (str(certs / "ca.pem"), str(certs / "mcp-router.pem"), str(certs / "mcp-router.key"))
    register = "/inference.GRPCInferenceService/SystemSharedMemoryRegister"
    assert Access(TLSConfig(*files)).allowed(register) == {"admin"}
    granted = Access(TLSConfig(*files, shm_clients=("client",)))
    assert granted.allowed(register) == {"admin", "client"}
    assert "client" not in granted.allowed("/mcpapi.v2.ModelControl/LoadModel")  # nothing else


def test_peer_names_from_grpc_and_ssl():
    assert peer_names({"x509_common_name": [b"a"], "x509_subject_alternative_name": [b"admin"]}) == {"a"}
    san = (("DNS", "admin"), ("IP Address", "1.2.3.4"))
    assert http_peer_names({"subject": ((("commonName", "x"),),), "subjectAltName": san}) == {"x"}
    assert http_peer_names(None) == set()


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"cert_file": "x.pem"}, "go together"),
        ({"ca_file": "/nonexistent/ca.pem"}, "no such file"),
    ],
)
def test_tls_config_names_the_bad_field(fields, needle):
    with pytest.raises(ValueError, match=needle):
        TLSConfig(**fields)


def test_make_certs_names_the_workers_make_up_runs(tmp_path):
    """``make certs`` with no arguments issues a certificate per worker id of the development cluster."""
    assert certs_main(["--out", str(tmp_path)]) == 0
    from mcp_devcluster.launcher import SERVICES  # noqa: PLC0415

    workers = {name for name, (module_name, _flags) in SERVICES.items() if module_name == "mcp_worker"}
    assert workers and all((tmp_path / f"{w}.pem").is_file() for w in workers)
