"""mcpcore.crypto: round trips; a wrong or unknown key is PermissionDenied; any damage to the file, or a copy
under another model name or version, is DataLoss or PermissionDenied and never succeeds; keys never show."""

from __future__ import annotations

import base64
import json
import logging
import os
from pathlib import Path

import pytest

from mcpcore.crypto import (
    KEY_BYTES,
    MAGIC,
    NONCE_BYTES,
    TAG_BYTES,
    Keyring,
    decrypt_file,
    decrypt_model_bytes,
    encrypt_file,
    encrypt_model_bytes,
    generate_key,
    read_header,
    write_keyring,
)
from mcpcore.errors import DataLoss, InvalidArgument, MCPError, NotFound, PermissionDenied

KEY = bytes(range(KEY_BYTES))
OTHER = bytes(range(100, 100 + KEY_BYTES))
RING = Keyring.from_keys({"k1": KEY})
PLAIN = b"weights " * 40
M, V = "demo-mlp-enc", "1"


def _enc(plain: bytes = PLAIN, model: str = M, version: str = V) -> bytes:
    return encrypt_model_bytes(plain, key=KEY, key_id="k1", model=model, version=version)


def _dec(blob: bytes, ring: Keyring = RING, model: str = M, version: str = V) -> bytes:
    return decrypt_model_bytes(blob, keyring=ring, model=model, version=version)


# --- round trip and format ---------------------------------------------------------------------------------


@pytest.mark.parametrize("plain", [b"", b"x", PLAIN, os.urandom(100_000)])
def test_round_trip(plain: bytes) -> None:
    blob = _enc(plain)
    assert _dec(blob) == plain
    if len(plain) >= 16:  # a shorter plaintext can show up in random nonce or tag bytes by chance
        assert plain not in blob


def test_header_layout_and_random_nonce() -> None:
    a, b = _enc(), _enc()
    h = read_header(a)
    assert (h.format_version, h.key_id, len(h.nonce), len(h.key_check)) == (1, "k1", NONCE_BYTES, 8)
    assert a.startswith(MAGIC + b"\x01\x02k1")
    assert h.size == len(MAGIC) + 2 + 2 + 8 + NONCE_BYTES
    assert len(a) == h.size + len(PLAIN) + TAG_BYTES
    assert read_header(b).nonce != h.nonce and a != b


def test_encrypt_rejects_bad_arguments() -> None:
    with pytest.raises(InvalidArgument):
        encrypt_model_bytes(b"", key=KEY[:16], key_id="k1", model=M, version=V)
    with pytest.raises(InvalidArgument):
        encrypt_model_bytes(b"", key=KEY, key_id="../k", model=M, version=V)
    with pytest.raises(InvalidArgument):
        encrypt_model_bytes(b"", key=KEY, key_id="k1", model="a/b", version=V)
    with pytest.raises(InvalidArgument):
        encrypt_model_bytes(b"", key=KEY, key_id="k1", model=M, version="0")


# --- wrong keys ------------------------------------------------------------------------------------------


def test_wrong_key_is_permission_denied_naming_model_and_key_id() -> None:
    with pytest.raises(PermissionDenied) as exc:
        _dec(_enc(), Keyring.from_keys({"k1": OTHER}))
    assert exc.value.message == (
        "model demo-mlp-enc/1 was encrypted with a different key than keyring key 'k1'"
    )


def test_unknown_key_id_is_permission_denied() -> None:
    ring = Keyring.from_keys({"k2": KEY})
    with pytest.raises(PermissionDenied, match="key id 'k1' is not in keyring <memory>"):
        _dec(_enc(), ring)


# --- tampering -----------------------------------------------------------------------------------------


def _positions(blob: bytes) -> list[int]:
    h = read_header(blob)
    header = list(range(h.size))  # every header byte: magic, version, id length, id, check, nonce
    body = range(h.size, len(blob) - TAG_BYTES)
    ciphertext = [body[0], body[1], body[len(body) // 2], body[-1], *body[:: max(1, len(body) // 16)]]
    tag = list(range(len(blob) - TAG_BYTES, len(blob)))
    return sorted(set(header + ciphertext + tag))


@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
def test_every_sampled_byte_flip_fails_cleanly(mask: int) -> None:
    blob = _enc()
    nonce_start = read_header(blob).size - NONCE_BYTES
    for pos in _positions(blob):
        damaged = bytearray(blob)
        damaged[pos] ^= mask
        with pytest.raises((DataLoss, PermissionDenied)) as exc:
            _dec(bytes(damaged))
        if pos >= nonce_start:  # nonce, ciphertext and tag: authentication, not the key
            assert isinstance(exc.value, DataLoss), pos
            assert "failed authentication" in exc.value.message


def test_flipped_magic_and_format_version_say_what_is_wrong() -> None:
    blob = bytearray(_enc())
    blob[0] ^= 1
    with pytest.raises(DataLoss, match="bad magic"):
        _dec(bytes(blob))
    blob = bytearray(_enc())
    blob[len(MAGIC)] = 2
    with pytest.raises(DataLoss, match="unsupported format version 2"):
        _dec(bytes(blob))


def test_flipped_key_check_is_permission_denied() -> None:
    blob = bytearray(_enc())
    blob[read_header(blob).size - NONCE_BYTES - 1] ^= 1
    with pytest.raises(PermissionDenied, match="different key"):
        _dec(bytes(blob))


def test_truncation_is_data_loss() -> None:
    blob = _enc()
    for size in (
        0,
        3,
        len(MAGIC),
        len(MAGIC) + 2,
        read_header(blob).size,
        read_header(blob).size + TAG_BYTES - 1,
    ):
        with pytest.raises(DataLoss, match="truncated"):
            _dec(blob[:size])
    for cut in (1, TAG_BYTES, len(PLAIN)):
        with pytest.raises(DataLoss, match="failed authentication"):
            _dec(blob[:-cut])
    with pytest.raises(DataLoss):
        _dec(blob + b"\0")


def test_not_an_encrypted_file() -> None:
    with pytest.raises(DataLoss, match="not an mcpmesh encrypted file"):
        _dec(b"\x93NUMPY" + bytes(100))


@pytest.mark.parametrize(("model", "version"), [("demo-mlp", V), ("demo-mlp-enc2", V), (M, "2"), (M, "11")])
def test_copied_to_another_model_or_version_fails_authentication(model: str, version: str) -> None:
    with pytest.raises(DataLoss, match="belongs to another model or version"):
        _dec(_enc(), model=model, version=version)


def test_model_and_version_boundary_is_authenticated() -> None:
    # "a" + "\0" + "11" must not collide with another split; versions cannot hold '\0' anyway.
    blob = _enc(model="a1", version="1")
    with pytest.raises(DataLoss):
        _dec(blob, model="a", version="11")


# --- keyrings ---------------------------------------------------------------------------------------------


def _b64(key: bytes) -> str:
    return base64.b64encode(key).decode()


def test_keyring_load_json_and_yaml(tmp_path: Path) -> None:
    j = tmp_path / "ring.json"
    j.write_text(json.dumps({"keys": {"k1": _b64(KEY), "k2": _b64(OTHER)}}))
    y = tmp_path / "ring.yaml"
    y.write_text(f"keys:\n  k1: {_b64(KEY)}\n")
    for path in (j, y):
        path.chmod(0o600)
        ring = Keyring.load(path)
        assert ring.get("k1") == KEY and "k1" in ring
    assert Keyring.load(j).key_ids == ("k1", "k2")


SECRET = b"S3cr3tK3yMaterial-do-not-print!!"


@pytest.mark.parametrize(
    ("keys", "match"),
    [
        ({"k1": _b64(SECRET)[:-4]}, "'k1' decodes to 30 bytes"),
        ({"k1": _b64(SECRET + b"xx")}, "'k1' decodes to 34 bytes"),
        ({"k1": _b64(SECRET)[:-2] + "!!"}, "'k1' is not valid base64"),
        ({"k1": 12345}, "'k1' must be a base64 string"),
        ({"../k1": _b64(SECRET)}, "key id '../k1' is not valid"),
    ],
)
def test_keyring_errors_name_the_key_id_and_file_but_not_the_key(
    tmp_path: Path, keys: dict[str, object], match: str
) -> None:
    path = tmp_path / "ring.json"
    path.write_text(json.dumps({"keys": keys}))
    with pytest.raises(InvalidArgument, match=match) as exc:
        Keyring.load(path)
    text = str(exc.value)
    assert str(path) in text
    for secret in (SECRET.decode(), _b64(SECRET), _b64(SECRET)[:10], "12345"):
        assert secret not in text


def test_keyring_parse_errors_do_not_quote_the_file(tmp_path: Path) -> None:
    path = tmp_path / "ring.yaml"
    path.write_text(f'keys:\n  k1: "{_b64(SECRET)}\n  - [\n')
    with pytest.raises(InvalidArgument, match="neither valid JSON nor valid YAML") as exc:
        Keyring.load(path)
    assert _b64(SECRET)[:8] not in str(exc.value)
    path.write_text("[1, 2]")
    with pytest.raises(InvalidArgument, match="expected a mapping"):
        Keyring.load(path)
    with pytest.raises(NotFound):
        Keyring.load(tmp_path / "missing.json")


def test_keyring_warns_when_others_can_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "ring.json"
    write_keyring(path, {"k1": KEY})
    assert path.stat().st_mode & 0o777 == 0o600
    with caplog.at_level(logging.WARNING, logger="mcpcore.crypto"):
        Keyring.load(path)
        assert not caplog.records
        path.chmod(0o644)
        Keyring.load(path)
    assert "readable by group or others" in caplog.text
    assert _b64(KEY) not in caplog.text


def test_repr_and_str_hide_keys() -> None:
    ring = Keyring.from_keys({"k1": KEY, "k2": OTHER})
    for text in (repr(ring), str(ring), f"{ring}"):
        assert "k1" in text and "k2" in text
        for key in (KEY, OTHER):
            assert repr(key) not in text and _b64(key) not in text and key.hex() not in text


def test_from_keys_validates() -> None:
    with pytest.raises(InvalidArgument, match="must be 32 bytes, got 16"):
        Keyring.from_keys({"k1": KEY[:16]})
    with pytest.raises(InvalidArgument, match="not a valid name"):
        Keyring.from_keys({"a/b": KEY})


def test_generate_and_write_keyring_round_trip(tmp_path: Path) -> None:
    keys = {"a": generate_key(), "b": generate_key()}
    assert len(keys["a"]) == KEY_BYTES and keys["a"] != keys["b"]
    path = tmp_path / "ring.json"
    path.write_text("{}")
    path.chmod(0o644)
    write_keyring(path, keys)
    assert path.stat().st_mode & 0o777 == 0o600
    ring = Keyring.load(path)
    assert {k: ring.get(k) for k in ring.key_ids} == keys
    assert [p.name for p in tmp_path.iterdir()] == ["ring.json"]


# --- files ------------------------------------------------------------------------------------------------


def test_encrypt_and_decrypt_file_writes_no_plaintext(tmp_path: Path) -> None:
    src = tmp_path / "src" / "weights.bin"
    src.parent.mkdir()
    src.write_bytes(PLAIN)
    work = tmp_path / "work"
    work.mkdir()
    dst = work / "weights.bin.enc"
    encrypt_file(src, dst, key=KEY, key_id="k1", model=M, version=V)
    assert PLAIN[:16] not in dst.read_bytes()
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    cwd = Path.cwd()
    os.chdir(work)
    try:
        assert decrypt_file(dst, keyring=RING, model=M, version=V) == PLAIN
    finally:
        os.chdir(cwd)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before


def test_decrypt_file_errors(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="no such file"):
        decrypt_file(tmp_path / "nope.enc", keyring=RING, model=M, version=V)
    path = tmp_path / "w.enc"
    path.write_bytes(_enc()[:-1])
    with pytest.raises(DataLoss, match=str(path)):
        decrypt_file(path, keyring=RING, model=M, version=V)
    with pytest.raises(NotFound):
        encrypt_file(tmp_path / "missing", tmp_path / "out", key=KEY, key_id="k1", model=M, version=V)


def test_all_failures_are_mcp_errors() -> None:
    blob = _enc()
    for bad in (b"", MAGIC, blob[:20], blob[:-1], b"MCPENC\x01\xff" + bytes(400)):
        with pytest.raises(MCPError):
            _dec(bad)
