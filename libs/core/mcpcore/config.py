"""Loading a service's frozen config dataclass from defaults, a YAML file, the environment and CLI flags.

Each service defines one frozen dataclass (its ``config.py``) and builds it once in ``__main__`` with
``load_config``; nothing here reads ``os.environ`` or ``sys.argv`` by itself, and nothing is cached.

Invariants:
- Precedence is defaults < YAML < env < flags, field by field. Every value from every source is checked,
  even one a later source overrides, so a bad YAML value is never hidden by an env var.
- Every error is an ``InvalidArgument`` naming the source (YAML file, env var, flag) and the field path;
  unknown YAML keys and flags are errors that suggest the closest field. Unknown env vars under the prefix
  are ignored with one warning that names them (with the closest field): Kubernetes injects
  ``MCP_ROUTER_PORT`` and the like for a Service named ``mcp-router``, and a service must still start.
- ``SHARED_ENV`` names variables every service reads below its own prefix's: ``MCP_ETCD_ENDPOINTS`` sets
  ``etcd_endpoints`` wherever the config has that field (``MCP_ROUTER_ETCD_ENDPOINTS`` still wins).
- Field types: ``str``, ``int``, ``float``, ``bool``, ``tuple[X, ...]`` of those (comma separated in text),
  ``X | None``, and nested frozen dataclasses (YAML mappings; env ``PREFIX_SECTION__FIELD``). A ``float``
  field whose name ends in ``_s`` is a duration in seconds and also takes ``"250ms"``, ``"30s"``, ``"5m"``.
- The dataclass's ``__post_init__`` may raise ``ValueError`` for cross-field rules; it becomes an
  ``InvalidArgument`` with the config's name.

Example::

    @dataclass(frozen=True)
    class RouterConfig:
        grpc_port: int = 8001
        etcd: EtcdConfig = field(default_factory=EtcdConfig)

    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    add_flags(parser, RouterConfig, env_prefix="MCP_ROUTER_")
    ns = parser.parse_args()
    cfg = load_config(RouterConfig, yaml_path=ns.config, env=os.environ, env_prefix="MCP_ROUTER_",
                      overrides=overrides_from_args(ns))
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import math
import os
import re
import socket
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from mcpcore.errors import InvalidArgument
from mcpcore.keys import check_name

__all__ = ["SHARED_ENV", "add_flags", "load_config", "overrides_from_args", "parse_bool", "parse_duration"]

log = logging.getLogger(__name__)

#: Variables every service reads, below its own ``MCP_<SERVICE>_...`` ones: name -> field path.
SHARED_ENV: dict[str, tuple[str, ...]] = {"MCP_ETCD_ENDPOINTS": ("etcd_endpoints",)}

T = TypeVar("T")
Path_ = tuple[str, ...]

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})
_UNIT_S = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(us|µs|ms|s|m|h)")
_DURATION = re.compile(rf"(?:{_DURATION_PART.pattern})+")
_FLAG_DEST = "mcpcfg:"  # argparse dest prefix that marks our flags among a parser's other options
_SCALARS = (str, int, float, bool)


def parse_duration(value: str | float) -> float:
    """Seconds from ``"250ms"``, ``"30s"``, ``"1.5s"``, ``"5m"``, ``"1h30m"``, or a plain number of seconds.

    Raises ``InvalidArgument`` for anything else, including negative or non-finite values.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidArgument(f"not a duration: {value!r}")
    if isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)  # a plain number means seconds
        except ValueError:
            if not _DURATION.fullmatch(text):
                raise InvalidArgument(
                    f"not a duration: {value!r} (use e.g. '250ms', '30s', '5m', '1h30m')"
                ) from None
            seconds = sum(float(n) * _UNIT_S[u] for n, u in _DURATION_PART.findall(text))
    else:
        seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidArgument(f"a duration must be finite and >= 0, got {value!r}")
    return seconds


def parse_bool(value: str | bool) -> bool:
    """``True``/``False`` from a bool or from true/false, 1/0, yes/no (any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        low = value.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
    raise InvalidArgument(f"not a boolean (true/false, 1/0, yes/no): {value!r}")


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


def _leaves(cls: type, base: Path_ = ()) -> dict[Path_, Any]:
    """Every scalar field's path to its type, nested sections flattened."""
    out: dict[Path_, Any] = {}
    for name, (_, tp) in _fields(cls).items():
        if _is_section(tp):
            out.update(_leaves(tp, (*base, name)))
        elif _supported(tp):
            out[(*base, name)] = tp
        else:
            raise TypeError(f"{cls.__name__}.{name}: unsupported config field type {tp!r}")
    return out


def _env_name(prefix: str, path: Path_) -> str:
    return prefix + "__".join(p.upper() for p in path)


def _flag_name(path: Path_) -> str:
    return "--" + ".".join(path).replace("_", "-")


def _suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# --- coercion --------------------------------------------------------------------------------------------


def _coerce(tp: Any, value: Any, name: str) -> Any:
    """``value`` (text from env/flags, or a YAML/Python value) as ``tp``; ``ValueError`` says why not."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None or value == "":
            return None
        return _coerce(next(a for a in args if a is not type(None)), value, name)
    if origin is tuple:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"expected a list or a comma separated string, got {value!r}")
        return tuple(_coerce(args[0], v, name) for v in value)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {value!r}")
        return value
    if tp is bool:
        try:
            return parse_bool(value)
        except InvalidArgument as err:
            raise ValueError(err.message) from None
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip(), 10)
            except ValueError:
                pass
        raise ValueError(f"not an integer: {value!r}")
    return _coerce_float(value, duration=name.endswith("_s"))  # _leaves admits no other type


def _coerce_float(value: Any, *, duration: bool) -> float:
    if duration:
        try:
            return parse_duration(value)
        except InvalidArgument as err:
            raise ValueError(err.message) from None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise ValueError(f"not a number: {value!r}") from None
    else:
        raise ValueError(f"not a number: {value!r}")
    if not math.isfinite(number):
        raise ValueError(f"not a finite number: {value!r}")
    return number


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
    fields = _fields(cls)
    for key, value in data.items():
        dotted = ".".join((*base, str(key)))
        if key not in fields:
            raise InvalidArgument(f"{path}: {dotted}: unknown key{_suggest(str(key), fields)}")
        tp = fields[key][1]
        if _is_section(tp):
            _walk_yaml(tp, path, value if value is not None else {}, (*base, key), out)
        else:
            out[(*base, key)] = (value, f"{path}: {dotted}")


def _read_shared_env(cls: type, env: Mapping[str, str]) -> Raw:
    leaves = _leaves(cls)
    return {path: (env[name], name) for name, path in SHARED_ENV.items() if name in env and path in leaves}


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


def _build(cls: type[T], base: Path_, values: Mapping[Path_, Any], env_prefix: str, start: Any = None) -> T:
    """``cls`` from ``values``; fields not set come from ``start`` (the parent's default section) if given,
    else from the field defaults."""
    kwargs: dict[str, Any] = {}
    for name, (f, tp) in _fields(cls).items():
        path = (*base, name)
        if _is_section(tp):
            sub = getattr(start, name) if start is not None else _default(f)
            kwargs[name] = _build(tp, path, values, env_prefix, sub)
        elif path in values:
            kwargs[name] = values[path]
        elif start is not None:
            kwargs[name] = getattr(start, name)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise InvalidArgument(
                f"{'.'.join(path)}: required; set it in YAML, {_env_name(env_prefix, path)}"
                + (f" or {_flag_name(path)}" if len(path) == 1 else "")
            )
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

    ``env`` is read only when passed (``env=os.environ`` in ``__main__``), the ``SHARED_ENV`` variables
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
            layers.append(_read_shared_env(cls, env))
            layers.append(_read_env(cls, env, env_prefix, label))
        if overrides is not None:
            layers.append(_read_overrides(cls, overrides))
        values: dict[Path_, Any] = {}
        for layer in layers:
            for path, (value, where) in layer.items():
                try:
                    values[path] = _coerce(leaves[path], value, path[-1])
                except ValueError as err:
                    raise InvalidArgument(f"{where}: {err}") from None
        return _build(cls, (), values, env_prefix)
    except InvalidArgument as err:
        raise InvalidArgument(f"{label} config: {err.message}") from None


# --- flags -------------------------------------------------------------------------------------------------


def add_flags(parser: argparse.ArgumentParser, cls: type, *, env_prefix: str | None = None) -> None:
    """Add ``--field-name`` for each top-level scalar field of ``cls`` (booleans also get ``--no-...``).

    Flags default to "not given", so only flags on the command line override YAML and env; read them back
    with ``overrides_from_args``. With ``env_prefix`` the help names each field's env var too.
    """
    for name, (f, tp) in _fields(cls).items():
        if _is_section(tp):
            continue
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        help_ = "required" if required else f"default: {_default(f)!r}"
        if env_prefix:
            help_ += f"; env {_env_name(env_prefix, (name,))}"
        flag, dest = _flag_name((name,)), _FLAG_DEST + name
        if tp is bool:
            parser.add_argument(
                flag, dest=dest, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=help_
            )
        else:
            parser.add_argument(flag, dest=dest, default=argparse.SUPPRESS, metavar=name.upper(), help=help_)


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
