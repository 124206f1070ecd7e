"""The one JSON reader and writer behind every etcd document (``mcpcore.records``).

Invariants:
- Every parse error is an ``InvalidArgument`` whose message names the key and the field, e.g.
  ``/mcp/models/demo-mlp/traffic: canary_percent: must be 0..100, got 150``. Nothing else escapes: bad
  UTF-8, bad JSON, NaN and Infinity, nesting too deep and wrong types all end here, so a watcher can log,
  count and keep the last good value.
- Two kinds of document. OPERATOR documents (traffic, spec, breaker, breaker policy) are strict: an
  unknown field is an error that suggests the closest known name, because a typo must not silently mean
  "the default". PROCESS documents (everything a worker, router or scheduler writes) tolerate fields they
  do not know: a newer writer's additions are ignored and counted in ``UNKNOWN_FIELDS`` (by document
  kind; every service exports it as ``mcp_record_unknown_fields_total``), so a newer worker never drops
  out of an older router's view during an upgrade.
- ``dumps`` is the one encoder: compact separators, so documents stay byte-compatible with what clusters
  hold today.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
from collections import Counter
from collections.abc import Mapping
from typing import Any, NoReturn

from mcpcore.errors import InvalidArgument
from mcpcore.keys import VERSION_RE

__all__ = ["UNKNOWN_FIELDS", "Reader", "decode", "dumps", "show"]

#: Unknown fields seen in process-written documents, by document kind (``"worker"``, ``"replica"``...).
UNKNOWN_FIELDS: Counter[str] = Counter()
_MISSING: Any = object()


@functools.cache
def _as_set(known: tuple[str, ...] | frozenset[str]) -> frozenset[str]:
    return frozenset(known)


def show(value: Any) -> str:
    """A value as an error message quotes it: short, and never a whole nested document."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not allowed")


def decode(key: str, raw: bytes | str) -> Any:
    """The JSON value at ``key``; ``InvalidArgument`` naming the key when it is not JSON."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray, memoryview)) else raw
        return json.loads(text, parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise InvalidArgument(f"{key}: not UTF-8 text") from None
    except (ValueError, TypeError) as exc:
        raise InvalidArgument(f"{key}: not JSON ({exc})") from None
    except RecursionError:
        raise InvalidArgument(f"{key}: not JSON (nested too deeply)") from None


def dumps(body: Mapping[str, Any], *, sort_keys: bool = False) -> bytes:
    return json.dumps(body, separators=(",", ":"), sort_keys=sort_keys).encode()


class Reader:
    """One JSON object being read from ``key``; ``fail`` raises ``<key>: <field>: <problem>``.

    ``known`` lists the fields the document defines; ``strict`` says what an unknown one is: an error
    (operator documents) or ignored and counted under ``kind`` (process documents).
    """

    def __init__(
        self,
        key: str,
        raw: Any,
        known: tuple[str, ...] | frozenset[str],
        *,
        kind: str,
        strict: bool,
    ) -> None:
        self.key = key
        # bytes and text are a document to decode; anything else is a value nested in one
        body = decode(key, raw) if isinstance(raw, (bytes, bytearray, memoryview, str)) else raw
        if not isinstance(body, dict):
            raise InvalidArgument(f"{key}: expected a JSON object, got {show(body)}")
        self.body: dict[str, Any] = body
        unknown = [name for name in body if name not in _as_set(known)]
        if unknown and strict:
            names = sorted(known) if isinstance(known, frozenset) else list(known)
            close = difflib.get_close_matches(unknown[0], names, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]!r}?" if close else f"known fields: {', '.join(names)}"
            self.fail(unknown[0], f"unknown field ({hint})")
        if unknown:
            UNKNOWN_FIELDS[kind] += len(unknown)

    def fail(self, name: str, msg: str) -> NoReturn:
        raise InvalidArgument(f"{self.key}: {name}: {msg}")

    def get(self, name: str, default: Any = _MISSING) -> Any:
        if name in self.body:
            return self.body[name]
        if default is _MISSING:
            self.fail(name, "required")
        return default

    def int_(self, name: str, default: Any = _MISSING, lo: int | None = None, hi: int | None = None) -> int:
        value = self.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(name, f"expected an integer, got {show(value)}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bound = f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"{lo}..{hi}"
            self.fail(name, f"must be {bound}, got {value}")
        return value

    def float_(self, name: str, default: Any = _MISSING, lo: float = 0.0, hi: float = math.inf) -> float:
        value = self.get(name, default)
        try:
            number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        except OverflowError:  # an integer literal too large for a float
            number = None
        if number is None or not math.isfinite(number):
            self.fail(name, f"expected a finite number, got {show(value)}")
        if not lo <= number <= hi:
            self.fail(name, f"must be {lo:g}..{hi:g}, got {value}" if hi < math.inf else f"must be >= {lo:g}")
        return number

    def opt_float(self, name: str, lo: float = 0.0) -> float | None:
        return None if self.get(name, None) is None else self.float_(name, lo=lo)

    def bool_(self, name: str, default: Any = _MISSING) -> bool:
        value = self.get(name, default)
        if not isinstance(value, bool):
            self.fail(name, f"expected true or false, got {show(value)}")
        return value

    def str_(self, name: str, default: Any = _MISSING, *, empty: bool = False) -> str:
        """A string; ``empty`` says whether "" is allowed (else a required field must say something)."""
        value = self.get(name, default)
        if not isinstance(value, str) or (not value and not empty):
            self.fail(name, f"expected a {'' if empty else 'non-empty '}string, got {show(value)}")
        return value

    def strs(self, name: str, default: Any = ()) -> tuple[str, ...]:
        value = self.get(name, default)
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            self.fail(name, f"expected a list of strings, got {show(value)}")
        return tuple(value)

    def obj(self, name: str) -> dict[str, Any] | None:
        value = self.get(name, None)
        if value is not None and not isinstance(value, dict):
            self.fail(name, f"expected an object, got {show(value)}")
        return value

    def version(self, name: str, value: Any) -> str:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str) or not VERSION_RE.fullmatch(value):
            self.fail(name, f'expected a version (a positive integer such as "1"), got {show(value)}')
        return value

    def versions(self, name: str, default: Any = _MISSING) -> tuple[str, ...]:
        items = self.get(name, default)
        if not isinstance(items, list):
            self.fail(name, f"expected a list of versions, got {show(items)}")
        out = tuple(self.version(f"{name}[{i}]", v) for i, v in enumerate(items))
        dup = next((v for i, v in enumerate(out) if v in out[:i]), None)
        if dup is not None:
            self.fail(name, f"version {dup} is listed twice")
        return out

    def labels(self, name: str) -> dict[str, str]:
        value = self.get(name, {})
        if not isinstance(value, dict):
            self.fail(name, f"expected an object of string labels, got {show(value)}")
        for key, val in value.items():
            if not key or "=" in key:
                self.fail(f"{name}.{key}", "a label name is non-empty and has no '='")
            if not isinstance(val, str):
                self.fail(f"{name}.{key}", f"expected a string, got {show(val)}")
        return dict(sorted(value.items()))
