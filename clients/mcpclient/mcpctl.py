"""``mcpctl``: the operator CLI. One small function per subcommand, registered in ``_COMMANDS``.

Exit codes: 0 success, 1 an error (one line on stderr; an ``MCPError`` prints its message), 2 bad usage
(argparse prints the usage). Key material is never printed.

Commands: ``encrypt-model`` (offline, on a model repository), ``keygen`` (adds a key to a keyring file),
and the cluster commands of ``cluster_cmds``: status, load, unload, traffic, breaker, route, infer.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from mcpclient import cluster_cmds
from mcpcore.crypto import Keyring, decrypt_file, encrypt_file, generate_key, write_keyring
from mcpcore.errors import AlreadyExists, FailedPrecondition, InvalidArgument, MCPError
from mcpcore.keys import check_name, check_version
from mcpcore.modelspec import load_model_yaml, model_config_from_dict

__all__ = ["build_parser", "main"]

MODEL_YAML = "model.yaml"


# --- encrypt-model -----------------------------------------------------------------------------------------


def _add_encrypt_model(sub: Any) -> None:
    p = sub.add_parser(
        "encrypt-model",
        help="encrypt a model version's weights (AES-256-GCM) in a model repository",
        description="Encrypt <repo>/<model>/<version>'s weights into <weights>.enc and mark model.yaml "
        "encrypted. With --output-model the encrypted version is written as a new model and the source "
        "is left alone (the model name is authenticated, so the copy is encrypted for its new name).",
    )
    p.add_argument("--repo", required=True, type=Path, help="model repository directory")
    p.add_argument("--model", required=True, help="source model name")
    p.add_argument("--version", required=True, help="model version, e.g. 1")
    p.add_argument("--keyring", required=True, type=Path, help="keyring file (JSON or YAML)")
    p.add_argument("--key-id", required=True, help="id of the key in the keyring")
    p.add_argument("--output-model", help="write the encrypted version as this model (default: in place)")
    p.set_defaults(func=cmd_encrypt_model)


def cmd_encrypt_model(args: argparse.Namespace) -> int:
    model, version = check_name(args.model, "model name"), check_version(args.version)
    target = check_name(args.output_model or model, "output model name")
    key = Keyring.load(args.keyring).get(args.key_id)
    src_dir = args.repo / model / version
    config = load_model_yaml(src_dir / MODEL_YAML)
    if config.encrypted:
        raise FailedPrecondition(f"model {model}/{version} is already encrypted (key id {config.key_id!r})")
    if config.weights is None:
        raise FailedPrecondition(f"model {model}/{version} has no weights file to encrypt")
    weights, enc_name = config.weights, f"{config.weights}.enc"
    doc = yaml.safe_load((src_dir / MODEL_YAML).read_text(encoding="utf-8"))
    doc = _encrypted_doc(doc, target=target, weights=enc_name, key_id=args.key_id)
    model_config_from_dict(doc, model=target, version=version)  # the new model.yaml must be valid

    def write(dst_dir: Path) -> None:
        encrypt_file(
            src_dir / weights, dst_dir / enc_name, key=key, key_id=args.key_id, model=target, version=version
        )
        # Prove the file decrypts for its new name before the plaintext goes away.
        keyring = Keyring.from_keys({args.key_id: key})
        decrypt_file(dst_dir / enc_name, keyring=keyring, model=target, version=version)
        _write_text(dst_dir / MODEL_YAML, yaml.safe_dump(doc, sort_keys=False))

    if target == model:
        write(src_dir)
        (src_dir / weights).unlink()
    else:
        _write_copy(src_dir, args.repo / target / version, skip=weights, fill=write)
    print(f"encrypted {model}/{version} {weights} -> {target}/{version}/{enc_name} (key id {args.key_id})")
    return 0


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
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        os.rename(tmp, dst_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# --- keygen ------------------------------------------------------------------------------------------------


def _add_keygen(sub: Any) -> None:
    p = sub.add_parser(
        "keygen",
        help="add a new random AES-256 key to a keyring file (created with mode 0600)",
    )
    p.add_argument("--keyring", required=True, type=Path, help="keyring file; created if missing")
    p.add_argument("--key-id", required=True, help="id for the new key")
    p.set_defaults(func=cmd_keygen)


def cmd_keygen(args: argparse.Namespace) -> int:
    key_id = check_name(args.key_id, "key id")
    keys: dict[str, bytes] = {}
    if args.keyring.exists():
        keyring = Keyring.load(args.keyring)
        if key_id in keyring:
            raise AlreadyExists(f"key id {key_id!r} is already in keyring {args.keyring}")
        keys = {k: keyring.get(k) for k in keyring.key_ids}
    keys[key_id] = generate_key()
    write_keyring(args.keyring, keys)
    print(f"added key {key_id!r} to keyring {args.keyring}")
    return 0


# --- entry point -------------------------------------------------------------------------------------------

_COMMANDS: tuple[Callable[[Any], None], ...] = (_add_encrypt_model, _add_keygen, *cluster_cmds.COMMANDS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mcpctl", description="Operate an mcpmesh cluster.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in _COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="mcpctl: %(levelname)s: %(message)s")
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # bad usage (2) or --help (0)
        return exit_.code if isinstance(exit_.code, int) else 2
    if getattr(args, "func", None) is None:
        parser.print_usage(sys.stderr)
        return 2
    try:
        return int(args.func(args))
    except MCPError as err:
        print(f"mcpctl {args.command}: {err.message}", file=sys.stderr)
    except OSError as err:
        where = f": {err.filename}" if err.filename else ""
        print(f"mcpctl {args.command}: {err.strerror or err}{where}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
