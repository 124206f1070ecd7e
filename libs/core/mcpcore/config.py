"""Loading a service's frozen config dataclass from defaults, a YAML file, the environment and CLI flags.

Each service defines one frozen dataclass (its ``config.py``), nesting the sections every service shares
(``mcpcore.settings``), and builds it once in ``__main__`` with ``load_config``. Nothing here reads
``os.environ`` or ``sys.argv`` by itself, and nothing is cached; ``environment()`` is the one place product
code reads the process's environment (the runner hands it to ``load_config``).

Invariants:
- Precedence is defaults < YAML < env < flags, field by field. Every value from every source is checked,
  even one a later source overrides, so a bad YAML value is never hidden by an env var.
- Every error is an ``InvalidArgument`` naming the source (YAML file, env var, flag) and the field path;
  unknown YAML keys and flags are errors that suggest the closest field. Unknown env vars under the prefix
  are ignored with one warning that names them (with the closest field): Kubernetes injects
  ``MCP_ROUTER_PORT`` and the like for a Service named ``mcp-router``, and a service must still start.
- A field with ``metadata=shared_env(NAME, ...)`` is also read from those variables, below the service's own
  prefixed one: ``MCP_ETCD_ENDPOINTS`` sets every service's etcd endpoints (``MCP_ROUTER_ETCD_ENDPOINTS``
  still wins); of several names, the first one set wins. Set empty, such a variable counts as unset (as
  OpenTelemetry's do): ``MCP_LOG_FORMAT=`` means the default.
- A section field with ``metadata=flat("etcd_")`` keeps flat names: its fields are named
  ``etcd_<field>`` in YAML, env and flags (``etcd_endpoints``, ``MCP_ROUTER_ETCD_ENDPOINTS``,
  ``--etcd-endpoints``) while the dataclass nests them (``config.etcd.endpoints``). Two fields that would
  get one name are a bug (``TypeError``).
- Field types: ``str``, ``int``, ``float``, ``bool``, ``tuple[X, ...]`` of those (comma separated in text),
  ``X | None``, and nested frozen dataclasses (YAML mappings; env ``PREFIX_SECTION__FIELD``; flags
  ``--section.field``). A ``float`` field whose name ends in ``_s`` is a duration in seconds and also takes
  ``"250ms"``, ``"30s"``, ``"5m"``. Values are read by ``mcpcore.config_values`` (``parse_bool`` and
  ``parse_duration`` are also this module's, the syntax of its settings).
- The dataclass's ``__post_init__`` may raise ``ValueError`` for cross-field rules; it becomes an
  ``InvalidArgument`` with the config's name.

Example::

    @dataclass(frozen=True)
    class RouterConfig:
        router_id: str = ""
        etcd: EtcdSettings = field(default_factory=EtcdSettings, metadata=flat("etcd_"))

    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    add_flags(parser, RouterConfig, env_prefix="MCP_ROUTER_")
    ns = parser.parse_args()
    cfg = load_config(RouterConfig, yaml_path=ns.config, env=environment(), env_prefix="MCP_ROUTER_",
                      overrides=overrides_from_args(ns))
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import os
import socket
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import yaml

from mcpcore.config_values import coerce, parse_bool, parse_duration
from mcpcore.errors import InvalidArgument
from mcpcore.keys import check_name

__all__ = [
    "Setting",
    "add_flags",
    "describe",
    "env_names",
    "environment",
    "flat",
    "load_config",
    "overrides_from_args",
    "parse_bool",
    "parse_duration",
    "shared_env",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
Path_ = tuple[str, ...]

_FLAG_DEST = "mcpcfg:"  # argparse dest prefix that marks our flags among a parser's other options
_SCALARS = (str, int, float, bool)
#: Field metadata keys: ``flat``'s prefix, ``shared_env``'s names.
_FLAT, _ENV = "mcpcfg.flat", "mcpcfg.env"


def environment() -> Mapping[str, str]:
    """The process's environment, for ``load_config(env=...)``: product code reads it nowhere else."""
    return os.environ


def flat(prefix: str) -> dict[str, str]:
    """Field metadata for a nested section whose fields keep flat names, ``prefix + name``, in YAML, env and
    flags: ``etcd: EtcdSettings = field(default_factory=EtcdSettings, metadata=flat("etcd_"))``."""
    return {_FLAT: prefix}


def shared_env(*names: str) -> dict[str, tuple[str, ...]]:
    """Field metadata for a field also read from the environment variables ``names`` (the first one set
    wins), below the service's own ``PREFIX_FIELD``: names every service shares (``MCP_ETCD_ENDPOINTS``)
    or standard ones (``OTEL_EXPORTER_OTLP_ENDPOINT``)."""
    return {_ENV: names}


# --- the field tree ------------------------------------------------------------------------------------


def _fields(cls: type) -> dict[str, tuple[dataclasses.Field[Any], Any]]:
    if not (dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen):  # type: ignore[attr-defined]
        raise TypeError(f"{cls!r} is not a frozen dataclass")
    hints = typing.get_type_hints(cls)
    return {f.name: (f, hints[f.name]) for f in dataclasses.fields(cls) if f.init}


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _supported(tp: Any) -> bool:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return len(args) == 2 and len(inner) == 1 and _supported(inner[0])
    if origin is tuple:
        return len(args) == 2 and args[1] is Ellipsis and args[0] in _SCALARS
    return tp in _SCALARS


class _Name(NamedTuple):
    attr: Path_  # the path among the attributes, from the class asked about
    tp: Any
    field: dataclasses.Field[Any]
    owner: type  # the dataclass that declares the field


def _names(cls: type) -> dict[str, _Name]:
    """The names ``cls``'s fields go by in YAML, env and flags (flat sections' fields pulled up, with their
    prefix)."""
    out: dict[str, _Name] = {}
    for name, (f, tp) in _fields(cls).items():
        flat = f.metadata.get(_FLAT)
        inner = _names(tp) if flat is not None and _is_section(tp) else {"": _Name((), tp, f, cls)}
        for sub, found in inner.items():
            key = flat + sub if sub else name
            if key in out:
                raise TypeError(f"{cls.__name__}: two fields are named {key!r} (a flat section's prefix?)")
            out[key] = found._replace(attr=(name, *found.attr))
    return out


class _Leaf(NamedTuple):
    attr: Path_  # where the value goes among the dataclasses' attributes
    tp: Any
    env: tuple[str, ...]  # shared_env's names
    name: _Name


def _leaves(cls: type, base: Path_ = (), attr_base: Path_ = ()) -> dict[Path_, _Leaf]:
    """Every scalar field by its path of names (the YAML keys; flat sections flattened)."""
    out: dict[Path_, _Leaf] = {}
    for key, found in _names(cls).items():
        attr = (*attr_base, *found.attr)
        if _is_section(found.tp):
            out.update(_leaves(found.tp, (*base, key), attr))
        elif _supported(found.tp):
            out[(*base, key)] = _Leaf(attr, found.tp, tuple(found.field.metadata.get(_ENV, ())), found)
        else:
            raise TypeError(f"{cls.__name__}.{key}: unsupported config field type {found.tp!r}")
    return out


class Setting(NamedTuple):
    """One setting as operators name it (``describe``)."""

    name: str  # the dotted YAML path: ``etcd_endpoints``, ``tls.ca_file``, ``tuning.gc_freeze``
    flag: str
    env: tuple[str, ...]  # the service's own variable, then the shared ones (first set wins)
    default: Any  # dataclasses.MISSING: required
    owner: type  # the dataclass that declares it (its ``#:`` comment is the setting's help)
    field: str  # its field name there


def describe(cls: type, env_prefix: str) -> list[Setting]:
    """Every setting of ``cls`` with the names it goes by (for reference pages and help)."""
    return [
        Setting(
            ".".join(path),
            _flag_name(path),
            (_env_name(env_prefix, path), *leaf.env),
            _leaf_default(cls, leaf.attr),
            leaf.name.owner,
            leaf.name.field.name,
        )
        for path, leaf in _leaves(cls).items()
    ]


def env_names(cls: type, env_prefix: str) -> set[str]:
    """Every environment variable ``load_config(cls, env_prefix=...)`` reads."""
    return {name for setting in describe(cls, env_prefix) for name in setting.env}


def _env_name(prefix: str, path: Path_) -> str:
    return prefix + "__".join(p.upper() for p in path)


def _flag_name(path: Path_) -> str:
    return "--" + ".".join(path).replace("_", "-")


def _suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# --- the sources -----------------------------------------------------------------------------------------

Raw = dict[Path_, tuple[Any, str]]  # field path -> (value as given, where it came from)


def _read_yaml(cls: type, path: Path) -> Raw:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise InvalidArgument(f"{path}: cannot read: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        raise InvalidArgument(f"{path}: not valid YAML: {err}") from None
    out: Raw = {}
    _walk_yaml(cls, path, data if data is not None else {}, (), out)
    return out


def _walk_yaml(cls: type, path: Path, data: Any, base: Path_, out: Raw) -> None:
    if not isinstance(data, Mapping):
        where = ".".join(base) or "top level"
        raise InvalidArgument(f"{path}: {where}: expected a mapping, got {type(data).__name__}")
    names = _names(cls)
    for key, value in data.items():
        dotted = ".".join((*base, str(key)))
        if key not in names:
            raise InvalidArgument(f"{path}: {dotted}: unknown key{_suggest(str(key), names)}")
        tp = names[key].tp
        if _is_section(tp):
            _walk_yaml(tp, path, value if value is not None else {}, (*base, key), out)
        else:
            out[(*base, key)] = (value, f"{path}: {dotted}")


def _read_shared_env(cls: type, env: Mapping[str, str]) -> list[Raw]:
    """One layer per position in ``shared_env``'s names, the last first, so the first name set wins."""
    leaves = _leaves(cls)
    depth = max((len(leaf.env) for leaf in leaves.values()), default=0)
    return [
        {
            p: (env[leaf.env[i]], leaf.env[i])
            for p, leaf in leaves.items()
            if i < len(leaf.env) and env.get(leaf.env[i], "").strip()
        }
        for i in reversed(range(depth))
    ]


def _read_env(cls: type, env: Mapping[str, str], prefix: str, label: str) -> Raw:
    by_name = {_env_name(prefix, p): p for p in _leaves(cls)}
    out: Raw = {}
    unknown = []
    for name, value in env.items():
        if not name.startswith(prefix):
            continue
        if name not in by_name:
            unknown.append(f"{name}{_suggest(name, by_name)}")
            continue
        out[by_name[name]] = (value, name)
    if unknown:
        log.warning(
            "%s config: ignoring environment variables that name no setting: %s",
            label,
            ", ".join(sorted(unknown)),
        )
    return out


def _read_overrides(cls: type, overrides: Mapping[str, Any]) -> Raw:
    by_key = {".".join(p): p for p in _leaves(cls)}
    out: Raw = {}
    for key, value in overrides.items():
        if key not in by_key:
            raise InvalidArgument(f"{_flag_name((key,))}: unknown option{_suggest(key, by_key)}")
        out[by_key[key]] = (value, _flag_name(by_key[key]))
    return out


def _build(
    cls: type[T], base: Path_, values: Mapping[Path_, Any], required: Mapping[Path_, str], start: Any = None
) -> T:
    """``cls`` from ``values`` (by attribute path); fields not set come from ``start`` (the parent's default
    section) if given, else from the field defaults. ``required``: attribute path -> what to say if unset."""
    kwargs: dict[str, Any] = {}
    for name, (f, tp) in _fields(cls).items():
        path = (*base, name)
        if _is_section(tp):
            sub = getattr(start, name) if start is not None else _default(f)
            kwargs[name] = _build(tp, path, values, required, sub)
        elif path in values:
            kwargs[name] = values[path]
        elif start is not None:
            kwargs[name] = getattr(start, name)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise InvalidArgument(required[path])
    try:
        return cls(**kwargs)
    except ValueError as err:  # __post_init__'s cross-field rules
        raise InvalidArgument(str(err)) from None


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def load_config(
    cls: type[T],
    *,
    yaml_path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    env_prefix: str = "MCP_ROUTER_",
    overrides: Mapping[str, Any] | None = None,
    name: str | None = None,
) -> T:
    """Build ``cls`` from its defaults, then ``yaml_path``, then ``env`` (vars under ``env_prefix``),
    then ``overrides`` (field name, or dotted path for nested fields, to value: see ``overrides_from_args``).

    ``env`` is read only when passed (``env=environment()`` in ``__main__``), the ``shared_env`` variables
    first, then those under the prefix. ``name`` (default: taken from the
    prefix, ``MCP_ROUTER_`` gives ``router``) starts every error message: ``router config: ...``.
    """
    label = name or env_prefix.removeprefix("MCP_").rstrip("_").lower() or cls.__name__
    leaves = _leaves(cls)  # a field type we cannot load is a bug: TypeError, before any source is read
    try:
        layers: list[Raw] = []  # lowest precedence first
        if yaml_path is not None:
            layers.append(_read_yaml(cls, Path(yaml_path)))
        if env is not None:
            layers.extend(_read_shared_env(cls, env))
            layers.append(_read_env(cls, env, env_prefix, label))
        if overrides is not None:
            layers.append(_read_overrides(cls, overrides))
        values: dict[Path_, Any] = {}
        for layer in layers:
            for path, (value, where) in layer.items():
                leaf = leaves[path]
                try:
                    values[leaf.attr] = coerce(leaf.tp, value, path[-1])
                except ValueError as err:
                    raise InvalidArgument(f"{where}: {err}") from None
        sources = {p: f"{_env_name(env_prefix, p)} or {_flag_name(p)}" for p in leaves}
        required = {
            leaf.attr: f"{'.'.join(p)}: required; set it in YAML, {sources[p]}" for p, leaf in leaves.items()
        }
        return _build(cls, (), values, required)
    except InvalidArgument as err:
        raise InvalidArgument(f"{label} config: {err.message}") from None


# --- flags -------------------------------------------------------------------------------------------------


def _leaf_default(cls: type, attr: Path_) -> Any:
    """The default of the field at ``attr``, or ``dataclasses.MISSING`` (a required field)."""
    f = _fields(cls)[attr[0]][0]
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        return dataclasses.MISSING
    value = _default(f)
    for name in attr[1:]:
        value = getattr(value, name)
    return value


def add_flags(parser: argparse.ArgumentParser, cls: type, *, env_prefix: str | None = None) -> None:
    """Add ``--field-name`` for each scalar field of ``cls``, ``--section.field-name`` for those of nested
    sections (booleans also get ``--no-...``).

    Flags default to "not given", so only flags on the command line override YAML and env; read them back
    with ``overrides_from_args``. With ``env_prefix`` the help names each field's env vars too.
    """
    for path, leaf in _leaves(cls).items():
        default = _leaf_default(cls, leaf.attr)
        help_ = "required" if default is dataclasses.MISSING else f"default: {default!r}"
        if env_prefix:
            help_ += f"; env {', '.join([_env_name(env_prefix, path), *leaf.env])}"
        flag, dest = _flag_name(path), _FLAG_DEST + ".".join(path)
        if leaf.tp is bool:
            parser.add_argument(
                flag, dest=dest, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=help_
            )
        else:
            metavar = path[-1].upper()
            parser.add_argument(flag, dest=dest, default=argparse.SUPPRESS, metavar=metavar, help=help_)


def overrides_from_args(ns: argparse.Namespace) -> dict[str, Any]:
    """The flags from ``add_flags`` that were given, as ``load_config(overrides=...)`` takes them."""
    return {k.removeprefix(_FLAG_DEST): v for k, v in vars(ns).items() if k.startswith(_FLAG_DEST)}


def instance_id(value: str, field_name: str) -> str:
    """A service instance's id: ``value``, or ``<host>-<pid>`` when empty; checked as a key name.

    For a config's ``__post_init__``: raises ``ValueError`` (which ``load_config`` reports with the field).
    """
    chosen = value or f"{socket.gethostname().split('.')[0]}-{os.getpid()}"
    try:
        return check_name(chosen, field_name)
    except InvalidArgument as exc:
        raise ValueError(exc.message) from None
