"""The text a setting is written in, as typed values: booleans, durations, numbers, lists.

``mcpcore.config`` reads every value of every source (YAML, env, flags) through ``coerce``; etcd documents
that carry durations read them with ``parse_duration`` too, so an operator writes ``"5m"`` the same way
everywhere.

Invariants: a bad value is a ``ValueError`` (``coerce``) or an ``InvalidArgument`` (``parse_*``) saying
what was expected; no value is guessed (``"yes"`` is a boolean, ``"1e3"`` is no integer).
"""

from __future__ import annotations

import math
import re
import types
import typing
from typing import Any

from mcpcore.errors import InvalidArgument

__all__ = ["coerce", "parse_bool", "parse_duration"]

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})
_UNIT_S = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(us|µs|ms|s|m|h)")
_DURATION = re.compile(rf"(?:{_DURATION_PART.pattern})+")


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


def coerce(tp: Any, value: Any, name: str) -> Any:
    """``value`` (text from env/flags, or a YAML/Python value) as ``tp``; ``ValueError`` says why not."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None or value == "":
            return None
        return coerce(next(a for a in args if a is not type(None)), value, name)
    if origin is tuple:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"expected a list or a comma separated string, got {value!r}")
        return tuple(coerce(args[0], v, name) for v in value)
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
    return _coerce_float(value, duration=name.endswith("_s"))  # the loader admits no other type


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
