"""Render ``deploy/k8s`` kustomizations offline, and check every object against the Kubernetes schemas.

    python tools/k8s_render.py deploy/k8s/overlays/cpu     # the multi-document YAML kubectl apply -k sends
    python tools/k8s_render.py --check                     # render every overlay, validate every object

The Go kustomize is not installable here (the PyPI package "kustomize" is unrelated), so this renders
exactly the subset of kustomize that ``deploy/k8s`` uses, and refuses everything else loudly (an unknown
field or option is an error naming it, never silently ignored):

- ``kustomization.yaml`` only (not ``kustomization.yml`` or ``Kustomization``), ``kind: Kustomization``
  (``kustomize.config.k8s.io/v1beta1``) or ``kind: Component`` (``kustomize.config.k8s.io/v1alpha1``);
- ``resources``: YAML files (one or more documents) inside the kustomization's folder, or folders holding a
  ``Kustomization`` (bases, which may lie outside it, as kubectl allows);
- ``components``: folders holding a ``Component``: its resources join the ones gathered so far and its
  patches apply to all of them, before the including kustomization's own patches (kustomize's order);
- ``patches``: entries with ``path`` only (a file inside the folder), each a strategic-merge patch that
  names its target by ``kind`` and ``metadata.name`` (and ``apiVersion``; ``metadata.namespace`` if
  given); it must match exactly one object. Merge rules: mappings merge, ``null`` deletes a key, lists of
  ``containers``/``initContainers``/``env``/``volumes``/``imagePullSecrets`` merge by ``name``,
  ``volumeMounts`` by ``mountPath``, container ``ports`` by ``containerPort``, a Service's ``ports`` by
  ``port``; every other list is replaced whole (as Kubernetes does for args, command, tolerations, ...).
  Directives (``$patch``, ``$setElementOrder/...``, ``$retainKeys``: any key starting with ``$``), and
  lists Kubernetes merges in ways not listed here (``topologySpreadConstraints``, ``finalizers``, ...),
  are refused wherever they appear in a patch;
- ``namespace``: set on every object but Namespaces (kinds that name namespaces inside, such as
  RoleBindings, are refused: their subjects would need rewriting too);
- ``labels``: ``pairs`` added to every object's labels, and with ``includeTemplates: true`` to pod
  templates' labels too; ``includeSelectors`` must be false (selectors are immutable once applied);
- ``images``: ``name`` with ``newName``, ``newTag`` and/or ``digest``, applied to ``containers`` and
  ``initContainers`` everywhere.

Transformers run in kustomize's order: patches, then namespace, labels, images. Output follows
kustomize's default (legacy) order for the kinds used here (Namespace, ConfigMap, Service, Deployment,
StatefulSet, PodDisruptionBudget, then other kinds such as HorizontalPodAutoscaler); within a kind, the
order gathered (kustomize may differ there). Two objects with the same kind, namespace and name are an
error, as in kustomize.

``--check`` renders every folder under ``deploy/k8s/overlays`` (or the folders given) and validates each
object with ``kubernetes_validate.validate(obj, version, strict=True)`` (PyPI ``kubernetes-validate``:
unknown fields are errors) for each of ``K8S_VERSIONS``: Kubernetes 1.30 (an older release still in wide
use; the manifests need 1.27+ for native gRPC probes) and the newest the installed package ships (1.37 with
kubernetes-validate 1.37.0). Kinds
outside the core schemas would be listed in ``SKIP_KINDS`` and reported as skipped; there are none, and an
object whose schema is missing for any other reason (a typo in ``apiVersion``) fails.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

__all__ = ["K8S_VERSIONS", "KustomizeError", "check", "dump", "render"]

ROOT = Path(__file__).resolve().parents[1]
OVERLAYS = ROOT / "deploy" / "k8s" / "overlays"

#: Kubernetes versions --check validates against ("newest" is the newest the package has schemas for).
K8S_VERSIONS = ("1.30", "newest")
#: (apiVersion, kind) of objects without a core schema (CRDs), skipped with a message. None are used.
SKIP_KINDS: frozenset[tuple[str, str]] = frozenset()

_API = {"Kustomization": "kustomize.config.k8s.io/v1beta1", "Component": "kustomize.config.k8s.io/v1alpha1"}
_FIELDS = {"apiVersion", "kind", "resources", "components", "patches", "namespace", "labels", "images"}
_COMPONENT_FIELDS = {"apiVersion", "kind", "resources", "components", "patches"}
_LABEL_FIELDS = {"pairs", "includeSelectors", "includeTemplates"}
_IMAGE_FIELDS = {"name", "newName", "newTag", "digest"}
_PATCH_FIELDS = {"path"}
#: Kinds whose namespace cannot be set by changing metadata.namespace alone.
_NAMESPACE_REFUSED = {"RoleBinding", "ClusterRoleBinding", "ValidatingWebhookConfiguration",
                      "MutatingWebhookConfiguration", "APIService", "CustomResourceDefinition"}  # fmt: skip
_CLUSTER_SCOPED = {"Namespace"}
#: Lists merged by a key (the field's name -> key), per Kubernetes' patchMergeKey for these fields.
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "imagePullSecrets": "name",
    "volumeMounts": "mountPath",
}
#: Lists Kubernetes merges in ways this renderer does not: a patch that touches one is refused.
_MERGE_UNSUPPORTED = {"topologySpreadConstraints", "finalizers", "hostAliases", "volumeDevices",
                      "ephemeralContainers", "resourceClaims", "schedulingGates"}  # fmt: skip
#: kustomize's legacy output order (the part of it for the kinds used here).
_ORDER = ["Namespace", "ResourceQuota", "StorageClass", "CustomResourceDefinition", "ServiceAccount",
          "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ConfigMap", "Secret", "Endpoints",
          "Service", "LimitRange", "PriorityClass", "PersistentVolume", "PersistentVolumeClaim",
          "Deployment", "StatefulSet", "CronJob", "PodDisruptionBudget"]  # fmt: skip
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's when PyYAML has it: the same, faster
_IMAGE = re.compile(r"^(?P<name>[^@]+?)(?::(?P<tag>[^:/@]+))?(?:@(?P<digest>.+))?$")


class KustomizeError(Exception):
    """A kustomization this renderer cannot render, or that kustomize would refuse; it says where."""


# --- loading ---------------------------------------------------------------------------------------------


def _load_docs(path: Path) -> list[dict[str, Any]]:
    try:
        docs = list(yaml.load_all(path.read_text(encoding="utf-8"), Loader=_Loader))
    except (OSError, yaml.YAMLError) as exc:
        raise KustomizeError(f"{path}: cannot read: {exc}") from None
    out = []
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, dict) or not {"apiVersion", "kind", "metadata"} <= doc.keys():
            raise KustomizeError(
                f"{path}: document {i}: not a Kubernetes object (apiVersion, kind, metadata)"
            )
        if not doc["metadata"].get("name"):
            raise KustomizeError(f"{path}: document {i}: {doc['kind']} without metadata.name")
        out.append(doc)
    return out


def _inside(folder: Path, entry: str, what: str) -> Path:
    path = (folder / entry).resolve()
    if not path.is_relative_to(folder.resolve()):
        raise KustomizeError(
            f"{folder}/kustomization.yaml: {what} {entry!r} is outside the folder (kubectl refuses)"
        )
    return path


def _kustomization(folder: Path, kind: str) -> dict[str, Any]:
    file = folder / "kustomization.yaml"
    if not file.is_file():
        raise KustomizeError(f"{folder}: no kustomization.yaml (the only name supported)")
    try:
        data = yaml.load(file.read_text(encoding="utf-8"), Loader=_Loader) or {}  # noqa: S506 (a safe loader)
    except yaml.YAMLError as exc:
        raise KustomizeError(f"{file}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise KustomizeError(f"{file}: expected a mapping")
    if data.get("kind") != kind or data.get("apiVersion") != _API[kind]:
        raise KustomizeError(
            f"{file}: expected kind {kind} ({_API[kind]}), got {data.get('kind')} ({data.get('apiVersion')})"
        )
    allowed = _FIELDS if kind == "Kustomization" else _COMPONENT_FIELDS
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise KustomizeError(
            f"{file}: unsupported field(s) {', '.join(unknown)} "
            f"(k8s_render supports {', '.join(sorted(allowed))})"
        )
    return data


def _list(data: dict[str, Any], field: str, file: Path) -> list[Any]:
    value = data.get(field) or []
    if not isinstance(value, list):
        raise KustomizeError(f"{file}: {field}: expected a list")
    return value


# --- building --------------------------------------------------------------------------------------------


def render(folder: str | Path) -> list[dict[str, Any]]:
    """The objects ``kubectl apply -k folder`` would send, for the subset in this module's docstring."""
    objects = _build(Path(folder), "Kustomization", [])
    return sorted(objects, key=lambda o: _ORDER.index(o["kind"]) if o["kind"] in _ORDER else len(_ORDER))


def _build(folder: Path, kind: str, gathered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    data = _kustomization(folder, kind)
    file = folder / "kustomization.yaml"
    objects = list(gathered)
    for entry in _list(data, "resources", file):
        target = (folder / str(entry)).resolve()
        if target.is_dir():
            objects += _build(target, "Kustomization", [])
        elif target.is_file():
            objects += _load_docs(_inside(folder, str(entry), "resource"))
        else:
            raise KustomizeError(f"{file}: resource {entry!r}: no such file or folder")
        _no_duplicates(objects, file)
    for entry in _list(data, "components", file):
        target = (folder / str(entry)).resolve()
        if not target.is_dir():
            raise KustomizeError(f"{file}: component {entry!r}: not a folder")
        objects = _build(target, "Component", objects)
        _no_duplicates(objects, file)
    for i, entry in enumerate(_list(data, "patches", file)):
        if not isinstance(entry, dict) or set(entry) != _PATCH_FIELDS:
            raise KustomizeError(f"{file}: patches[{i}]: only {{path: FILE}} is supported, got {entry!r}")
        path = _inside(folder, str(entry["path"]), "patch")
        for patch in _load_docs(path):
            _apply_patch(objects, patch, path)
    if "namespace" in data:
        _set_namespace(objects, str(data["namespace"]), file)
    for i, entry in enumerate(_list(data, "labels", file)):
        _add_labels(objects, entry, f"{file}: labels[{i}]")
    for i, entry in enumerate(_list(data, "images", file)):
        _set_images(objects, entry, f"{file}: images[{i}]")
    return objects


def _ident(obj: dict[str, Any]) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def _no_duplicates(objects: list[dict[str, Any]], file: Path) -> None:
    seen: set[tuple[str, str, str]] = set()
    for obj in objects:
        ident = _ident(obj)
        if ident in seen:
            raise KustomizeError(f"{file}: {ident[0]} {ident[2]!r} is defined twice")
        seen.add(ident)


# --- strategic merge -------------------------------------------------------------------------------------


def _apply_patch(objects: list[dict[str, Any]], patch: dict[str, Any], path: Path) -> None:
    meta = patch["metadata"]
    matches = [
        o
        for o in objects
        if o["kind"] == patch["kind"]
        and o["apiVersion"] == patch["apiVersion"]
        and o["metadata"]["name"] == meta["name"]
        and ("namespace" not in meta or o["metadata"].get("namespace") == meta["namespace"])
    ]
    if len(matches) != 1:
        raise KustomizeError(
            f"{path}: patch for {patch['kind']} {meta['name']!r} matches {len(matches)} objects "
            "(needs exactly 1)"
        )
    target = matches[0]
    label = f"{path}: {patch['kind']} {meta['name']}"
    _refuse_unsupported(patch, (), label)
    merged = _merge(target, patch, (), label)
    target.clear()
    target.update(merged)


def _refuse_unsupported(patch: Any, where: tuple[str, ...], label: str) -> None:
    """Directives, and lists merged in ways not implemented here, are errors wherever they appear."""
    if isinstance(patch, dict):
        for key, value in patch.items():
            here = ".".join((*where, str(key)))
            if str(key).startswith("$"):  # $patch, $setElementOrder/..., $retainKeys, ...
                raise KustomizeError(f"{label}: {here}: the {key} directive is not supported")
            if key in _MERGE_UNSUPPORTED:
                raise KustomizeError(f"{label}: {here}: merging this list is not supported")
            _refuse_unsupported(value, (*where, str(key)), label)
    elif isinstance(patch, list):
        for item in patch:
            _refuse_unsupported(item, where, label)


def _merge(base: Any, patch: Any, where: tuple[str, ...], label: str) -> Any:
    if isinstance(patch, dict):
        if not isinstance(base, dict):
            return _strip_nulls(patch)
        out = dict(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = _merge(out[key], value, (*where, key), label)
            else:
                out[key] = _strip_nulls(value)
        return out
    if isinstance(patch, list):
        key = _merge_key(where)
        if key is None or not isinstance(base, list):
            return _strip_nulls(patch)
        return _merge_list(base, patch, key, where, label)
    return patch


def _merge_key(where: tuple[str, ...]) -> str | None:
    field = where[-1] if where else ""
    if field == "ports":
        # a container's ports merge by containerPort; a Service's (spec.ports) by port
        return "port" if where == ("spec", "ports") else "containerPort"
    return _MERGE_KEYS.get(field)


def _merge_list(base: list[Any], patch: list[Any], key: str, where: tuple[str, ...], label: str) -> list[Any]:
    out = [copy.deepcopy(item) for item in base]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise KustomizeError(f"{label}: {'.'.join(where)}: every item needs its merge key {key!r}")
        index = next((i for i, old in enumerate(out) if old.get(key) == item[key]), None)
        if index is None:
            out.append(_strip_nulls(item))  # new items go last, as kustomize adds them
        else:
            out[index] = _merge(out[index], item, (*where, str(item[key])), label)
    return out


def _strip_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nulls(v) for v in value]
    return value


# --- namespace, labels, images ---------------------------------------------------------------------------


def _set_namespace(objects: list[dict[str, Any]], namespace: str, file: Path) -> None:
    for obj in objects:
        if obj["kind"] in _NAMESPACE_REFUSED:
            raise KustomizeError(
                f"{file}: namespace: {obj['kind']} is not supported (it names namespaces inside)"
            )
        if obj["kind"] not in _CLUSTER_SCOPED:
            obj["metadata"]["namespace"] = namespace


def _add_labels(objects: list[dict[str, Any]], entry: Any, label: str) -> None:
    if not isinstance(entry, dict) or not set(entry) <= _LABEL_FIELDS or "pairs" not in entry:
        raise KustomizeError(f"{label}: supported: pairs, includeSelectors (false), includeTemplates")
    if entry.get("includeSelectors", False):
        raise KustomizeError(f"{label}: includeSelectors: true is not supported (selectors are immutable)")
    pairs = {str(k): str(v) for k, v in entry["pairs"].items()}
    for obj in objects:
        obj["metadata"].setdefault("labels", {}).update(pairs)
        template = obj.get("spec", {}).get("template")
        if entry.get("includeTemplates", False) and isinstance(template, dict):
            template.setdefault("metadata", {}).setdefault("labels", {}).update(pairs)


def _set_images(objects: list[dict[str, Any]], entry: Any, label: str) -> None:
    if not isinstance(entry, dict) or not set(entry) <= _IMAGE_FIELDS or "name" not in entry:
        raise KustomizeError(f"{label}: supported: name, newName, newTag, digest")
    if len(entry) == 1:
        raise KustomizeError(f"{label}: names no newName, newTag or digest")
    for container in _containers(objects):
        image = _IMAGE.match(str(container.get("image", "")))
        if image is None or image["name"] != entry["name"]:
            continue
        name = entry.get("newName", image["name"])
        if "digest" in entry:
            container["image"] = f"{name}@{entry['digest']}"
        else:
            tag = entry.get("newTag", image["tag"])
            digest = image["digest"] if "newTag" not in entry else None
            container["image"] = name + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")


def _containers(node: Any) -> Iterable[dict[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from (c for c in value if isinstance(c, dict))
            else:
                yield from _containers(value)
    elif isinstance(node, list):
        for item in node:
            yield from _containers(item)


# --- output and checks -----------------------------------------------------------------------------------


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None  # scripts in ConfigMaps stay readable
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(objects: list[dict[str, Any]]) -> str:
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=110)


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
            errors.append(f"{folder}: {exc}")
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
        sys.stdout.write(dump(render(args.folders[0])))
    except KustomizeError as exc:
        print(f"k8s_render: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
