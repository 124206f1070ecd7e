"""``mcpctl`` offline commands on a model repository and its keys: encrypt-model and keygen.

Neither talks to the cluster. Key material is never printed, in either output form. A failure (a key id
that is missing or taken, a file that is not there, a model already encrypted) is exit 1, one line.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import yaml
from rich.text import Text

from mcpclient.ctlkit import Ctl, output_option, pass_ctl
from mcpcore.errors import AlreadyExists, FailedPrecondition, InvalidArgument
from mcpcore.keyring import Keyring, generate_key, write_keyring
from mcpcore.keys import check_name, check_version
from mcpcore.model_encryption import decrypt_file, encrypt_file
from mcpcore.model_yaml import load_model_yaml, model_config_from_dict

__all__ = ["COMMANDS"]

MODEL_YAML = "model.yaml"
_PATH = click.Path(path_type=Path)


@click.command(name="encrypt-model")
@click.option("--repo", required=True, type=_PATH, help="model repository directory")
@click.option("--model", required=True, help="source model name")
@click.option("--version", required=True, help="model version, e.g. 1")
@click.option("--keyring", required=True, type=_PATH, help="keyring file (JSON or YAML)")
@click.option("--key-id", required=True, help="id of the key in the keyring")
@click.option(
    "--output-model", default=None, help="write the encrypted version as this model (default: in place)"
)
@output_option
@pass_ctl
def encrypt_model_cmd(
    ctl: Ctl, *, repo: Path, model: str, version: str, keyring: Path, key_id: str, output_model: str | None
) -> None:
    """Encrypt a model version's weights (AES-256-GCM) in a model repository.

    Encrypts <repo>/<model>/<version>'s weights into <weights>.enc and marks model.yaml encrypted. With
    --output-model the encrypted version is written as a new model and the source is left alone (the model
    name is authenticated, so the copy is encrypted for its new name).
    """
    model, version = check_name(model, "model name"), check_version(version)
    target = check_name(output_model or model, "output model name")
    key = Keyring.load(keyring).get(key_id)
    src_dir = repo / model / version
    config = load_model_yaml(src_dir / MODEL_YAML)
    if config.encrypted:
        raise FailedPrecondition(f"model {model}/{version} is already encrypted (key id {config.key_id!r})")
    if config.weights is None:
        raise FailedPrecondition(f"model {model}/{version} has no weights file to encrypt")
    weights, enc_name = config.weights, f"{config.weights}.enc"
    doc = yaml.safe_load((src_dir / MODEL_YAML).read_text(encoding="utf-8"))
    doc = _encrypted_doc(doc, target=target, weights=enc_name, key_id=key_id)
    model_config_from_dict(doc, model=target, version=version)  # the new model.yaml must be valid

    def write(dst_dir: Path) -> None:
        encrypt_file(
            src_dir / weights, dst_dir / enc_name, key=key, key_id=key_id, model=target, version=version
        )
        # Prove the file decrypts for its new name before the plaintext goes away.
        decrypt_file(
            dst_dir / enc_name, keyring=Keyring.from_keys({key_id: key}), model=target, version=version
        )
        _write_text(dst_dir / MODEL_YAML, yaml.safe_dump(doc, sort_keys=False))

    if target == model:
        write(src_dir)
        (src_dir / weights).unlink()
    else:
        _write_copy(src_dir, repo / target / version, skip=weights, fill=write)
    out = {
        "model": model,
        "version": version,
        "weights": weights,
        "output_model": target,
        "encrypted_weights": enc_name,
        "key_id": key_id,
    }
    line = f"encrypted {model}/{version} {weights} -> {target}/{version}/{enc_name} (key id {key_id})"
    ctl.emit(out, lambda: Text(line))


def _encrypted_doc(doc: Any, *, target: str, weights: str, key_id: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise InvalidArgument("model.yaml: expected a mapping at the top level")
    out = dict(doc)
    if "name" in out:
        out["name"] = target
    out["weights"] = weights
    out["encrypted"] = True
    out["key_id"] = key_id
    return out


def _write_copy(src_dir: Path, dst_dir: Path, *, skip: str, fill: Callable[[Path], None]) -> None:
    """Build the copy in a hidden temp dir beside ``dst_dir`` (not a valid version, so no repository lists
    it), then rename it into place, so a failure leaves no half-written version behind."""
    if dst_dir.exists():
        raise AlreadyExists(f"{dst_dir} already exists; remove it or pick another --output-model")
    dst_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dst_dir.parent, prefix=f".{dst_dir.name}.tmp-"))
    try:
        shutil.copytree(
            src_dir,
            tmp,
            dirs_exist_ok=True,
            ignore=lambda d, names: [skip] if Path(d) == src_dir else [],
        )
        fill(tmp)
        os.chmod(tmp, 0o755)  # noqa: S103  mkdtemp makes it 0700; a model folder is world-readable, like its source
        os.rename(tmp, dst_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


@click.command(name="keygen")
@click.option("--keyring", required=True, type=_PATH, help="keyring file; created (mode 0600) if missing")
@click.option("--key-id", required=True, help="id for the new key")
@output_option
@pass_ctl
def keygen_cmd(ctl: Ctl, keyring: Path, key_id: str) -> None:
    """Add a new random AES-256 key to a keyring file (created with mode 0600)."""
    key_id = check_name(key_id, "key id")
    keys: dict[str, bytes] = {}
    if keyring.exists():
        ring = Keyring.load(keyring)
        if key_id in ring:
            raise AlreadyExists(f"key id {key_id!r} is already in keyring {keyring}")
        keys = {k: ring.get(k) for k in ring.key_ids}
    keys[key_id] = generate_key()
    write_keyring(keyring, keys)
    ctl.emit(
        {"keyring": str(keyring), "key_id": key_id},
        lambda: Text(f"added key {key_id!r} to keyring {keyring}"),
    )


COMMANDS = (encrypt_model_cmd, keygen_cmd)
