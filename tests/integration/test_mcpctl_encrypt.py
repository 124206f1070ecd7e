"""``mcpctl keygen`` and ``mcpctl encrypt-model`` as real subprocesses on a tiny repository: the encrypted
copy (format 2) loads through the worker's ModelRepository with the right keyring and fails with another
one; a format-1 file still loads there, and loading holds one plaintext-sized buffer."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
import yaml

from mcp_worker.repository import ModelRepository
from mcpcore.errors import PermissionDenied
from mcpcore.keyring import Keyring, write_keyring
from mcpcore.model_encryption import CHUNK_BYTES, encrypt_file, read_header

WEIGHTS = b"\x00\x01 fake safetensors bytes \xff" * 50
MODEL_YAML = """\
backend: numpy
max_batch_size: 8
inputs:
  - {name: INPUT0, dtype: FP32, shape: [-1, 4]}
outputs:
  - {name: OUTPUT0, dtype: FP32, shape: [-1, 2]}
weights: weights.safetensors
layers:
  - {op: dense, in: 4, out: 2, weight: fc.weight, bias: fc.bias}
qos: {latency_sensitivity: 0.9}
"""


def mcpctl(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mcpclient.mcpctl", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    d = tmp_path / "repo" / "demo" / "1"
    d.mkdir(parents=True)
    (d / "model.yaml").write_text(MODEL_YAML)
    (d / "weights.safetensors").write_bytes(WEIGHTS)
    (d / "README").write_text("extra files travel with the copy")
    return tmp_path / "repo"


@pytest.fixture
def ring(tmp_path: Path) -> Path:
    path = tmp_path / "keyring.json"
    r = mcpctl("keygen", "--keyring", path, "--key-id", "k1")
    assert r.returncode == 0, r.stderr
    assert "added key 'k1'" in r.stdout
    return path


def _keys_text(path: Path) -> list[str]:
    return list(json.loads(path.read_text())["keys"].values())


def test_keygen_creates_a_private_keyring_and_never_prints_keys(ring: Path) -> None:
    assert ring.stat().st_mode & 0o777 == 0o600
    r = mcpctl("keygen", "--keyring", ring, "--key-id", "k2")
    assert r.returncode == 0, r.stderr
    assert Keyring.load(ring).key_ids == ("k1", "k2")
    again = mcpctl("keygen", "--keyring", ring, "--key-id", "k1")
    assert again.returncode == 1
    assert again.stderr.strip() == f"mcpctl keygen: key id 'k1' is already in keyring {ring}"
    for key in _keys_text(ring):
        for out in (r.stdout, r.stderr, again.stdout, again.stderr):
            assert key not in out and key[:12] not in out


def test_encrypt_to_another_model_loads_with_the_right_keyring_only(repo: Path, ring: Path) -> None:
    r = mcpctl(
        "encrypt-model", "--repo", repo, "--model", "demo", "--version", "1",
        "--keyring", ring, "--key-id", "k1", "--output-model", "demo-enc",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "demo-enc/1/weights.safetensors.enc" in r.stdout
    for key in _keys_text(ring):
        assert key not in r.stdout + r.stderr

    src, dst = repo / "demo" / "1", repo / "demo-enc" / "1"
    assert (src / "model.yaml").read_text() == MODEL_YAML  # the source is left alone
    assert (src / "weights.safetensors").read_bytes() == WEIGHTS
    assert sorted(p.name for p in dst.iterdir()) == ["README", "model.yaml", "weights.safetensors.enc"]
    assert WEIGHTS[:20] not in (dst / "weights.safetensors.enc").read_bytes()
    assert read_header((dst / "weights.safetensors.enc").read_bytes()).format_version == 2
    doc = yaml.safe_load((dst / "model.yaml").read_text())
    assert list(doc)[:6] == ["backend", "max_batch_size", "inputs", "outputs", "weights", "layers"]
    assert doc["weights"] == "weights.safetensors.enc"
    assert (doc["encrypted"], doc["key_id"], doc["qos"]) == (True, "k1", {"latency_sensitivity": 0.9})
    assert not [p for p in repo.rglob(".*")], "no temp files left behind"

    repository = ModelRepository(repo, Keyring.load(ring))
    assert repository.index() == {"demo": ["1"], "demo-enc": ["1"]}
    art = repository.load("demo-enc", "1")
    assert art.weights == WEIGHTS and art.config.encrypted and art.config.key_id == "k1"

    other = repo.parent / "other.json"
    write_keyring(other, {"k1": bytes(32)})
    with pytest.raises(PermissionDenied, match="different key than keyring key 'k1'"):
        ModelRepository(repo, Keyring.load(other)).load("demo-enc", "1")
    with pytest.raises(PermissionDenied, match="no keyring configured"):
        ModelRepository(repo).load("demo-enc", "1")


def test_encrypt_in_place_removes_the_plaintext(repo: Path, ring: Path) -> None:
    r = mcpctl(
        "encrypt-model", "--repo", repo, "--model", "demo", "--version", "1",
        "--keyring", ring, "--key-id", "k1",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    src = repo / "demo" / "1"
    assert not (src / "weights.safetensors").exists()
    assert ModelRepository(repo, Keyring.load(ring)).load("demo", "1").weights == WEIGHTS

    again = mcpctl(
        "encrypt-model", "--repo", repo, "--model", "demo", "--version", "1",
        "--keyring", ring, "--key-id", "k1",
    )  # fmt: skip
    assert again.returncode == 1
    assert again.stderr.strip() == "mcpctl encrypt-model: model demo/1 is already encrypted (key id 'k1')"


# Written by the format-1 writer (mcpcore.crypto at b552812) with key bytes(range(32)) as "k1", for
# demo-legacy/1; the plaintext is LEGACY_PLAIN.
LEGACY_PLAIN = b"legacy v1 weights\n" * 4
LEGACY_BLOB = bytes.fromhex(
    "4d4350454e4301026b31265ba44359028002934429fc42d079a83c14e41045fc2d27c6ee6cbdcbb54ed9da22f5712156"
    "f1588685707cf12797deaf91eda5689559d4c25f79f191331ebda5349ddf44746544701ff66e9937389fc3ddb1dcd4db"
    "0d1fd888936f50f7848a07ca3285791a383524e04984"
)


def _encrypted_version(repo: Path, model: str, blob: bytes | None = None) -> Path:
    d = repo / model / "1"
    d.mkdir(parents=True)
    doc = {
        **yaml.safe_load(MODEL_YAML),
        "weights": "weights.safetensors.enc",
        "encrypted": True,
        "key_id": "k1",
    }
    (d / "model.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    if blob is not None:
        (d / "weights.safetensors.enc").write_bytes(blob)
    return d / "weights.safetensors.enc"


def test_a_format_1_file_still_loads_in_the_worker(repo: Path, tmp_path: Path) -> None:
    _encrypted_version(repo, "demo-legacy", LEGACY_BLOB)
    ring = tmp_path / "legacy.json"
    write_keyring(ring, {"k1": bytes(range(32))})
    assert ModelRepository(repo, Keyring.load(ring)).load("demo-legacy", "1").weights == LEGACY_PLAIN


def test_the_worker_decrypts_with_one_plaintext_sized_buffer(repo: Path, tmp_path: Path) -> None:
    size = 16 << 20
    src = tmp_path / "big.bin"
    with src.open("wb") as f:
        for i in range(size // CHUNK_BYTES):
            f.write(bytes([i]) * CHUNK_BYTES)
    key = bytes(range(32))
    encrypt_file(
        src, _encrypted_version(repo, "demo-big"), key=key, key_id="k1", model="demo-big", version="1"
    )
    repository = ModelRepository(repo, Keyring.from_keys({"k1": key}))
    tracemalloc.start()
    try:
        weights = repository.load("demo-big", "1").weights
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert weights == src.read_bytes()
    # The plaintext plus a chunk or two of scratch; reading the file whole first would make it 2x.
    assert size <= peak < size + 4 * CHUNK_BYTES, peak


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--key-id", "k9"], "key id 'k9' is not in keyring"),
        (["--key-id", "k1", "--version", "2"], "no such file"),
        (["--key-id", "k1", "--output-model", "../x"], "output model name '../x' is not valid"),
        (["--key-id", "k1", "--output-model", "demo-enc"], "already exists"),
    ],
)
def test_encrypt_errors_are_one_line_and_exit_1(
    repo: Path, ring: Path, extra: list[str], message: str
) -> None:
    (repo / "demo-enc" / "1").mkdir(parents=True)
    args = ["--repo", repo, "--model", "demo", "--version", "1", "--keyring", ring]
    r = mcpctl("encrypt-model", *args, *extra)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert (repo / "demo" / "1" / "weights.safetensors").read_bytes() == WEIGHTS


def test_missing_keyring_file(repo: Path, tmp_path: Path) -> None:
    args = ["--repo", repo, "--model", "demo", "--version", "1", "--key-id", "k1"]
    r = mcpctl("encrypt-model", *args, "--keyring", tmp_path / "none.json")
    assert r.returncode == 1 and "none.json: no such file" in r.stderr


def test_bad_keyring_file_never_echoes_key_material(repo: Path, tmp_path: Path) -> None:
    ring = tmp_path / "bad.json"
    secret = base64.b64encode(b"0123456789abcdef0123456789abcd").decode()  # 30 bytes: too short
    ring.write_text(json.dumps({"keys": {"k1": secret}}))
    ring.chmod(0o600)
    args = ["--repo", repo, "--model", "demo", "--version", "1", "--key-id", "k1"]
    r = mcpctl("encrypt-model", *args, "--keyring", ring)
    assert r.returncode == 1 and "'k1' decodes to 30 bytes" in r.stderr
    assert secret not in r.stderr and secret[:12] not in r.stderr


def test_usage_errors_exit_2() -> None:
    bare = mcpctl()
    assert bare.returncode == 2 and bare.stderr.startswith("Usage: mcpctl [OPTIONS] COMMAND")  # the help
    for args, line in (
        (("no-such-command",), "mcpctl: no such command 'no-such-command' (see 'mcpctl -h')"),
        (
            ("encrypt-model", "--repo", "x"),
            "mcpctl encrypt-model: missing option '--model' (see 'mcpctl encrypt-model -h')",
        ),
    ):
        r = mcpctl(*args)
        assert (r.returncode, r.stderr) == (2, line + "\n"), args
    assert mcpctl("--help").returncode == 0
    assert mcpctl("encrypt-model", "--help").stdout.startswith("Usage: mcpctl encrypt-model [OPTIONS]")
