"""A model repository's published form: one ``manifest.json`` per model version, one ``index.json`` per
repository (what a remote repository needs: HTTP cannot list a folder, and every byte is checked).

``<repo>/<model>/<version>/manifest.json`` lists every file of that version directory::

    {
      "format": "mcpmesh-manifest/1",
      "model": "demo-mlp",
      "version": "1",
      "files": {
        "model.yaml": {"sha256": "<64 lowercase hex digits>", "size": 1412},
        "weights.safetensors": {"sha256": "...", "size": 83200}
      }
    }

``<repo>/index.json`` names the models and their versions (numeric order)::

    {"format": "mcpmesh-index/1", "models": {"demo-mlp": ["1", "2"], "demo-onnx": ["1", "2"]}}

``publish(DIR)`` (``python -m mcp_worker.repository publish DIR``) writes both for a folder; ``check(DIR)``
(``... check DIR``) says which files no longer match. ``tools/make_models.py`` writes them for the demo.

Invariants:
- A manifest is parsed as hostile input: at most ``MAX_MANIFEST_BYTES``, duplicate keys and unknown keys
  refused, every file name a plain name (no ``/``, no ``..``, no leading dot, so nothing can name a path
  outside its version directory), every digest 64 hex digits, every size an integer in ``[0, max]``, at
  most ``MAX_FILES`` files. A violation is ``InvalidArgument`` naming the manifest and the field.
- A manifest names the model and version it was written for: one at another place (a copied version
  directory) is not that version's manifest (``Manifest.describes``).
- Nothing here does network I/O; ``publish`` writes each file atomically (temporary file, then rename).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcpcore.atomic_files import atomic_write
from mcpcore.errors import InvalidArgument, NotFound, ResourceExhausted
from mcpcore.keys import NAME_RE, VERSION_RE

__all__ = [
    "FILE_NAME_RE",
    "INDEX",
    "INDEX_FORMAT",
    "MANIFEST",
    "MANIFEST_FORMAT",
    "MAX_FILES",
    "MAX_INDEX_BYTES",
    "MAX_MANIFEST_BYTES",
    "FileEntry",
    "Manifest",
    "check",
    "index_document",
    "manifest_document",
    "parse_index",
    "parse_manifest",
    "publish",
    "scan",
]

MANIFEST = "manifest.json"
INDEX = "index.json"
MANIFEST_FORMAT = "mcpmesh-manifest/1"
INDEX_FORMAT = "mcpmesh-index/1"
MAX_MANIFEST_BYTES = 1 << 20
MAX_INDEX_BYTES = 16 << 20
MAX_FILES = 1024
#: A file of a version directory: a plain name (no separator, no leading dot: never ``..``).
FILE_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_MODEL_YAML = "model.yaml"


@dataclass(frozen=True)
class FileEntry:
    name: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    model: str
    version: str
    files: Mapping[str, FileEntry]

    def describes(self, model: str, version: str) -> bool:
        return (self.model, self.version) == (model, version)


# --- reading ------------------------------------------------------------------------------------------------


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _json(raw: bytes, where: str, limit: int) -> Any:
    if len(raw) > limit:
        raise InvalidArgument(f"{where}: larger than {limit} bytes")
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise InvalidArgument(f"{where}: not valid JSON ({err})") from None


def _keys(doc: Any, where: str, required: set[str]) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise InvalidArgument(f"{where}: must be a JSON object")
    if set(doc) != required:
        missing, unknown = sorted(required - set(doc)), sorted(set(doc) - required)
        raise InvalidArgument(f"{where}: missing keys {missing}, unknown keys {unknown}")
    return doc


def parse_manifest(raw: bytes, *, where: str, max_file_bytes: int) -> Manifest:
    """Parse and validate a manifest's bytes; ``where`` (its URL or path) prefixes every error."""
    doc = _keys(_json(raw, where, MAX_MANIFEST_BYTES), where, {"format", "model", "version", "files"})
    if doc["format"] != MANIFEST_FORMAT:
        raise InvalidArgument(f"{where}: format must be {MANIFEST_FORMAT!r}, got {str(doc['format'])[:40]!r}")
    model, version, files = doc["model"], doc["version"], doc["files"]
    if not isinstance(model, str) or not NAME_RE.fullmatch(model):
        raise InvalidArgument(f"{where}: model: not a valid model name")
    if not isinstance(version, str) or not VERSION_RE.fullmatch(version):
        raise InvalidArgument(f"{where}: version: not a valid version")
    if not isinstance(files, dict) or not files:
        raise InvalidArgument(f"{where}: files: must be a non-empty object")
    if len(files) > MAX_FILES:
        raise InvalidArgument(f"{where}: files: {len(files)} entries, over the limit of {MAX_FILES}")
    entries: dict[str, FileEntry] = {}
    for name, given in files.items():
        if not FILE_NAME_RE.fullmatch(name):
            raise InvalidArgument(
                f"{where}: files: {name[:80]!r} is not a plain file name (no '/', no '..', no leading dot)"
            )
        at = f"{where}: files.{name}"
        spec = _keys(given, at, {"sha256", "size"})
        digest, size = spec["sha256"], spec["size"]
        if not isinstance(digest, str) or not _SHA256_RE.fullmatch(digest):
            raise InvalidArgument(f"{at}.sha256: must be 64 lowercase hex digits")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidArgument(f"{at}.size: must be an integer >= 0")
        if size > max_file_bytes:
            raise ResourceExhausted(
                f"{at}.size: {size} bytes, over this worker's limit of {max_file_bytes} for one file"
            )
        entries[name] = FileEntry(name, digest, size)
    return Manifest(model, version, entries)


def parse_index(raw: bytes, *, where: str) -> dict[str, list[str]]:
    """Parse and validate an index's bytes: ``{model: [versions in numeric order]}``."""
    doc = _keys(_json(raw, where, MAX_INDEX_BYTES), where, {"format", "models"})
    if doc["format"] != INDEX_FORMAT:
        raise InvalidArgument(f"{where}: format must be {INDEX_FORMAT!r}, got {str(doc['format'])[:40]!r}")
    models = doc["models"]
    if not isinstance(models, dict):
        raise InvalidArgument(f"{where}: models: must be an object of model name to versions")
    out: dict[str, list[str]] = {}
    for model, versions in models.items():
        if not NAME_RE.fullmatch(model):
            raise InvalidArgument(f"{where}: models: {model[:80]!r} is not a valid model name")
        ok = isinstance(versions, list) and all(
            isinstance(v, str) and VERSION_RE.fullmatch(v) for v in versions
        )
        if not ok or len(set(versions)) != len(versions):
            raise InvalidArgument(f"{where}: models.{model}: must be a list of distinct versions ('1', '2')")
        if versions:
            out[model] = sorted(versions, key=int)
    return out


# --- writing ------------------------------------------------------------------------------------------------


def manifest_document(model: str, version: str, files: Mapping[str, bytes]) -> bytes:
    """The manifest of a version whose files (by plain name) hold ``files``; deterministic bytes."""
    return _dump(
        {
            "format": MANIFEST_FORMAT,
            "model": model,
            "version": version,
            "files": {
                name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
                for name, data in sorted(files.items())
            },
        }
    )


def index_document(models: Mapping[str, list[str]]) -> bytes:
    ordered = {m: sorted(models[m], key=int) for m in sorted(models) if models[m]}
    return _dump({"format": INDEX_FORMAT, "models": ordered})


def _dump(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc, indent=2) + "\n").encode("utf-8")


def scan(root: str | Path) -> dict[str, list[str]]:
    """The folder's model versions: ``<model>/<version>/model.yaml`` with valid names, numeric order."""
    root = Path(root)
    if not root.is_dir():
        raise NotFound(f"model repository {root} does not exist or is not a directory")
    out: dict[str, list[str]] = {}
    for entry in sorted(root.iterdir()):
        if entry.is_dir() and NAME_RE.fullmatch(entry.name):
            versions = [
                d.name
                for d in entry.iterdir()
                if VERSION_RE.fullmatch(d.name) and (d / _MODEL_YAML).is_file()
            ]
            if versions:
                out[entry.name] = sorted(versions, key=int)
    return out


def _version_files(version_dir: Path) -> dict[str, Path]:
    """The files a manifest lists: regular files (or links to them) with plain names, but the manifest."""
    found = {
        p.name: p
        for p in sorted(version_dir.iterdir())
        if p.name != MANIFEST and FILE_NAME_RE.fullmatch(p.name) and p.is_file()
    }
    if len(found) > MAX_FILES:
        raise InvalidArgument(f"{version_dir}: {len(found)} files, over the manifest limit of {MAX_FILES}")
    return found


def _file_digest(path: Path) -> tuple[str, int]:
    h, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def publish(root: str | Path) -> dict[str, list[str]]:
    """(Re)write ``manifest.json`` for every model version of the folder ``root`` from the files it holds
    now, then ``index.json``; returns the index. Run it after any change to the folder, before a remote
    repository (a web server or bucket synced from it) serves it."""
    root = Path(root)
    models = scan(root)
    for model, versions in models.items():
        for version in versions:
            version_dir = root / model / version
            entries: dict[str, Any] = {}
            for name, path in _version_files(version_dir).items():
                digest, size = _file_digest(path)
                entries[name] = {"sha256": digest, "size": size}
            doc = {"format": MANIFEST_FORMAT, "model": model, "version": version, "files": entries}
            atomic_write(version_dir / MANIFEST, [_dump(doc)], 0o644)
    atomic_write(root / INDEX, [index_document(models)], 0o644)
    return models


def check(root: str | Path, *, max_file_bytes: int = 1 << 62) -> list[str]:
    """What in the folder ``root`` does not match its published form (empty: all of it does)."""
    root = Path(root)
    problems: list[str] = []
    models = scan(root)
    index_path = root / INDEX
    if not index_path.is_file():
        problems.append(f"{index_path}: missing")
    else:
        try:
            listed = parse_index(index_path.read_bytes(), where=str(index_path))
        except InvalidArgument as err:
            problems.append(err.message)
        else:
            if listed != models:
                problems.append(f"{index_path}: lists {listed}, the folder holds {models}")
    for model, versions in models.items():
        for version in versions:
            version_dir = root / model / version
            path = version_dir / MANIFEST
            if not path.is_file():
                problems.append(f"{path}: missing")
                continue
            try:
                manifest = parse_manifest(path.read_bytes(), where=str(path), max_file_bytes=max_file_bytes)
            except (InvalidArgument, ResourceExhausted) as err:
                problems.append(err.message)
                continue
            if not manifest.describes(model, version):
                problems.append(
                    f"{path}: written for {manifest.model}/{manifest.version} (a copied directory?)"
                )
                continue
            present = _version_files(version_dir)
            for name in sorted(set(present) - set(manifest.files)):
                problems.append(f"{version_dir / name}: not in the manifest")
            for name, entry in manifest.files.items():
                if name not in present:
                    problems.append(f"{version_dir / name}: in the manifest but missing")
                    continue
                digest, size = _file_digest(present[name])
                if (digest, size) != (entry.sha256, entry.size):
                    problems.append(
                        f"{version_dir / name}: sha256 {digest[:16]}... size {size}, the manifest says "
                        f"{entry.sha256[:16]}... size {entry.size}"
                    )
    return problems
