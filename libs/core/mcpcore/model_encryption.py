"""Encrypted model files: chunked AES-256-GCM with the model name and version authenticated, streamed; the
keys come from a ``mcpcore.keyring.Keyring``.

File format 2, the one written (integers unsigned; the multi-byte ones big-endian)::

    offset  size  field
    0       6     magic b"MCPENC"
    6       1     format version (2)
    7       1     key id length n (1..128)
    8       n     key id, ASCII, a valid name (mcpcore.keys.NAME_RE)
    8+n     8     key check value: HMAC-SHA256(key, b"mcpmesh key check v1")[:8]
    16+n    7     nonce prefix (random per file)
    23+n    4     chunk size c (MIN_CHUNK_BYTES .. MAX_CHUNK_BYTES; the writer uses CHUNK_BYTES = 1 MiB)
    27+n    8     plaintext length L (0 .. MAX_PLAINTEXT_BYTES)
    35+n    ...   k = max(1, ceil(L / c)) chunks: chunk i (from 0) is the GCM ciphertext of plaintext bytes
                  i*c .. min((i+1)*c, L) followed by its 16-byte GCM tag (L == 0: one empty chunk, a tag)

The header is bytes 0 .. 35+n and the file is exactly 35 + n + L + 16k bytes. Chunk i is encrypted with the
nonce ``nonce prefix + i (4 bytes) + last (1 byte: 1 for chunk k-1, else 0)`` (the STREAM construction) and
the authenticated data ``header + model + b"\\0" + version``. So a truncated or extended file, reordered,
dropped or repeated chunks, a chunk taken from another file, a modified header (chunk size, length, nonce)
and a file copied under another model name or version all fail: the size disagrees with the header or a tag
does not verify. The 56-bit random prefix keeps nonces apart across files: for a million files under one
key, the chance that two share a prefix is about 2^-17.

Format 1 (legacy: read, no longer written): bytes 0 .. 16+n as above with version 1, then a 12-byte GCM
nonce (random per file) at 16+n; from 28+n the ciphertext of the whole plaintext (same length) and, in the
last 16 bytes, the GCM tag of one GCM message over the whole file, with the same authenticated data (its
header is bytes 0 .. 28+n).

Size limit: a plaintext of at most MAX_PLAINTEXT_BYTES (16 GiB) in either format, because a reader holds it
whole in memory (at the smallest chunk size that is 2^24 chunks, far from the 32-bit counter's end).
Encrypting a larger file is ``InvalidArgument``; a file whose header or size claims more is ``DataLoss``.

The key check value tells "the keyring holds a different key under this id" (``PermissionDenied``) apart
from "the file was modified" (``DataLoss``) without weakening GCM: it is a one-way function of the key.

Invariants:
- Key bytes never appear in a message, a log line or a ``repr``: errors name key ids and files only.
- Decryption happens in memory only; nothing here writes plaintext to disk. Nothing here unpickles.
- Streaming: a file is read a chunk at a time into one buffer of the plaintext's size, allocated only after
  the header was checked against the size limit and the file's actual size. Peak memory is the plaintext
  plus two chunks, never the ciphertext and the plaintext both whole. Encryption streams the same way.
- No plaintext is handed on before its tag verified: a format-2 chunk is decrypted into a scratch buffer and
  copied into the result only once its own tag verified; a format-1 result is returned only after its one
  tag verified. A failure anywhere raises, and no partial result escapes.
- Every failure is an ``MCPError`` naming the file: unknown key id or wrong key -> ``PermissionDenied``;
  bad magic, unsupported format version, a malformed header, a size that disagrees with the header, over
  the limit, or failed authentication -> ``DataLoss``; bad arguments to the writers -> ``InvalidArgument``.
"""

from __future__ import annotations

import hmac
import io
import os
import secrets
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path
from typing import Any, BinaryIO

from Crypto.Cipher import AES

from mcpcore.atomic_files import atomic_write
from mcpcore.errors import DataLoss, FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from mcpcore.keyring import KEY_BYTES, Keyring
from mcpcore.keys import NAME_RE, check_name, check_version

__all__ = [
    "CHUNK_BYTES",
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_CHUNK_BYTES",
    "MAX_PLAINTEXT_BYTES",
    "MIN_CHUNK_BYTES",
    "EncHeader",
    "EncryptedFile",
    "decrypt_file",
    "decrypt_model_bytes",
    "encrypt_file",
    "encrypt_model_bytes",
    "key_check_value",
    "open_encrypted",
    "read_header",
]

MAGIC = b"MCPENC"
FORMAT_VERSION = 2  # the version written; READ_VERSIONS are read
READ_VERSIONS = (1, 2)
NONCE_BYTES = 12
NONCE_PREFIX_BYTES = 7
TAG_BYTES = 16
KCV_BYTES = 8
MAX_KEY_ID_BYTES = 128
CHUNK_BYTES = 1 << 20
MIN_CHUNK_BYTES = 1 << 10
MAX_CHUNK_BYTES = 1 << 24
MAX_PLAINTEXT_BYTES = 1 << 34
_KCV_LABEL = b"mcpmesh key check v1"
_FIXED = len(MAGIC) + 2  # magic, format version, key id length
_V2_FIELDS = struct.Struct(">7sIQ")  # nonce prefix, chunk size, plaintext length
_TAIL = {1: KCV_BYTES + NONCE_BYTES, 2: KCV_BYTES + _V2_FIELDS.size}  # header bytes after the key id
_MAX_HEADER_BYTES = _FIXED + MAX_KEY_ID_BYTES + max(_TAIL.values())


def key_check_value(key: bytes) -> bytes:
    """A short one-way fingerprint of ``key``, stored in the header to recognise a wrong key."""
    return hmac.new(key, _KCV_LABEL, sha256).digest()[:KCV_BYTES]


# --- file format: header -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EncHeader:
    format_version: int
    key_id: str
    key_check: bytes
    nonce: bytes  # format 1: the GCM nonce; format 2: the per-file nonce prefix
    chunk_size: int | None  # format 2 only
    plaintext_size: int | None  # format 2 only (format 1: the file's size tells it)
    raw: bytes  # the header bytes exactly as stored (part of the authenticated data)

    @property
    def size(self) -> int:
        return len(self.raw)


def read_header(blob: bytes | memoryview, *, source: str = "encrypted file") -> EncHeader:
    """Parse and check the header at the start of ``blob``; ``source`` prefixes error messages.

    Every field is checked (magic, version, key id, chunk size, the plaintext length against the limit);
    whether the file's size fits the header is ``open_encrypted``'s check.
    """
    view = memoryview(blob)
    if len(view) < _FIXED:
        raise DataLoss(f"{source}: truncated: {len(view)} bytes is shorter than the header")
    if bytes(view[: len(MAGIC)]) != MAGIC:
        raise DataLoss(f"{source}: not an mcpmesh encrypted file (bad magic; expected {MAGIC!r})")
    fmt, kid_len = view[len(MAGIC)], view[len(MAGIC) + 1]
    if fmt not in READ_VERSIONS:
        raise DataLoss(f"{source}: unsupported format version {fmt} (this build reads 1 and 2)")
    if not 1 <= kid_len <= MAX_KEY_ID_BYTES:
        raise DataLoss(f"{source}: corrupt header: key id length {kid_len} is out of range 1..128")
    kcv_at = _FIXED + kid_len
    end = kcv_at + _TAIL[fmt]
    if len(view) < end:
        raise DataLoss(f"{source}: truncated: {len(view)} bytes is shorter than its {end}-byte header")
    try:
        key_id = bytes(view[_FIXED:kcv_at]).decode("ascii")
    except UnicodeDecodeError:
        key_id = ""
    if NAME_RE.fullmatch(key_id) is None:
        raise DataLoss(f"{source}: corrupt header: the key id is not a valid name")
    fields = bytes(view[kcv_at + KCV_BYTES : end])
    nonce, chunk_size, plaintext_size = (fields, None, None) if fmt == 1 else _v2_fields(fields, source)
    return EncHeader(
        format_version=fmt,
        key_id=key_id,
        key_check=bytes(view[kcv_at : kcv_at + KCV_BYTES]),
        nonce=nonce,
        chunk_size=chunk_size,
        plaintext_size=plaintext_size,
        raw=bytes(view[:end]),
    )


def _v2_fields(fields: bytes, source: str) -> tuple[bytes, int, int]:
    nonce_prefix, chunk_size, plaintext_size = _V2_FIELDS.unpack(fields)
    if not MIN_CHUNK_BYTES <= chunk_size <= MAX_CHUNK_BYTES:
        raise DataLoss(
            f"{source}: corrupt header: chunk size {chunk_size} is out of range "
            f"{MIN_CHUNK_BYTES}..{MAX_CHUNK_BYTES}"
        )
    _check_limit(plaintext_size, f"{source}: the header claims", DataLoss)
    return nonce_prefix, chunk_size, plaintext_size


def _check_limit(size: int, what: str, error: type[DataLoss] | type[InvalidArgument]) -> None:
    if size > MAX_PLAINTEXT_BYTES:
        raise error(
            f"{what} a plaintext of {size} bytes, over the encrypted-model format's limit of "
            f"{MAX_PLAINTEXT_BYTES} bytes (16 GiB)"
        )


def _pack_header(key_id: str, key: bytes, nonce_prefix: bytes, chunk_size: int, size: int) -> bytes:
    kid = key_id.encode("ascii")
    fields = _V2_FIELDS.pack(nonce_prefix, chunk_size, size)
    return MAGIC + bytes([FORMAT_VERSION, len(kid)]) + kid + key_check_value(key) + fields


def _chunk_count(size: int, chunk_size: int) -> int:
    return max(1, -(-size // chunk_size))


def _chunk_cipher(key: bytes, prefix: bytes, index: int, last: bool, aad: bytes) -> Any:
    nonce = prefix + struct.pack(">IB", index, last)
    cipher = AES.new(key, AES.MODE_GCM, nonce=nonce, mac_len=TAG_BYTES)
    cipher.update(aad)
    return cipher


def _aad(header: bytes, model: str, version: str) -> bytes:
    return header + model.encode("ascii") + b"\0" + version.encode("ascii")


def _reader(blob: bytes | memoryview) -> BinaryIO:
    # BytesIO shares a bytes object's buffer (no copy until written); other buffers are copied once.
    return io.BytesIO(blob if isinstance(blob, bytes) else bytes(blob))


def _fill(f: BinaryIO, view: memoryview) -> int:
    """Read into all of ``view`` unless the file ends first; the number of bytes read."""
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    return got


# --- file format: decryption -------------------------------------------------------------------------------


class EncryptedFile:
    """An open encrypted model file whose header was read and checked against the file's size."""

    __slots__ = ("_f", "header", "plaintext_size", "size", "source")

    def __init__(self, f: BinaryIO, size: int, source: str) -> None:
        self._f, self.size, self.source = f, size, source
        try:
            head = f.read(min(size, _MAX_HEADER_BYTES))
        except OSError as err:
            raise DataLoss(f"{source}: read failed: {err.strerror or err}") from None
        self.header = read_header(head, source=source)
        self.plaintext_size = self._plaintext_size()

    def __repr__(self) -> str:
        return f"EncryptedFile(source={self.source!r}, key_id={self.header.key_id!r}, size={self.size})"

    def _plaintext_size(self) -> int:
        h, size = self.header, self.size
        if h.format_version == 1:
            if size < h.size + TAG_BYTES:
                raise DataLoss(f"{self.source}: truncated: {size} bytes is shorter than header and tag")
            _check_limit(size - h.size - TAG_BYTES, f"{self.source}: holds", DataLoss)
            return size - h.size - TAG_BYTES
        assert h.plaintext_size is not None and h.chunk_size is not None  # format 2
        expected = h.size + h.plaintext_size + TAG_BYTES * _chunk_count(h.plaintext_size, h.chunk_size)
        if size != expected:
            raise DataLoss(
                f"{self.source}: {'truncated' if size < expected else 'extended'}: the header describes "
                f"{h.plaintext_size} plaintext bytes in chunks of {h.chunk_size}, a file of {expected} "
                f"bytes, but the file is {size} bytes"
            )
        return h.plaintext_size

    def decrypt(self, keyring: Keyring, *, model: str, version: str) -> bytearray:
        """Check the key and decrypt the whole file for ``model``/``version``; only verified plaintext."""
        check_name(model, "model name")
        check_version(version)
        key = keyring.get(self.header.key_id)
        if not hmac.compare_digest(key_check_value(key), self.header.key_check):
            raise PermissionDenied(
                f"{self.source} was encrypted with a different key than keyring key {self.header.key_id!r}"
            )
        aad = _aad(self.header.raw, model, version)
        out = bytearray(self.plaintext_size)
        try:
            self._f.seek(self.header.size)
            if self.header.format_version == 1:
                self._decrypt_whole(key, aad, memoryview(out))
            else:
                self._decrypt_chunks(key, aad, memoryview(out))
        except OSError as err:
            raise DataLoss(f"{self.source}: read failed: {err.strerror or err}") from None
        return out

    def _read(self, view: memoryview) -> None:
        if _fill(self._f, view) != len(view):
            raise DataLoss(f"{self.source}: truncated while it was being read")

    def _auth_failed(self, where: str = "") -> DataLoss:
        return DataLoss(
            f"{self.source} failed authentication{where}: the file was modified, or it belongs to another "
            "model or version"
        )

    def _decrypt_chunks(self, key: bytes, aad: bytes, out: memoryview) -> None:
        total, chunk = len(out), self.header.chunk_size
        assert chunk is not None  # format 2
        count = _chunk_count(total, chunk)
        sealed = memoryview(bytearray(min(chunk, total) + TAG_BYTES))
        opened = memoryview(bytearray(min(chunk, total)))
        for i in range(count):
            start = i * chunk
            n = min(chunk, total - start)
            self._read(sealed[: n + TAG_BYTES])
            cipher = _chunk_cipher(key, self.header.nonce, i, i == count - 1, aad)
            cipher.decrypt(sealed[:n], output=opened[:n])
            try:
                cipher.verify(sealed[n : n + TAG_BYTES])
            except ValueError:
                raise self._auth_failed(f" (chunk {i + 1} of {count})") from None
            out[start : start + n] = opened[:n]  # verified: only now is it part of the result

    def _decrypt_whole(self, key: bytes, aad: bytes, out: memoryview) -> None:
        # Format 1 is one GCM message: the plaintext fills the result (never returned) before the one tag.
        cipher = AES.new(key, AES.MODE_GCM, nonce=self.header.nonce, mac_len=TAG_BYTES)
        cipher.update(aad)
        sealed = memoryview(bytearray(min(CHUNK_BYTES, len(out))))
        for start in range(0, len(out), CHUNK_BYTES):
            n = min(CHUNK_BYTES, len(out) - start)
            self._read(sealed[:n])
            cipher.decrypt(sealed[:n], output=out[start : start + n])
        tag = memoryview(bytearray(TAG_BYTES))
        self._read(tag)
        try:
            cipher.verify(tag)
        except ValueError:
            raise self._auth_failed() from None


def _open_for_reading(path: Path, where: str) -> BinaryIO:
    """``path`` opened to read, or the MCPError that says why not, naming ``where``."""
    try:
        return path.open("rb")
    except FileNotFoundError:
        raise NotFound(f"{where}: no such file") from None
    except IsADirectoryError:
        raise InvalidArgument(f"{where}: is a directory, not a file") from None
    except OSError as err:
        raise PermissionDenied(f"{where}: cannot read: {err.strerror or err}") from None


@contextmanager
def open_encrypted(path: str | Path, *, source: str | None = None) -> Iterator[EncryptedFile]:
    """Open ``path`` and check its header against its size (nothing is decrypted or allocated yet)."""
    path = Path(path)
    where = source or f"encrypted file {path}"
    with _open_for_reading(path, where) as f:
        yield EncryptedFile(f, os.fstat(f.fileno()).st_size, where)


def decrypt_file(
    path: str | Path, *, keyring: Keyring, model: str, version: str, source: str | None = None
) -> bytearray:
    """Decrypt ``path`` for ``model``/``version``, streamed, in memory; the plaintext is written nowhere."""
    with open_encrypted(path, source=source or f"model {model}/{version} ({path})") as enc:
        return enc.decrypt(keyring, model=model, version=version)


def decrypt_model_bytes(
    blob: bytes | memoryview, *, keyring: Keyring, model: str, version: str, source: str | None = None
) -> bytearray:
    """Check and decrypt an encrypted model file's bytes, in memory, for ``model``/``version``."""
    check_name(model, "model name")
    check_version(version)
    enc = EncryptedFile(_reader(blob), memoryview(blob).nbytes, source or f"model {model}/{version}")
    return enc.decrypt(keyring, model=model, version=version)


# --- file format: encryption -------------------------------------------------------------------------------


def _check_encrypt_args(key: bytes, key_id: str, model: str, version: str, chunk_size: int) -> None:
    check_name(model, "model name")
    check_version(version)
    check_name(key_id, "key id")
    if not isinstance(key, bytes) or len(key) != KEY_BYTES:
        raise InvalidArgument(f"key {key_id!r} must be {KEY_BYTES} bytes")
    if not MIN_CHUNK_BYTES <= chunk_size <= MAX_CHUNK_BYTES:
        raise InvalidArgument(f"chunk size {chunk_size} is out of range {MIN_CHUNK_BYTES}..{MAX_CHUNK_BYTES}")


def _sealed(
    src: BinaryIO,
    size: int,
    where: str,
    *,
    key: bytes,
    key_id: str,
    model: str,
    version: str,
    chunk_size: int,
) -> Iterator[bytes]:
    """The format-2 file for the ``size`` bytes read from ``src``, piece by piece (one chunk in memory)."""
    header = _pack_header(key_id, key, secrets.token_bytes(NONCE_PREFIX_BYTES), chunk_size, size)
    prefix = header[-_V2_FIELDS.size :][:NONCE_PREFIX_BYTES]
    aad = _aad(header, model, version)
    yield header
    count = _chunk_count(size, chunk_size)
    buf = memoryview(bytearray(min(chunk_size, size)))
    for i in range(count):
        n = min(chunk_size, size - i * chunk_size)
        if _fill(src, buf[:n]) != n:
            raise FailedPrecondition(f"{where} shrank while it was being encrypted: try again")
        yield from _chunk_cipher(key, prefix, i, i == count - 1, aad).encrypt_and_digest(buf[:n])
    if src.read(1):
        raise FailedPrecondition(f"{where} grew while it was being encrypted: try again")


def encrypt_model_bytes(
    plaintext: bytes | memoryview,
    *,
    key: bytes,
    key_id: str,
    model: str,
    version: str,
    chunk_size: int = CHUNK_BYTES,
) -> bytes:
    """Encrypt one model file's bytes (format 2) for ``model``/``version`` under ``key`` (``key_id``)."""
    _check_encrypt_args(key, key_id, model, version, chunk_size)
    view = memoryview(plaintext)
    _check_limit(view.nbytes, "cannot encrypt", InvalidArgument)
    src = _reader(plaintext)
    args = {"key": key, "key_id": key_id, "model": model, "version": version, "chunk_size": chunk_size}
    return b"".join(_sealed(src, view.nbytes, "the plaintext", **args))


def encrypt_file(
    src: str | Path,
    dst: str | Path,
    *,
    key: bytes,
    key_id: str,
    model: str,
    version: str,
    chunk_size: int = CHUNK_BYTES,
) -> None:
    """Encrypt file ``src`` into ``dst`` (format 2, streamed, written atomically; ``src`` is left alone)."""
    src, dst = Path(src), Path(dst)
    _check_encrypt_args(key, key_id, model, version, chunk_size)
    with _open_for_reading(src, str(src)) as f:
        size = os.fstat(f.fileno()).st_size
        _check_limit(size, f"cannot encrypt {src}: it holds", InvalidArgument)
        args = {"key": key, "key_id": key_id, "model": model, "version": version, "chunk_size": chunk_size}
        atomic_write(dst, _sealed(f, size, str(src), **args), 0o644)
