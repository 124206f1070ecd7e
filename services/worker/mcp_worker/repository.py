"""The model repository: ``<repo>/<model>/<version>/model.yaml`` plus the weights file it names, in a folder
or behind a URL.

Where it is (``MCP_WORKER_REPOSITORY``):
- a folder (``models``, ``/srv/models``, ``file:///srv/models``): listed by its directories; a version's
  ``manifest.json`` (``mcp_worker.manifest``), when it has one written for it, is checked on every load;
- ``http://`` / ``https://`` base URL, or ``s3://bucket/prefix`` (``mcp_worker.sources``): listed by
  ``<repo>/index.json``; a version must have its ``manifest.json`` and every file read must be in it with
  the right size and sha256. Files are downloaded once into the worker's content-addressed cache
  (``repository_cache``, at most ``repository_cache_bytes``) and read from there.

``python -m mcp_worker.repository publish DIR`` writes the manifests and the index of a folder (``check DIR``
says what no longer matches, ``list LOCATION`` lists any repository).

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

import argparse
import hashlib
import logging
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from mcp_worker.manifest import (
    INDEX,
    MANIFEST,
    MAX_INDEX_BYTES,
    MAX_MANIFEST_BYTES,
    FileEntry,
    Manifest,
    check,
    parse_index,
    parse_manifest,
    publish,
    scan,
)
from mcp_worker.sources import DEFAULT_TIMEOUT_S, ContentCache, Source, open_source
from mcpcore.crypto import MAGIC, Keyring, open_encrypted
from mcpcore.errors import (
    DataLoss,
    InvalidArgument,
    MCPError,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)
from mcpcore.keys import VERSION_RE, check_name, check_version
from mcpcore.modelspec import ModelConfig, load_model_yaml, parse_model_yaml

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
MODEL_YAML = "model.yaml"
MAX_MODEL_YAML_BYTES = 1 << 20  # as mcpcore.modelspec reads it
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


class _Stale(Exception):
    pass


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
            entry = self._entry(manifest, config.weights, str(version_dir / MANIFEST))
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
            raw = self._read_bounded(f"model {model}/{version}", path, MAX_MANIFEST_BYTES, "manifest")
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
        entry = self._yaml_entry(manifest, manifest_path)
        path = version_dir / MODEL_YAML
        raw = self._read_bounded(where, path, MAX_MODEL_YAML_BYTES, "model.yaml")
        self._verify(raw, entry, str(path), local=True)
        return self._parse_yaml(raw, manifest, str(path))

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
        entry = self._yaml_entry(manifest, self.source.url(f"{manifest.model}/{manifest.version}/{MANIFEST}"))
        with self.cache.pinned([entry.sha256]):
            raw = self._cached(rel, entry, self._cached_bytes(manifest, MAX_MODEL_YAML_BYTES))
        return self._parse_yaml(raw, manifest, self.source.url(rel))

    def _remote_load(self, model: str, version: str) -> ModelArtifact:
        assert self.source is not None and self.cache is not None
        manifest = self._remote_manifest(model, version)
        config = self._remote_config(manifest)
        weights = None
        if config.weights is not None:
            rel = f"{model}/{version}/{config.weights}"
            entry = self._entry(manifest, config.weights, self.source.url(f"{model}/{version}/{MANIFEST}"))
            url = self.source.url(rel)
            with self.cache.pinned([entry.sha256]):
                weights = self._cached(
                    rel, entry, lambda path: self._read_weights(config, path, url, entry, cached=True)
                )
        return ModelArtifact(config=config, weights=weights, path=None)

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
            raise _prefixed(err, where) from None
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
                raise _prefixed(err, where) from None
            try:
                return use(path)
            except _Stale:
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
                raise _Stale from None
            if hashlib.sha256(raw).hexdigest() != path.name:
                raise _Stale
            if len(raw) > limit:
                raise InvalidArgument(f"{where}: model.yaml is larger than {limit} bytes")
            return raw

        return read

    # -- both -------------------------------------------------------------------------------------------

    @staticmethod
    def _entry(manifest: Manifest, name: str, manifest_at: str) -> FileEntry:
        entry = manifest.files.get(name)
        if entry is None:
            raise DataLoss(
                f"model {manifest.model}/{manifest.version}: {name} is not in its manifest {manifest_at}: "
                "republish the version (python -m mcp_worker.repository publish DIR)"
            )
        return entry

    def _yaml_entry(self, manifest: Manifest, manifest_at: str) -> FileEntry:
        entry = self._entry(manifest, MODEL_YAML, manifest_at)
        if entry.size > MAX_MODEL_YAML_BYTES:
            raise InvalidArgument(
                f"model.yaml {manifest.model}/{manifest.version}: {manifest_at} says {entry.size} bytes, "
                f"larger than {MAX_MODEL_YAML_BYTES}"
            )
        return entry

    @staticmethod
    def _parse_yaml(raw: bytes, manifest: Manifest, where: str) -> ModelConfig:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise InvalidArgument(
                f"model.yaml {manifest.model}/{manifest.version}: not UTF-8 ({where}): {err}"
            ) from None
        return parse_model_yaml(text, model=manifest.model, version=manifest.version)

    @staticmethod
    def _verify(raw: bytes | bytearray, entry: FileEntry, shown: str, *, local: bool) -> None:
        """``raw`` must be what ``entry`` says (a folder's file: ``DataLoss``; a cached one: ``_Stale``)."""
        digest = hashlib.sha256(raw).hexdigest()
        if len(raw) == entry.size and digest == entry.sha256:
            return
        if not local:
            raise _Stale
        raise DataLoss(
            f"{shown}: {len(raw)} bytes with sha256 {digest}, but its manifest says {entry.size} bytes with "
            f"sha256 {entry.sha256}: the file changed after the manifest was written; restore it, or rerun "
            "python -m mcp_worker.repository publish on the repository if the change is intended"
        )

    def _read_weights(
        self, config: ModelConfig, path: Path, shown: str, entry: FileEntry | None, *, cached: bool = False
    ) -> bytes:
        """The weights in ``path`` (shown as ``shown``), checked against ``entry`` when there is one."""
        where = f"model {config.name}/{config.version}"
        if not config.encrypted:
            try:
                raw = self._read_bounded(where, path, self.max_weights_bytes, "weights", shown=shown)
            except NotFound:
                if cached:
                    raise _Stale from None
                raise
            if entry is not None:
                self._verify(raw, entry, shown, local=not cached)
            if raw.startswith(MAGIC):
                raise InvalidArgument(
                    f"{where}: weights {shown} is an encrypted file but model.yaml does not say "
                    "encrypted: true with its key_id"
                )
            return raw
        source = f"{where} ({shown})"
        if self.keyring is None:
            raise PermissionDenied(
                f"{where} is encrypted with key id {config.key_id!r} but this worker has no keyring "
                "configured"
            )
        if entry is not None:
            self._verify_file(path, entry, shown, where, cached=cached)
        # Streamed from the file: the ciphertext is never held whole next to the plaintext.
        with open_encrypted(path, source=source) as enc:
            if enc.size > self.max_weights_bytes:
                raise ResourceExhausted(
                    f"{where}: weights {shown} is {enc.size} bytes, over this worker's limit of "
                    f"{self.max_weights_bytes}"
                )
            if enc.header.key_id != config.key_id:
                raise PermissionDenied(
                    f"{source} is encrypted with key id {enc.header.key_id!r} but model.yaml declares "
                    f"key_id {config.key_id!r}"
                )
            return enc.decrypt(self.keyring, model=config.name, version=config.version)

    def _verify_file(self, path: Path, entry: FileEntry, shown: str, where: str, *, cached: bool) -> None:
        h, size = hashlib.sha256(), 0
        try:
            with path.open("rb") as f:
                while size <= entry.size and (chunk := f.read(1 << 20)):
                    h.update(chunk)
                    size += len(chunk)
        except FileNotFoundError:
            if cached:
                raise _Stale from None
            raise NotFound(f"{where}: weights file not found: {shown}") from None
        except OSError as err:
            raise PermissionDenied(
                f"{where}: weights {shown} is not readable by this worker: {err}"
            ) from None
        if size == entry.size and h.hexdigest() == entry.sha256:
            return
        if cached:
            raise _Stale
        raise DataLoss(
            f"{shown}: does not match its manifest ({entry.size} bytes with sha256 {entry.sha256}): the "
            "file changed after the manifest was written; restore it, or rerun python -m "
            "mcp_worker.repository publish on the repository if the change is intended"
        )

    @staticmethod
    def _read_bounded(where: str, path: Path, limit: int, what: str, *, shown: str | None = None) -> bytes:
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


def _prefixed(err: MCPError, where: str) -> MCPError:
    """The same kind of error with ``where`` (the model) in front of its message."""
    if err.message.startswith(where):
        return err
    out = type(err)(f"{where}: {err.message}")
    out.not_started = err.not_started
    return out


# --- the command line ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mcp_worker.repository",
        description="Publish, check or list a model repository (README: remote model repositories).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("publish", help="write manifest.json for every version of a folder, then index.json")
    p.add_argument("dir", type=Path)
    c = sub.add_parser("check", help="say which files of a folder no longer match its manifests and index")
    c.add_argument("dir", type=Path)
    ls = sub.add_parser("list", help="the models and versions of a repository (folder or URL)")
    ls.add_argument("location")
    args = parser.parse_args(argv)
    try:
        if args.command == "publish":
            models = publish(args.dir)
            count = sum(len(v) for v in models.values())
            print(f"published {count} versions of {len(models)} models in {args.dir}")
            return 0
        if args.command == "check":
            problems = check(args.dir)
            for problem in problems:
                print(problem)
            print(f"{len(problems)} problems" if problems else f"{args.dir}: every file matches")
            return 1 if problems else 0
        for model, versions in ModelRepository(args.location).index().items():
            print(f"{model}: {' '.join(versions)}")
        return 0
    except MCPError as err:
        print(f"{parser.prog}: {err.message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
