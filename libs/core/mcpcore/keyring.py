"""The keyring: key id -> 32-byte AES-256 key, read from a file an operator keeps (JSON or YAML).

Format: ``{"keys": {"<key id>": "<base64 of 32 bytes>"}}``; a key id is a valid name (mcpcore.keys.NAME_RE).

Invariants:
- Key bytes never appear in a message, a log line or a ``repr``: errors name key ids and files only, and
  parser messages, which can quote the offending line, are reduced to a position.
- A keyring readable by group or others loads, with a warning to chmod 600 it; ``write_keyring`` writes
  one readable by its owner only (mode 0600), replacing the file whole.
- A missing file is ``NotFound``, an unreadable one ``PermissionDenied``, a malformed one (over 1 MiB, not
  UTF-8, neither JSON nor YAML, a bad id, not base64, not 32 bytes) ``InvalidArgument``; an id not in the
  keyring is ``PermissionDenied``.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from mcpcore.atomic_files import atomic_write
from mcpcore.errors import InvalidArgument, NotFound, PermissionDenied
from mcpcore.keys import NAME_RE

__all__ = ["KEY_BYTES", "Keyring", "generate_key", "write_keyring"]

log = logging.getLogger(__name__)

KEY_BYTES = 32
_MAX_KEYRING_BYTES = 1 << 20


def generate_key() -> bytes:
    """A fresh random AES-256 key."""
    return secrets.token_bytes(KEY_BYTES)


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
    atomic_write(path, [(json.dumps(doc, indent=2) + "\n").encode("ascii")], 0o600)
