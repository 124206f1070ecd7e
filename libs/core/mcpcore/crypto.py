"""Encrypted model files: AES-256-GCM with the model name and version authenticated, keys from a keyring.

File format (format version 1; all integers are single unsigned bytes)::

    offset  size  field
    0       6     magic b"MCPENC"
    6       1     format version (1)
    7       1     key id length n (1..128)
    8       n     key id, ASCII, a valid name (mcpcore.keys.NAME_RE)
    8+n     8     key check value: HMAC-SHA256(key, b"mcpmesh key check v1")[:8]
    16+n    12    GCM nonce (random per file)
    28+n    ...   ciphertext (same length as the plaintext)
    end-16  16    GCM tag

The header is bytes 0 .. 28+n. The GCM authenticated data is ``header + model + b"\\0" + version``, so a
modified header, or a ciphertext copied under another model name or version, fails authentication. The key
check value tells "the keyring holds a different key under this id" (``PermissionDenied``) apart from
"the file was modified" (``DataLoss``) without weakening GCM: it is a one-way function of the key.

Invariants:
- Key bytes never appear in a message, a log line or a ``repr``: errors name key ids and files only.
- Decryption happens in memory only; nothing here writes plaintext to disk. Nothing here unpickles.
- Every failure is an ``MCPError``: unknown key id or wrong key -> ``PermissionDenied``; bad magic,
  unsupported format version, truncation or failed authentication -> ``DataLoss``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
import os
import secrets
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path
from typing import Any

import yaml
from Crypto.Cipher import AES

from mcpcore.errors import DataLoss, InvalidArgument, NotFound, PermissionDenied
from mcpcore.keys import NAME_RE, check_name, check_version

__all__ = [
    "FORMAT_VERSION",
    "KEY_BYTES",
    "MAGIC",
    "EncHeader",
    "Keyring",
    "decrypt_file",
    "decrypt_model_bytes",
    "encrypt_file",
    "encrypt_model_bytes",
    "generate_key",
    "key_check_value",
    "read_header",
    "write_keyring",
]

log = logging.getLogger(__name__)

MAGIC = b"MCPENC"
FORMAT_VERSION = 1
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
KCV_BYTES = 8
_KCV_LABEL = b"mcpmesh key check v1"
_MAX_KEYRING_BYTES = 1 << 20


def key_check_value(key: bytes) -> bytes:
    """A short one-way fingerprint of ``key``, stored in the header to recognise a wrong key."""
    return hmac.new(key, _KCV_LABEL, sha256).digest()[:KCV_BYTES]


def generate_key() -> bytes:
    """A fresh random AES-256 key."""
    return secrets.token_bytes(KEY_BYTES)


# --- keyring -----------------------------------------------------------------------------------------------


class Keyring:
    """Key id -> 32-byte key. Built by ``load`` (a file) or ``from_keys`` (tests); never shows its keys."""

    __slots__ = ("_keys", "path")

    def __init__(self, keys: Mapping[str, bytes], path: str = "<memory>") -> None:
        self.path = str(path)
        self._keys: dict[str, bytes] = {}
        for key_id, key in keys.items():
            if not isinstance(key_id, str) or NAME_RE.fullmatch(key_id) is None:
                raise InvalidArgument(f"keyring {self.path}: key id {key_id!r} is not a valid name")
            if not isinstance(key, bytes) or len(key) != KEY_BYTES:
                size = len(key) if isinstance(key, bytes) else type(key).__name__
                raise InvalidArgument(
                    f"keyring {self.path}: key {key_id!r} must be {KEY_BYTES} bytes, got {size}"
                )
            self._keys[key_id] = key

    @classmethod
    def from_keys(cls, keys: Mapping[str, bytes]) -> Keyring:
        return cls(keys)

    @classmethod
    def load(cls, path: str | Path) -> Keyring:
        """Read ``{"keys": {"<key id>": "<base64 of 32 bytes>"}}`` (JSON or YAML) from ``path``."""
        path = Path(path)
        try:
            with path.open("rb") as f:
                mode = os.fstat(f.fileno()).st_mode
                raw = f.read(_MAX_KEYRING_BYTES + 1)
        except FileNotFoundError:
            raise NotFound(f"keyring {path}: no such file") from None
        except OSError as err:
            raise PermissionDenied(f"keyring {path}: cannot read: {err.strerror}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning(
                "keyring %s is readable by group or others (mode %o): chmod 600 it", path, mode & 0o777
            )
        if len(raw) > _MAX_KEYRING_BYTES:
            raise InvalidArgument(f"keyring {path}: larger than {_MAX_KEYRING_BYTES} bytes")
        return cls(_decode_keys(_parse_keyring(raw, path), path), str(path))

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(sorted(self._keys))

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def get(self, key_id: str) -> bytes:
        try:
            return self._keys[key_id]
        except KeyError:
            raise PermissionDenied(f"key id {key_id!r} is not in keyring {self.path}") from None

    def __repr__(self) -> str:
        return f"Keyring(path={self.path!r}, key_ids={list(self.key_ids)!r})"

    __str__ = __repr__


def _parse_keyring(raw: bytes, path: Path) -> Any:
    # Parser messages can quote the offending line, which may hold key material: report positions only.
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(f"keyring {path}: not UTF-8") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" near line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise InvalidArgument(f"keyring {path}: neither valid JSON nor valid YAML{where}") from None


def _decode_keys(data: Any, path: Path) -> dict[str, bytes]:
    if not isinstance(data, Mapping) or not isinstance(data.get("keys"), Mapping):
        raise InvalidArgument(f'keyring {path}: expected a mapping {{"keys": {{"<key id>": "<base64>"}}}}')
    keys: dict[str, bytes] = {}
    for key_id, value in data["keys"].items():
        if not isinstance(key_id, str) or NAME_RE.fullmatch(key_id) is None:
            raise InvalidArgument(
                f"keyring {path}: key id {key_id!r} is not valid: use letters, digits, '_', '.' or '-'"
            )
        if not isinstance(value, str):
            raise InvalidArgument(
                f"keyring {path}: key {key_id!r} must be a base64 string, got {type(value).__name__}"
            )
        try:
            key = base64.b64decode(value.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise InvalidArgument(f"keyring {path}: key {key_id!r} is not valid base64") from None
        if len(key) != KEY_BYTES:
            raise InvalidArgument(
                f"keyring {path}: key {key_id!r} decodes to {len(key)} bytes; AES-256 needs {KEY_BYTES}"
            )
        keys[key_id] = key
    return keys


def write_keyring(path: str | Path, keys: Mapping[str, bytes]) -> None:
    """Write ``keys`` as a JSON keyring readable by its owner only (mode 0600), replacing ``path``."""
    path = Path(path)
    Keyring(keys, str(path))  # validates ids and sizes
    doc = {"keys": {k: base64.b64encode(v).decode("ascii") for k, v in keys.items()}}
    _atomic_write(path, (json.dumps(doc, indent=2) + "\n").encode("ascii"), 0o600)


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --- file format -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EncHeader:
    format_version: int
    key_id: str
    key_check: bytes
    nonce: bytes
    raw: bytes  # the header bytes exactly as stored (part of the authenticated data)

    @property
    def size(self) -> int:
        return len(self.raw)


def _pack_header(key_id: str, key: bytes, nonce: bytes) -> bytes:
    kid = key_id.encode("ascii")
    return MAGIC + bytes([FORMAT_VERSION, len(kid)]) + kid + key_check_value(key) + nonce


def read_header(blob: bytes | memoryview, *, source: str = "encrypted file") -> EncHeader:
    """Parse and check the header of an encrypted file; ``source`` prefixes error messages."""
    view = memoryview(blob)
    fixed = len(MAGIC) + 2
    if len(view) < fixed:
        raise DataLoss(f"{source}: truncated: {len(view)} bytes is shorter than the header")
    if bytes(view[: len(MAGIC)]) != MAGIC:
        raise DataLoss(f"{source}: not an mcpmesh encrypted file (bad magic; expected {MAGIC!r})")
    fmt, kid_len = view[len(MAGIC)], view[len(MAGIC) + 1]
    if fmt != FORMAT_VERSION:
        raise DataLoss(f"{source}: unsupported format version {fmt} (this build reads {FORMAT_VERSION})")
    end = fixed + kid_len + KCV_BYTES + NONCE_BYTES
    if len(view) < end + TAG_BYTES:
        raise DataLoss(f"{source}: truncated: {len(view)} bytes is shorter than header and tag")
    try:
        key_id = bytes(view[fixed : fixed + kid_len]).decode("ascii")
    except UnicodeDecodeError:
        key_id = ""
    if NAME_RE.fullmatch(key_id) is None:
        raise DataLoss(f"{source}: corrupt header: the key id is not a valid name")
    kcv_at = fixed + kid_len
    return EncHeader(
        format_version=fmt,
        key_id=key_id,
        key_check=bytes(view[kcv_at : kcv_at + KCV_BYTES]),
        nonce=bytes(view[kcv_at + KCV_BYTES : end]),
        raw=bytes(view[:end]),
    )


def _aad(header: bytes, model: str, version: str) -> bytes:
    return header + model.encode("ascii") + b"\0" + version.encode("ascii")


def encrypt_model_bytes(plaintext: bytes, *, key: bytes, key_id: str, model: str, version: str) -> bytes:
    """Encrypt one model file's bytes for ``model``/``version`` under ``key`` (known as ``key_id``)."""
    check_name(model, "model name")
    check_version(version)
    check_name(key_id, "key id")
    if not isinstance(key, bytes) or len(key) != KEY_BYTES:
        raise InvalidArgument(f"key {key_id!r} must be {KEY_BYTES} bytes")
    header = _pack_header(key_id, key, secrets.token_bytes(NONCE_BYTES))
    nonce = header[-NONCE_BYTES:]
    cipher = AES.new(key, AES.MODE_GCM, nonce=nonce, mac_len=TAG_BYTES)
    cipher.update(_aad(header, model, version))
    ciphertext, tag = cipher.encrypt_and_digest(plaintext)
    return b"".join((header, ciphertext, tag))


def decrypt_model_bytes(
    blob: bytes | memoryview, *, keyring: Keyring, model: str, version: str, source: str | None = None
) -> bytes:
    """Check and decrypt an encrypted model file's bytes, in memory, for ``model``/``version``."""
    check_name(model, "model name")
    check_version(version)
    where = source or f"model {model}/{version}"
    header = read_header(blob, source=where)
    key = keyring.get(header.key_id)
    if not hmac.compare_digest(key_check_value(key), header.key_check):
        raise PermissionDenied(
            f"{where} was encrypted with a different key than keyring key {header.key_id!r}"
        )
    view = memoryview(blob)
    cipher = AES.new(key, AES.MODE_GCM, nonce=header.nonce, mac_len=TAG_BYTES)
    cipher.update(_aad(header.raw, model, version))
    try:
        return cipher.decrypt_and_verify(view[header.size : -TAG_BYTES], view[-TAG_BYTES:])
    except ValueError:
        raise DataLoss(
            f"{where} failed authentication: the file was modified, or it belongs to another model or version"
        ) from None


def encrypt_file(
    src: str | Path, dst: str | Path, *, key: bytes, key_id: str, model: str, version: str
) -> None:
    """Encrypt file ``src`` into ``dst`` (written atomically; ``src`` is left alone)."""
    src, dst = Path(src), Path(dst)
    try:
        plaintext = src.read_bytes()
    except FileNotFoundError:
        raise NotFound(f"no such file: {src}") from None
    blob = encrypt_model_bytes(plaintext, key=key, key_id=key_id, model=model, version=version)
    _atomic_write(dst, blob, 0o644)


def decrypt_file(path: str | Path, *, keyring: Keyring, model: str, version: str) -> bytes:
    """Read and decrypt ``path`` in memory; the plaintext is returned, never written anywhere."""
    path = Path(path)
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        raise NotFound(f"model {model}/{version}: no such file: {path}") from None
    return decrypt_model_bytes(
        blob, keyring=keyring, model=model, version=version, source=f"model {model}/{version} ({path})"
    )
