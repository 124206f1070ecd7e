"""Triton's log settings (``LogSettings``, ``/v2/logging``) over this process's Python logging.

Triton's settings are ``log_file``, ``log_info``, ``log_warning``, ``log_error``, ``log_verbose_level``
and ``log_format``. Here they are read from, and written to, the root logger's level, so what a client
sets is what the router logs: verbose > 0 is DEBUG, else info INFO, else warning WARNING, else error
ERROR, else nothing.

Invariants: a change is checked whole before anything moves (an unknown setting, a wrong type, or a mix
a threshold cannot express, e.g. info on and warning off, is ``InvalidArgument`` and the level stays);
logs go to stderr in the default format, so ``log_file`` must stay "" and ``log_format`` "default".
Pure: no I/O beyond the logging module.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping

from mcpcore.errors import InvalidArgument

__all__ = ["SETTINGS", "apply", "current"]

Value = bool | int | str
SETTINGS: dict[str, type] = {
    "log_file": str,
    "log_info": bool,
    "log_warning": bool,
    "log_error": bool,
    "log_verbose_level": int,
    "log_format": str,
}
_OFF = logging.CRITICAL + 1


def current(logger: logging.Logger | None = None) -> dict[str, Value]:
    level = (logger or logging.getLogger()).getEffectiveLevel()
    return {
        "log_file": "",
        "log_info": level <= logging.INFO,
        "log_warning": level <= logging.WARNING,
        "log_error": level <= logging.ERROR,
        "log_verbose_level": 1 if level <= logging.DEBUG else 0,
        "log_format": "default",
    }


def apply(changes: Mapping[str, Value], logger: logging.Logger | None = None) -> dict[str, Value]:
    """Set what ``changes`` names (the rest as it is); returns every setting after."""
    target = logger or logging.getLogger()
    merged = current(target)
    for key, value in changes.items():
        kind = SETTINGS.get(key)
        if kind is None:
            raise InvalidArgument(f"unknown log setting {key!r}; the settings are {sorted(SETTINGS)}")
        if not isinstance(value, kind) or (kind is int and (isinstance(value, bool) or value < 0)):
            raise InvalidArgument(f"log setting {key} must be a {kind.__name__}, got {value!r}")
        merged[key] = value
    if merged["log_file"]:
        raise InvalidArgument("log_file is not supported: the router logs to stderr (redirect it there)")
    if merged["log_format"] != "default":
        raise InvalidArgument(
            f"log_format {merged['log_format']!r} is not supported; the format is 'default'"
        )
    flags = [merged["log_error"], merged["log_warning"], merged["log_info"], merged["log_verbose_level"] > 0]
    if any(later and not earlier for earlier, later in itertools.pairwise(flags)):
        raise InvalidArgument(
            "log levels here are a threshold: turning on info (or verbose) needs warning and error on, and "
            "warning needs error"
        )
    if merged["log_verbose_level"]:
        level = logging.DEBUG
    elif merged["log_info"]:
        level = logging.INFO
    elif merged["log_warning"]:
        level = logging.WARNING
    elif merged["log_error"]:
        level = logging.ERROR
    else:
        level = _OFF
    target.setLevel(level)
    return current(target)
