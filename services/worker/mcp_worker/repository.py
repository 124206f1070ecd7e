"""The model repository on disk: ``<repo>/<model>/<version>/model.yaml`` plus the weights file it names.

Invariants:
- Model and version names are validated (``mcpcore.keys``) before any path is built, and the weights file
  name is a plain name (``modelspec`` checks it), so no request can reach outside ``<repo>``.
- Encrypted weights are decrypted in memory only, with the worker's keyring; the file's key id must be the
  one model.yaml declares. No plaintext is written, nothing is unpickled, no model is executed here.
- Every failure is an ``MCPError`` naming the model, version and path: a missing model or file is
  ``NotFound``, an oversized weights file ``ResourceExhausted``, a missing or wrong key ``PermissionDenied``,
  a damaged encrypted file ``DataLoss``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mcpcore.crypto import MAGIC, Keyring, open_encrypted
from mcpcore.errors import InvalidArgument, NotFound, PermissionDenied, ResourceExhausted
from mcpcore.keys import NAME_RE, VERSION_RE, check_name, check_version
from mcpcore.modelspec import ModelConfig, load_model_yaml

__all__ = ["DEFAULT_MAX_WEIGHTS_BYTES", "ModelArtifact", "ModelRepository"]

DEFAULT_MAX_WEIGHTS_BYTES = 4 << 30
MODEL_YAML = "model.yaml"


@dataclass(frozen=True)
class ModelArtifact:
    """One loaded model version: its validated config and its weights (plaintext, or None without any)."""

    config: ModelConfig
    weights: bytes | None = field(repr=False)
    path: Path  # the version directory


class ModelRepository:
    """Reads model versions from one repository directory; holds no state besides its settings."""

    def __init__(
        self,
        root: str | Path,
        keyring: Keyring | None = None,
        *,
        max_weights_bytes: int = DEFAULT_MAX_WEIGHTS_BYTES,
    ) -> None:
        self.root = Path(root)
        self.keyring = keyring
        self.max_weights_bytes = max_weights_bytes

    def __repr__(self) -> str:
        return f"ModelRepository(root={str(self.root)!r}, keyring={self.keyring!r})"

    # -- listing ----------------------------------------------------------------------------------------

    def index(self) -> dict[str, list[str]]:
        """Every model with at least one version, mapped to its versions in numeric order."""
        if not self.root.is_dir():
            raise NotFound(f"model repository {self.root} does not exist or is not a directory")
        out: dict[str, list[str]] = {}
        for entry in sorted(self.root.iterdir()):
            if entry.is_dir() and NAME_RE.fullmatch(entry.name):
                versions = self._versions_in(entry)
                if versions:
                    out[entry.name] = versions
        return out

    def versions(self, model: str) -> list[str]:
        """The model's versions in numeric order; ``NotFound`` when it has none here."""
        check_name(model, "model name")
        model_dir = self.root / model
        versions = self._versions_in(model_dir) if model_dir.is_dir() else []
        if not versions:
            raise NotFound(f"model {model!r} has no versions in repository {self.root}")
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
        return load_model_yaml(self._version_dir(model, version) / MODEL_YAML)

    def load(self, model: str, version: str) -> ModelArtifact:
        """Read, validate and (if encrypted) decrypt one model version. Runs nothing."""
        version_dir = self._version_dir(model, version)
        config = load_model_yaml(version_dir / MODEL_YAML)
        weights = None
        if config.weights is not None:
            weights = self._read_weights(config, version_dir / config.weights)
        return ModelArtifact(config=config, weights=weights, path=version_dir)

    def _version_dir(self, model: str, version: str) -> Path:
        check_name(model, "model name")
        check_version(version)
        version_dir = self.root / model / version
        if not version_dir.is_dir():
            raise NotFound(f"model {model}/{version} is not in repository {self.root} (no {version_dir})")
        return version_dir

    def _read_weights(self, config: ModelConfig, path: Path) -> bytes:
        where = f"model {config.name}/{config.version}"
        if not config.encrypted:
            raw = self._read_bounded(where, path)
            if raw.startswith(MAGIC):
                raise InvalidArgument(
                    f"{where}: weights {path} is an encrypted file but model.yaml does not say "
                    "encrypted: true with its key_id"
                )
            return raw
        source = f"{where} ({path})"
        if self.keyring is None:
            raise PermissionDenied(
                f"{where} is encrypted with key id {config.key_id!r} but this worker has no keyring "
                "configured"
            )
        # Streamed from the file: the ciphertext is never held whole next to the plaintext.
        with open_encrypted(path, source=source) as enc:
            if enc.size > self.max_weights_bytes:
                raise ResourceExhausted(
                    f"{where}: weights {path} is {enc.size} bytes, over this worker's limit of "
                    f"{self.max_weights_bytes}"
                )
            if enc.header.key_id != config.key_id:
                raise PermissionDenied(
                    f"{source} is encrypted with key id {enc.header.key_id!r} but model.yaml declares "
                    f"key_id {config.key_id!r}"
                )
            return enc.decrypt(self.keyring, model=config.name, version=config.version)

    def _read_bounded(self, where: str, path: Path) -> bytes:
        limit = self.max_weights_bytes
        try:
            with path.open("rb") as f:
                size = f.seek(0, 2)
                if size > limit:
                    raise ResourceExhausted(
                        f"{where}: weights {path} is {size} bytes, over this worker's limit of {limit}"
                    )
                f.seek(0)
                raw = f.read(limit + 1)  # the file may grow between seek and read
        except FileNotFoundError:
            raise NotFound(f"{where}: weights file not found: {path}") from None
        except IsADirectoryError:
            raise InvalidArgument(f"{where}: weights {path} is a directory, not a file") from None
        except PermissionError:
            raise PermissionDenied(f"{where}: weights {path} is not readable by this worker") from None
        if len(raw) > limit:
            raise ResourceExhausted(f"{where}: weights {path} is over this worker's limit of {limit} bytes")
        return raw
