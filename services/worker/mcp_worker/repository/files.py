"""Reading and checking one version's files, local or cached: bounded reads, manifest checks, model.yaml
parsing and the weights (decrypted in memory only, with the worker's keyring).

Invariants: what is checked against a manifest is checked on the bytes used (model.yaml and plain weights
as read into memory; an encrypted file before it is decrypted, and GCM authenticates it too); every failure
is an ``MCPError`` naming the model, version and path or URL. A cached copy found changed raises ``Stale``:
the caller downloads it again.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from mcp_worker.repository.manifest import FileEntry, Manifest
from mcpcore.errors import (
    DataLoss,
    InvalidArgument,
    MCPError,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)
from mcpcore.keyring import Keyring
from mcpcore.model_encryption import MAGIC, open_encrypted
from mcpcore.model_yaml import parse_model_yaml
from mcpcore.modelspec import ModelConfig

__all__ = [
    "MAX_MODEL_YAML_BYTES",
    "MODEL_YAML",
    "Stale",
    "manifest_entry",
    "parse_yaml",
    "prefixed",
    "read_bounded",
    "read_weights",
    "verify",
    "verify_file",
    "yaml_entry",
]

MODEL_YAML = "model.yaml"
MAX_MODEL_YAML_BYTES = 1 << 20  # as mcpcore.model_yaml reads it


class Stale(Exception):
    """A cached copy changed or vanished under the worker: download it again."""


def manifest_entry(manifest: Manifest, name: str, manifest_at: str) -> FileEntry:
    entry = manifest.files.get(name)
    if entry is None:
        raise DataLoss(
            f"model {manifest.model}/{manifest.version}: {name} is not in its manifest {manifest_at}: "
            "republish the version (python -m mcp_worker.repository publish DIR)"
        )
    return entry


def yaml_entry(manifest: Manifest, manifest_at: str) -> FileEntry:
    entry = manifest_entry(manifest, MODEL_YAML, manifest_at)
    if entry.size > MAX_MODEL_YAML_BYTES:
        raise InvalidArgument(
            f"model.yaml {manifest.model}/{manifest.version}: {manifest_at} says {entry.size} bytes, "
            f"larger than {MAX_MODEL_YAML_BYTES}"
        )
    return entry


def parse_yaml(raw: bytes, manifest: Manifest, where: str) -> ModelConfig:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidArgument(
            f"model.yaml {manifest.model}/{manifest.version}: not UTF-8 ({where}): {err}"
        ) from None
    return parse_model_yaml(text, model=manifest.model, version=manifest.version)


def verify(raw: bytes | bytearray, entry: FileEntry, shown: str, *, local: bool) -> None:
    """``raw`` must be what ``entry`` says (a folder's file: ``DataLoss``; a cached one: ``Stale``)."""
    digest = hashlib.sha256(raw).hexdigest()
    if len(raw) == entry.size and digest == entry.sha256:
        return
    if not local:
        raise Stale
    raise DataLoss(
        f"{shown}: {len(raw)} bytes with sha256 {digest}, but its manifest says {entry.size} bytes with "
        f"sha256 {entry.sha256}: the file changed after the manifest was written; restore it, or rerun "
        "python -m mcp_worker.repository publish on the repository if the change is intended"
    )


def read_weights(
    config: ModelConfig,
    path: Path,
    shown: str,
    entry: FileEntry | None,
    *,
    keyring: Keyring | None,
    max_bytes: int,
    cached: bool = False,
) -> bytes:
    """The weights in ``path`` (shown as ``shown``), checked against ``entry`` when there is one, decrypted
    in memory with ``keyring`` when model.yaml says they are encrypted; at most ``max_bytes``."""
    where = f"model {config.name}/{config.version}"
    if not config.encrypted:
        try:
            raw = read_bounded(where, path, max_bytes, "weights", shown=shown)
        except NotFound:
            if cached:
                raise Stale from None
            raise
        if entry is not None:
            verify(raw, entry, shown, local=not cached)
        if raw.startswith(MAGIC):
            raise InvalidArgument(
                f"{where}: weights {shown} is an encrypted file but model.yaml does not say "
                "encrypted: true with its key_id"
            )
        return raw
    source = f"{where} ({shown})"
    if keyring is None:
        raise PermissionDenied(
            f"{where} is encrypted with key id {config.key_id!r} but this worker has no keyring configured"
        )
    if entry is not None:
        verify_file(path, entry, shown, where, cached=cached)
    # Streamed from the file: the ciphertext is never held whole next to the plaintext.
    with open_encrypted(path, source=source) as enc:
        if enc.size > max_bytes:
            raise ResourceExhausted(
                f"{where}: weights {shown} is {enc.size} bytes, over this worker's limit of {max_bytes}"
            )
        if enc.header.key_id != config.key_id:
            raise PermissionDenied(
                f"{source} is encrypted with key id {enc.header.key_id!r} but model.yaml declares "
                f"key_id {config.key_id!r}"
            )
        return enc.decrypt(keyring, model=config.name, version=config.version)


def verify_file(path: Path, entry: FileEntry, shown: str, where: str, *, cached: bool) -> None:
    h, size = hashlib.sha256(), 0
    try:
        with path.open("rb") as f:
            while size <= entry.size and (chunk := f.read(1 << 20)):
                h.update(chunk)
                size += len(chunk)
    except FileNotFoundError:
        if cached:
            raise Stale from None
        raise NotFound(f"{where}: weights file not found: {shown}") from None
    except OSError as err:
        raise PermissionDenied(f"{where}: weights {shown} is not readable by this worker: {err}") from None
    if size == entry.size and h.hexdigest() == entry.sha256:
        return
    if cached:
        raise Stale
    raise DataLoss(
        f"{shown}: does not match its manifest ({entry.size} bytes with sha256 {entry.sha256}): the "
        "file changed after the manifest was written; restore it, or rerun python -m "
        "mcp_worker.repository publish on the repository if the change is intended"
    )


def read_bounded(where: str, path: Path, limit: int, what: str, *, shown: str | None = None) -> bytes:
    shown = shown or str(path)
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            if size > limit:
                raise ResourceExhausted(
                    f"{where}: {what} {shown} is {size} bytes, over this worker's limit of {limit}"
                )
            f.seek(0)
            raw = f.read(limit + 1)  # the file may grow between seek and read
    except FileNotFoundError:
        raise NotFound(f"{where}: {what} file not found: {shown}") from None
    except IsADirectoryError:
        raise InvalidArgument(f"{where}: {what} {shown} is a directory, not a file") from None
    except PermissionError:
        raise PermissionDenied(f"{where}: {what} {shown} is not readable by this worker") from None
    if len(raw) > limit:
        raise ResourceExhausted(f"{where}: {what} {shown} is over this worker's limit of {limit} bytes")
    return raw


def prefixed(err: MCPError, where: str) -> MCPError:
    """The same kind of error with ``where`` (the model) in front of its message."""
    if err.message.startswith(where):
        return err
    out = type(err)(f"{where}: {err.message}")
    out.not_started = err.not_started
    return out
