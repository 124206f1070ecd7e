"""Triton's request tracing (``TraceSetting``, ``/v2[/models/{m}]/trace/setting``) for the router.

Settings (Triton's; lists of strings in and out, as in ``TraceSettingResponse``): trace_file, trace_level
(OFF alone, or TIMESTAMPS and/or TENSORS), trace_rate (trace 1 request in N), trace_count (traces still to
take, -1 no limit), log_frequency, trace_mode (triton only). A model's settings override the global ones
key by key; None or [] clears a model's key (the global one applies again) or, globally, restores the
default. As in Triton, each set of settings in force (the global one, and one per model that sets a key)
samples on its own: every trace_rate-th of its requests while its trace_count lasts; changing it starts
that count again, and a global change re-reads what its models inherit. trace_file is set here by the
router's own configuration (``update``); a client's change (``client_update``, both front doors) may not
name it, as in Triton since 24.05: a client never chooses a file the router writes.

The file is Triton's JSON array: per trace ``{"id", "model_name", "model_version"[, "request_id"]}`` (and
our attributes), then in order one ``{"id", "timestamps": [{"name", "ns"}]}`` per mark and one
``{"id", "activity", "tensor": {"name", "data", "shape", "dtype"}}`` per tensor, data and shape being
comma-separated strings as Triton writes them and its ``trace_summary.py`` reads them. log_frequency N > 0
sends each N traces to ``<trace_file>.<k>``, k = 0, 1, ...; 0 keeps them for trace_file until flush().
When a trace_count runs out, what that setting collected goes to the next ``<trace_file>.<k>`` once its
last trace is done, whatever log_frequency says (Triton's rule).

Invariants:
- An update is checked whole (each key, and every model setting it reaches) before anything moves: a bad
  value is ``InvalidArgument`` and every setting stays as it was.
- A file is valid JSON after every write: a ``.<k>`` chunk is written whole; trace_file is created at its
  first write in this process and later traces go in before its closing bracket.
- Bounded work on the event loop: a setting buffers at most ``MAX_PENDING_TRACES`` traces or
  ``MAX_PENDING_BYTES``, then writes (so a ``.<k>`` chunk may hold fewer than log_frequency), and a
  tensor over ``MAX_TENSOR_ELEMENTS`` is recorded without its data (``data_left_out``: its element
  count). One synchronous write, in finish(), flush() or update() (which writes out what the settings it
  replaces had buffered), is then ~15 ms at most. A failed write is logged and its traces dropped
  (counted in ``dropped``): tracing never fails a request.
- ``start`` is one attribute check while nothing traces. All of it runs on the router's event loop, so
  there are no locks.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from mcpcore import dtypes
from mcpcore.errors import InvalidArgument

__all__ = ["KEYS", "LEVELS", "Trace", "Tracer", "begin", "client_update", "end"]

log = logging.getLogger(__name__)

KEYS = ("trace_file", "trace_level", "trace_rate", "trace_count", "log_frequency", "trace_mode")
LEVELS = ("TIMESTAMPS", "TENSORS")
MAX_PENDING_TRACES = 10_000
MAX_PENDING_BYTES = 16 << 20
MAX_TENSOR_ELEMENTS = 1 << 14  # formatting costs ~1 us an element
_MODE = "triton"
_ACTIVITY = {"INPUT": "TENSOR_QUEUE_INPUT", "OUTPUT": "TENSOR_BACKEND_OUTPUT"}
_HEAD_KEYS = frozenset({"id", "model_name", "model_version", "request_id", "parent_id", "timestamps"})
_INTEGER = re.compile(r"-?[0-9]+")
_INTEGERS = {  # key: lowest, highest, what it is
    "trace_rate": (1, 2**32 - 1, "a whole number >= 1 (trace 1 request in N)"),
    "trace_count": (-1, 2**31 - 1, "-1 (no limit) or a whole number >= 0 of traces still to take"),
    "log_frequency": (0, 2**32 - 1, "a whole number >= 0 (0: at flush; N: every N traces)"),
}
_json = json.JSONEncoder(separators=(",", ":")).encode


@dataclasses.dataclass(frozen=True)
class _Values:
    """One full set of settings (trace_mode is always triton). Defaults are Triton's."""

    trace_file: str = ""
    trace_level: frozenset[str] = frozenset()  # empty: OFF
    trace_rate: int = 1000
    trace_count: int = -1
    log_frequency: int = 0


_FIELDS = tuple(f.name for f in dataclasses.fields(_Values))


class _File:
    __slots__ = ("begun", "index", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self.index = 0  # the next <path>.<k>
        self.begun = False  # path itself written (as a JSON array) by this process


class _Scope:
    """One set of settings in force (Triton's TraceSetting): its values, its sampling and its buffer."""

    def __init__(self, values: _Values, specified: frozenset[str], file: _File) -> None:
        self.values = values
        self.specified = specified  # for a model: the keys it sets itself
        self.remaining = values.trace_count
        self.on = bool(values.trace_level) and values.trace_count != 0
        self.seen = 0  # requests since the last sampled one
        self.live = 0  # traces started and not finished
        self.retired = False
        self.file = file
        self.pending: list[str] = []
        self.pending_bytes = 0

    def current(self) -> _Values:
        return dataclasses.replace(self.values, trace_count=self.remaining)


class Tracer:
    """The router's trace settings and the traces they sample."""

    def __init__(self, *, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self._clock = clock_ns
        self._files: dict[str, _File] = {}
        self._global = _Scope(_Values(), frozenset(_FIELDS), self._file(""))
        self._models: dict[str, _Scope] = {}
        self._retired: list[_Scope] = []
        self._on = False  # whether any setting in force traces: the only check start() makes when none
        self._last_id = 0
        self.dropped = 0  # traces lost to failed writes

    def settings(self, model: str = "") -> dict[str, list[str]]:
        """The settings in force, globally or for ``model``."""
        scope = self._models.get(model, self._global) if model else self._global
        values = scope.current()
        return {
            "trace_file": [values.trace_file],
            "trace_level": [lv for lv in LEVELS if lv in values.trace_level] or ["OFF"],
            "trace_rate": [str(values.trace_rate)],
            "trace_count": [str(values.trace_count)],
            "log_frequency": [str(values.log_frequency)],
            "trace_mode": [_MODE],
        }

    def update(self, changes: Mapping[str, Sequence[str] | None], model: str = "") -> dict[str, list[str]]:
        """Set what ``changes`` names, globally or for ``model`` (None or [] clears a key); returns the
        settings in force after. ``InvalidArgument``, with nothing changed, for anything it cannot take."""
        parsed = _parse(changes)
        if not parsed:  # nothing to change (as Triton, for an empty request): nothing starts again
            return self.settings(model)
        new_global: _Values | None = None
        if model:
            plans = {model: self._model_plan(model, parsed, self._global.current())}
        else:
            base = self._global.current()
            new_global = dataclasses.replace(
                base, **{k: getattr(_Values(), k) if v is None else v for k, v in parsed.items()}
            )
            _check(new_global, "the global trace settings")
            plans = {
                name: self._model_plan(name, {}, new_global)
                for name, scope in self._models.items()
                if scope.specified != frozenset(_FIELDS)  # Triton re-reads only models that inherit
            }
        for name, plan in plans.items():
            if plan is not None:
                where = f"model {name!r}" if model else f"model {name!r} (inheriting this change)"
                _check(plan[0], where)
        if new_global is not None:
            self._retire(self._global)
            self._global = _Scope(new_global, frozenset(_FIELDS), self._file(new_global.trace_file))
        for name, plan in plans.items():
            old = self._models.pop(name, None)
            if plan is not None:
                self._models[name] = _Scope(plan[0], plan[1], self._file(plan[0].trace_file))
            if old is not None:
                self._retire(old)
        self._refresh()
        in_use = {s.file.path for s in (self._global, *self._models.values(), *self._retired)}
        self._files = {p: f for p, f in self._files.items() if p in in_use}
        return self.settings(model)

    def start(self, model: str, version: str, request_id: str) -> Trace | None:
        """The trace of this request, or None when it is not sampled."""
        if not self._on:
            return None
        scope = self._models.get(model, self._global)
        if not scope.on:
            return None
        scope.seen += 1
        if scope.seen < scope.values.trace_rate:
            return None
        scope.seen = 0
        if scope.remaining > 0:
            scope.remaining -= 1
            if scope.remaining == 0:
                scope.on = False
                self._refresh()
        scope.live += 1
        self._last_id += 1
        return Trace(self, scope, self._last_id, model=model, version=version, request_id=request_id)

    def flush(self) -> None:
        """Write out everything buffered (at router stop)."""
        for scope in (self._global, *self._models.values(), *self._retired):
            self._write(scope, indexed=scope.values.log_frequency > 0)
        self._retired = []

    # --- inside ---------------------------------------------------------------------------------------

    def _file(self, path: str) -> _File:
        file = self._files.get(path)
        if file is None:
            file = self._files[path] = _File(path)
        return file

    def _refresh(self) -> None:
        self._on = self._global.on or any(s.on for s in self._models.values())

    def _model_plan(
        self, name: str, parsed: Mapping[str, Any], base: _Values
    ) -> tuple[_Values, frozenset[str]] | None:
        """The values and own keys ``name`` would have after ``parsed`` over ``base``; None: no own keys."""
        old = self._models.get(name)
        own = old.current() if old is not None else base
        specified = set(old.specified) if old is not None else set()
        specified |= {k for k, v in parsed.items() if v is not None}
        specified -= {k for k, v in parsed.items() if v is None}
        if not specified:
            return None
        fields = {k: parsed[k] if parsed.get(k) is not None else getattr(own, k) for k in specified}
        return dataclasses.replace(base, **fields), frozenset(specified)

    def _retire(self, scope: _Scope) -> None:
        scope.retired = True
        if scope.live:
            self._retired.append(scope)  # its traces still running finish into it
        else:
            self._write(scope, indexed=scope.values.log_frequency > 0)

    def _collect(self, scope: _Scope, chunk: str) -> None:
        scope.live -= 1
        scope.pending.append(chunk)
        scope.pending_bytes += len(chunk)
        every = scope.values.log_frequency
        last = not scope.live and (scope.retired or scope.remaining == 0)  # no more traces will come
        if (every and len(scope.pending) >= every) or (last and scope.remaining == 0):
            self._write(scope, indexed=True)
        elif last or len(scope.pending) >= MAX_PENDING_TRACES or scope.pending_bytes >= MAX_PENDING_BYTES:
            self._write(scope, indexed=every > 0)
        if last and scope in self._retired:
            self._retired.remove(scope)

    def _write(self, scope: _Scope, *, indexed: bool) -> None:
        chunks, scope.pending, scope.pending_bytes = scope.pending, [], 0
        if not chunks:
            return
        file, body = scope.file, ",".join(chunks)
        path = f"{file.path}.{file.index}" if indexed else file.path
        try:
            if indexed:
                file.index += 1
                with open(path, "w", encoding="utf-8") as out:
                    out.write(f"[{body}]")
            elif not file.begun:
                with open(path, "w", encoding="utf-8") as out:
                    out.write(f"[{body}]")
                file.begun = True
            else:
                with open(path, "r+b") as out:
                    out.seek(-1, os.SEEK_END)  # before the closing bracket this process wrote
                    out.write(f",{body}]".encode())
        except OSError as err:
            self.dropped += len(chunks)
            log.warning("could not write %d traces to %s (%s); they are dropped", len(chunks), path, err)


class Trace:
    """One sampled request's records, each encoded as it comes; ``finish`` hands them to the file."""

    __slots__ = ("_head", "_records", "_scope", "_tensors", "_timestamps", "_tracer", "id")

    def __init__(
        self, tracer: Tracer, scope: _Scope, trace_id: int, *, model: str, version: str, request_id: str
    ) -> None:
        self._tracer, self._scope, self.id = tracer, scope, trace_id
        self._timestamps = "TIMESTAMPS" in scope.values.trace_level
        self._tensors = "TENSORS" in scope.values.trace_level
        self._head: dict[str, Any] = {"id": trace_id, "model_name": model, "model_version": _version(version)}
        if request_id:
            self._head["request_id"] = request_id
        self._records: list[str] | None = []

    def mark(self, event: str) -> None:
        """A timestamp now, e.g. Triton's REQUEST_START / REQUEST_END or our FORWARD_START / FORWARD_END."""
        if self._timestamps and self._records is not None:
            ns = self._tracer._clock()
            self._records.append(f'{{"id":{self.id},"timestamps":[{{"name":{_json(event)},"ns":{ns}}}]}}')

    def tensor(self, kind: str, name: str, array: np.ndarray) -> None:
        """An "INPUT" or "OUTPUT" tensor, recorded (copied now) at level TENSORS only."""
        activity = _ACTIVITY.get(kind)
        if activity is None:
            raise ValueError(f"tensor kind {kind!r}: use one of {sorted(_ACTIVITY)}")
        if self._tensors and self._records is not None:
            record = {"id": self.id, "activity": activity, "tensor": _tensor(name, array)}
            self._records.append(_json(record))

    def attribute(self, key: str, value: str) -> None:
        """An attribute of the request (e.g. the worker), in the trace's first record."""
        if key in _HEAD_KEYS:
            raise ValueError(f"trace attribute {key!r} is one of Triton's own fields {sorted(_HEAD_KEYS)}")
        self._head[key] = value

    def finish(self) -> None:
        """The trace is complete: to the buffer or the file. Later calls on this trace do nothing."""
        if self._records is None:
            return
        records, self._records = self._records, None
        self._tracer._collect(self._scope, ",".join((_json(self._head), *records)))


def begin(
    tracer: Tracer, model: str, version: str, request_id: str, inputs: Mapping[str, np.ndarray]
) -> Trace | None:
    """A front door's request, as it reaches the data plane: its trace (when sampled), REQUEST_START
    marked and the inputs recorded."""
    trace = tracer.start(model, version, request_id)
    if trace is not None:
        trace.mark("REQUEST_START")
        for name, array in inputs.items():
            trace.tensor("INPUT", name, array)
    return trace


def end(trace: Trace | None, outputs: Mapping[str, np.ndarray] | None = None) -> None:
    """The request answered (``outputs``) or failed (None): REQUEST_END marked, and the trace done."""
    if trace is not None:
        for name, array in (outputs or {}).items():
            trace.tensor("OUTPUT", name, array)
        trace.mark("REQUEST_END")
        trace.finish()


def client_update(
    tracer: Tracer, changes: Mapping[str, Sequence[str] | None], model: str = ""
) -> dict[str, list[str]]:
    """A change a client asked for (TraceSetting, ``/v2[/models/{m}]/trace/setting``): any setting but
    trace_file, which only the router's configuration sets."""
    if "trace_file" in changes:
        raise InvalidArgument(
            "trace_file cannot be set over the network (as in Triton): the router's configuration names "
            "it (trace_file, MCP_ROUTER_TRACE_FILE); set the other settings here"
        )
    return tracer.update(changes, model)


# --- values in ----------------------------------------------------------------------------------------


def _parse(changes: Mapping[str, Sequence[str] | None]) -> dict[str, Any]:
    """Each change as a typed value, or None to clear; trace_mode is only checked (it is always triton)."""
    parsed: dict[str, Any] = {}
    for key, raw in changes.items():
        if key not in KEYS:
            raise InvalidArgument(f"unknown trace setting {key!r}; the settings are {', '.join(KEYS)}")
        values = _strings(key, raw)
        if key == "trace_mode":
            if values and values != [_MODE]:
                raise InvalidArgument(
                    f"trace_mode {values} is not served: this router traces in triton mode only (a JSON "
                    "trace file); leave trace_mode 'triton'"
                )
        elif not values:
            parsed[key] = None
        elif key == "trace_level":
            parsed[key] = _level(values)
        elif key == "trace_file":
            parsed[key] = _path(_one(key, values))
        else:
            parsed[key] = _integer(key, values, *_INTEGERS[key])
    return parsed


def _strings(key: str, raw: object) -> list[str]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [raw]  # REST may send a bare string
    items = list(raw) if isinstance(raw, Iterable) and not isinstance(raw, (bytes, Mapping)) else None
    if items is None or not all(isinstance(v, str) for v in items):
        raise InvalidArgument(f"trace setting {key} takes a list of strings, got {raw!r}")
    return items


def _one(key: str, values: list[str]) -> str:
    if len(values) != 1:
        raise InvalidArgument(f"trace setting {key} takes one value, got {values}")
    return values[0]


def _integer(key: str, values: list[str], low: int, high: int, what: str) -> int:
    text = _one(key, values)
    if not _INTEGER.fullmatch(text) or not low <= int(text) <= high:
        raise InvalidArgument(f"{key} must be {what}, at most {high}; got {text!r}")
    return int(text)


def _level(values: list[str]) -> frozenset[str]:
    if "OFF" in values:
        if len(values) != 1:
            raise InvalidArgument(
                f"trace_level {values}: OFF stands alone (it turns tracing off); to trace, give TIMESTAMPS "
                "and/or TENSORS"
            )
        return frozenset()
    for value in values:
        if value not in LEVELS:
            raise InvalidArgument(
                f"unknown trace_level {value!r}; the levels are OFF (alone), {', '.join(LEVELS)}"
            )
    return frozenset(values)


def _path(path: str) -> str:
    if not path:
        return path
    if os.path.isdir(path):
        raise InvalidArgument(
            f"trace_file {path!r} is a directory; name a file in it, e.g. {path}/trace.json"
        )
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise InvalidArgument(f"trace_file {path!r}: directory {parent!r} does not exist; create it first")
    return path


def _check(values: _Values, where: str) -> None:
    if values.trace_level and not values.trace_file:
        levels = ", ".join(lv for lv in LEVELS if lv in values.trace_level)
        raise InvalidArgument(
            f"{where} would trace at {levels} with no file: set trace_file (a path in an existing "
            "directory) too, or leave trace_level OFF"
        )


# --- records out --------------------------------------------------------------------------------------


def _version(version: str) -> int | str:
    """Triton's model_version is a number, -1 when the request named none."""
    if not version:
        return -1
    return int(version) if version.isascii() and version.isdigit() else version


def _tensor(name: str, array: np.ndarray) -> dict[str, Any]:
    try:
        dtype = dtypes.from_numpy(array.dtype)
    except InvalidArgument:
        dtype = str(array.dtype)
    shape = ",".join(map(str, array.shape))
    if array.size > MAX_TENSOR_ELEMENTS:
        return {"name": name, "data": "", "shape": shape, "dtype": dtype, "data_left_out": array.size}
    flat = array.reshape(-1)
    kind = array.dtype.kind
    if kind in "OSU":  # BYTES: each element quoted, as Triton does (a CSV row)
        data = ",".join(_quoted(v) for v in flat)
    elif kind == "b":
        data = ",".join("1" if v else "0" for v in flat.tolist())
    elif kind in "iu":
        data = ",".join(map(str, flat.tolist()))
    else:  # numpy's shortest form per dtype ("0.1" for a float32 0.1); BF16 by way of FP32
        data = ",".join(map(str, flat.astype(np.float32) if dtype == "BF16" else flat))
    return {"name": name, "data": data, "shape": shape, "dtype": dtype}


def _quoted(value: object) -> str:
    text = value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)
    return '"' + text.replace('"', '""') + '"'
