"""The model repository: ``<repo>/<model>/<version>/model.yaml`` plus the weights file it names, in a folder
or behind a URL.

Where it is (``MCP_WORKER_REPOSITORY``):
- a folder (``models``, ``/srv/models``, ``file:///srv/models``): listed by its directories; a version's
  ``manifest.json`` (``manifest``), when it has one written for it, is checked on every load;
- ``http://`` / ``https://`` base URL, or ``s3://bucket/prefix`` (``sources``, ``cache``): listed by
  ``<repo>/index.json``; a version must have its ``manifest.json`` and every file read must be in it with
  the right size and sha256. Files are downloaded once into the worker's content-addressed cache
  (``repository_cache``, at most ``repository_cache_bytes``) and read from there.

``python -m mcp_worker.repository publish DIR`` (``cli``) writes the manifests and the index of a folder
(``check DIR`` says what no longer matches, ``list LOCATION`` lists any repository).

Invariants:
- Model and version names are validated (``mcpcore.keys``) before any path or URL is built, and every file
  name is a plain name (``modelspec`` checks the weights name, ``manifest`` every listed name), so no
  request can reach outside ``<repo>``.
- Encrypted weights are decrypted in memory only, with the worker's keyring; the file's key id must be the
  one model.yaml declares. No plaintext is written (the cache holds what the repository holds: encrypted
  files stay encrypted), nothing is unpickled, no model is executed here.
- What is checked against a manifest is checked on the bytes used: model.yaml and plain weights are hashed
  as read into memory; an encrypted file is hashed before it is decrypted (and GCM authenticates it too).
- Every failure is an ``MCPError`` naming the model, version and path or URL: a missing model or file is
  ``NotFound``, an oversized weights file ``ResourceExhausted``, a missing or wrong key or refused access
  ``PermissionDenied``, a damaged file or one that does not match its manifest ``DataLoss``, an
  unreachable repository ``Unavailable``. Credentials (in a URL, AWS's) are never part of a message.
"""

from __future__ import annotations

import hashlib
import logging
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from mcp_worker.repository.cache import ContentCache
from mcp_worker.repository.files import (
    MAX_MODEL_YAML_BYTES,
    MODEL_YAML,
    Stale,
    manifest_entry,
    parse_yaml,
    prefixed,
    read_bounded,
    read_weights,
    verify,
    yaml_entry,
)
from mcp_worker.repository.manifest import (
    INDEX,
    MANIFEST,
    MAX_INDEX_BYTES,
    MAX_MANIFEST_BYTES,
    FileEntry,
    Manifest,
    parse_index,
    parse_manifest,
    scan,
)
from mcp_worker.repository.sources import DEFAULT_TIMEOUT_S, Source, open_source
from mcpcore.errors import (
    DataLoss,
    InvalidArgument,
    MCPError,
    NotFound,
)
from mcpcore.keyring import Keyring
from mcpcore.keys import VERSION_RE, check_name, check_version
from mcpcore.model_yaml import load_model_yaml
from mcpcore.modelspec import ModelConfig

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_CACHE_DIR",
    "DEFAULT_MAX_WEIGHTS_BYTES",
    "ModelArtifact",
    "ModelRepository",
    "is_remote",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_WEIGHTS_BYTES = 4 << 30
DEFAULT_CACHE_DIR = ".run/model-cache"
DEFAULT_CACHE_BYTES = 10 << 30
_REMOTE_SCHEMES = ("http", "https", "s3")
T = TypeVar("T")


@dataclass(frozen=True)
class ModelArtifact:
    """One loaded model version: its validated config and its weights (plaintext, or None without any)."""

    config: ModelConfig
    weights: bytes | None = field(repr=False)
    #: The version directory of a folder repository (a ``fail`` layer's ratio file lives there); None for
    #: a remote one.
    path: Path | None


def is_remote(location: str | Path) -> bool:
    """Whether ``location`` is an http(s):// or s3:// repository (a ``Path`` is always a folder)."""
    if isinstance(location, Path):
        return False
    return urllib.parse.urlsplit(location).scheme.lower() in _REMOTE_SCHEMES


def _folder(location: str | Path) -> Path:
    if isinstance(location, str) and location.lower().startswith("file:"):
        parts = urllib.parse.urlsplit(location)
        if parts.netloc not in ("", "localhost"):
            raise InvalidArgument(f"repository {location}: a file:// URL names a local folder (no host)")
        return Path(urllib.request.url2pathname(parts.path))
    return Path(location)


class ModelRepository:
    """Reads model versions from one repository (a folder, or a URL with a local cache); holds no state
    besides its settings and the cache's files."""

    def __init__(
        self,
        root: str | Path,
        keyring: Keyring | None = None,
        *,
        max_weights_bytes: int = DEFAULT_MAX_WEIGHTS_BYTES,
        cache_dir: str | Path = DEFAULT_CACHE_DIR,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.keyring = keyring
        self.max_weights_bytes = max_weights_bytes
        self.source: Source | None = None
        self.cache: ContentCache | None = None
        self.root: Path | None = None
        if is_remote(root):
            self.source = open_source(str(root), timeout_s=timeout_s)
            self.cache = ContentCache(cache_dir, cache_bytes)
            self.location = self.source.location
        else:
            self.root = _folder(root)
            self.location = str(self.root)

    def __repr__(self) -> str:
        return f"ModelRepository({self.location!r}, keyring={self.keyring!r})"

    # -- listing ----------------------------------------------------------------------------------------

    def index(self) -> dict[str, list[str]]:
        """Every model with at least one version, mapped to its versions in numeric order."""
        if self.source is None:
            assert self.root is not None
            return scan(self.root)
        raw = self._fetch_small(INDEX, MAX_INDEX_BYTES, f"model repository {self.location}")
        return parse_index(raw, where=self.source.url(INDEX))

    def versions(self, model: str) -> list[str]:
        """The model's versions in numeric order; ``NotFound`` when it has none here."""
        check_name(model, "model name")
        if self.source is None:
            assert self.root is not None
            model_dir = self.root / model
            versions = self._versions_in(model_dir) if model_dir.is_dir() else []
        else:
            versions = self.index().get(model, [])
        if not versions:
            raise NotFound(f"model {model!r} has no versions in repository {self.location}")
        return versions

    def latest(self, model: str) -> str:
        return self.versions(model)[-1]

    @staticmethod
    def _versions_in(model_dir: Path) -> list[str]:
        found = [
            d.name for d in model_dir.iterdir() if VERSION_RE.fullmatch(d.name) and (d / MODEL_YAML).is_file()
        ]
        return sorted(found, key=int)

    # -- loading ----------------------------------------------------------------------------------------

    def config(self, model: str, version: str) -> ModelConfig:
        """Read and validate one version's model.yaml only (cheap: no weights are read)."""
        if self.source is not None:
            manifest = self._remote_manifest(model, version)
            return self._remote_config(manifest)
        version_dir = self._version_dir(model, version)
        manifest = self._local_manifest(version_dir, model, version)
        if manifest is None:
            return load_model_yaml(version_dir / MODEL_YAML)
        return self._local_config(version_dir, manifest)

    def load(self, model: str, version: str) -> ModelArtifact:
        """Read, validate and (if encrypted) decrypt one model version. Runs nothing."""
        if self.source is not None:
            return self._remote_load(model, version)
        version_dir = self._version_dir(model, version)
        manifest = self._local_manifest(version_dir, model, version)
        if manifest is None:
            config = load_model_yaml(version_dir / MODEL_YAML)
            weights = None
            if config.weights is not None:
                path = version_dir / config.weights
                weights = self._read_weights(config, path, str(path), None)
            return ModelArtifact(config=config, weights=weights, path=version_dir)
        config = self._local_config(version_dir, manifest)
        weights = None
        if config.weights is not None:
            path = version_dir / config.weights
            entry = manifest_entry(manifest, config.weights, str(version_dir / MANIFEST))
            weights = self._read_weights(config, path, str(path), entry)
        return ModelArtifact(config=config, weights=weights, path=version_dir)

    # -- a folder ---------------------------------------------------------------------------------------

    def _version_dir(self, model: str, version: str) -> Path:
        check_name(model, "model name")
        check_version(version)
        assert self.root is not None
        version_dir = self.root / model / version
        if not version_dir.is_dir():
            raise NotFound(f"model {model}/{version} is not in repository {self.root} (no {version_dir})")
        return version_dir

    def _local_manifest(self, version_dir: Path, model: str, version: str) -> Manifest | None:
        path = version_dir / MANIFEST
        try:
            raw = read_bounded(f"model {model}/{version}", path, MAX_MANIFEST_BYTES, "manifest")
        except NotFound:
            return None
        manifest = parse_manifest(raw, where=str(path), max_file_bytes=self.max_weights_bytes)
        if not manifest.describes(model, version):
            # a version directory copied from another: that manifest is not this version's
            log.warning(
                "%s was written for %s/%s, not %s/%s (a copied directory?): not checked; rerun "
                "python -m mcp_worker.repository publish %s",
                path, manifest.model, manifest.version, model, version, self.root,
            )  # fmt: skip
            return None
        return manifest

    def _local_config(self, version_dir: Path, manifest: Manifest) -> ModelConfig:
        where = f"model {manifest.model}/{manifest.version}"
        manifest_path = str(version_dir / MANIFEST)
        entry = yaml_entry(manifest, manifest_path)
        path = version_dir / MODEL_YAML
        raw = read_bounded(where, path, MAX_MODEL_YAML_BYTES, "model.yaml")
        verify(raw, entry, str(path), local=True)
        return parse_yaml(raw, manifest, str(path))

    # -- a remote repository ----------------------------------------------------------------------------

    def _remote_manifest(self, model: str, version: str) -> Manifest:
        check_name(model, "model name")
        check_version(version)
        assert self.source is not None
        rel = f"{model}/{version}/{MANIFEST}"
        url = self.source.url(rel)
        try:
            raw = self._fetch_small(rel, MAX_MANIFEST_BYTES, f"model {model}/{version}")
        except NotFound as err:
            raise NotFound(
                f"model {model}/{version} is not in repository {self.location} ({err.message})"
            ) from None
        manifest = parse_manifest(raw, where=url, max_file_bytes=self.max_weights_bytes)
        if not manifest.describes(model, version):
            raise DataLoss(
                f"model {model}/{version}: {url} was written for {manifest.model}/{manifest.version}: the "
                "version directory was copied without republishing; run python -m mcp_worker.repository "
                "publish DIR on the repository's folder and upload it again"
            )
        return manifest

    def _remote_config(self, manifest: Manifest) -> ModelConfig:
        assert self.source is not None and self.cache is not None
        rel = f"{manifest.model}/{manifest.version}/{MODEL_YAML}"
        entry = yaml_entry(manifest, self.source.url(f"{manifest.model}/{manifest.version}/{MANIFEST}"))
        with self.cache.pinned([entry.sha256]):
            raw = self._cached(rel, entry, self._cached_bytes(manifest, MAX_MODEL_YAML_BYTES))
        return parse_yaml(raw, manifest, self.source.url(rel))

    def _remote_load(self, model: str, version: str) -> ModelArtifact:
        assert self.source is not None and self.cache is not None
        manifest = self._remote_manifest(model, version)
        config = self._remote_config(manifest)
        weights = None
        if config.weights is not None:
            rel = f"{model}/{version}/{config.weights}"
            entry = manifest_entry(manifest, config.weights, self.source.url(f"{model}/{version}/{MANIFEST}"))
            url = self.source.url(rel)
            with self.cache.pinned([entry.sha256]):
                weights = self._cached(
                    rel, entry, lambda path: self._read_weights(config, path, url, entry, cached=True)
                )
        return ModelArtifact(config=config, weights=weights, path=None)

    def _read_weights(
        self, config: ModelConfig, path: Path, shown: str, entry: FileEntry | None, *, cached: bool = False
    ) -> bytes:
        return read_weights(
            config, path, shown, entry, keyring=self.keyring, max_bytes=self.max_weights_bytes, cached=cached
        )

    def _fetch_small(self, rel: str, limit: int, where: str) -> bytes:
        """A manifest or the index, read whole, at most ``limit`` bytes (never cached: it says what is
        current)."""
        assert self.source is not None
        url = self.source.url(rel)
        pieces: list[bytes] = []
        got = 0
        try:
            chunks = self.source.chunks(rel)
            try:
                for chunk in chunks:
                    got += len(chunk)
                    if got > limit:
                        raise InvalidArgument(f"{url}: larger than {limit} bytes: not a manifest or index")
                    pieces.append(chunk)
            finally:
                chunks.close()  # type: ignore[attr-defined]
        except NotFound:
            raise
        except MCPError as err:
            raise prefixed(err, where) from None
        return b"".join(pieces)

    def _cached(self, rel: str, entry: FileEntry, use: Callable[[Path], T]) -> T:
        """``use`` of the cached copy of ``rel`` (downloaded if absent). A copy found bad on use (changed or
        removed on disk since it was written) is dropped and downloaded once more."""
        assert self.source is not None and self.cache is not None
        source, url = self.source, self.source.url(rel)
        where = f"model {rel.rsplit('/', 1)[0]}"
        for attempt in range(2):
            try:
                path, fresh = self.cache.get(entry.sha256, entry.size, lambda: source.chunks(rel), url=url)
            except MCPError as err:
                raise prefixed(err, where) from None
            try:
                return use(path)
            except Stale:
                self.cache.forget(entry.sha256)
                if fresh or attempt:
                    raise DataLoss(
                        f"{where}: the cached copy of {url} at {path} changed under the worker: check the "
                        "disk of MCP_WORKER_REPOSITORY_CACHE"
                    ) from None
                log.warning("%s: cached copy %s was damaged or removed: downloading it again", where, path)
        raise AssertionError("unreachable")

    def _cached_bytes(self, manifest: Manifest, limit: int) -> Callable[[Path], bytes]:
        where = f"model {manifest.model}/{manifest.version}"

        def read(path: Path) -> bytes:
            try:
                with path.open("rb") as f:
                    raw = f.read(limit + 1)
            except FileNotFoundError:
                raise Stale from None
            if hashlib.sha256(raw).hexdigest() != path.name:
                raise Stale
            if len(raw) > limit:
                raise InvalidArgument(f"{where}: model.yaml is larger than {limit} bytes")
            return raw

        return read
