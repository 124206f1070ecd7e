"""What the fuzz tests share: the hypothesis settings in force, and the checks every answer must pass.

- Default (``make test``): few examples per test, derandomized, so the whole folder costs well under a
  minute and fails the same way on every run.
- ``MCP_FUZZ_EXAMPLES=N`` (``make chaos``): N examples per test, random seeds: the long search.

Settings are applied per test (``@fuzz_settings()``), never loaded as the session's default: the other
hypothesis tests of the suite keep theirs.
"""

from __future__ import annotations

import os
from typing import Any

from harness import metric
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from mcpcore.errors import SERVER_SIDE_CLASSES

__all__ = ["HOSTILE_NAMES", "LONG", "assert_clear", "fuzz_settings", "hostile_text", "model_health"]

LONG = int(os.environ.get("MCP_FUZZ_EXAMPLES", "0") or 0)
_CHECKS = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]

#: Names a hostile peer tries first: paths, empty, long, NUL, unicode, format strings.
HOSTILE_NAMES = (
    "",
    "../../etc/passwd",
    "..%2f..%2fetc",
    "/",
    ".",
    "a/b",
    "\x00",
    "demo-mlp\x00",
    "x" * 10_000,
    "é",
    "\u202e",
    "%s%n",
    "{0}",
    " ",
    "demo-mlp ",
)


def fuzz_settings(examples: int = 25) -> settings:
    """The settings of one fuzz test: ``examples`` derandomized in ``make test`` (a test whose examples
    cost more asks for fewer), ``MCP_FUZZ_EXAMPLES`` random ones in ``make chaos``."""
    return settings(
        max_examples=LONG or examples,
        derandomize=not LONG,
        deadline=None,
        suppress_health_check=_CHECKS,
        database=None,
        print_blob=True,
    )


def hostile_scalars(bound: int, *more: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    """None, booleans, integers up to +-``bound``, non-finite floats, and ``more``."""
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.integers(min_value=-bound, max_value=bound),
        st.floats(allow_nan=True, allow_infinity=True),
        *more,
    )


def hostile_json(max_size: int, max_leaves: int) -> st.SearchStrategy[object]:
    """Any JSON value (huge and non-finite numbers, hostile strings), nested in lists and objects."""
    return st.recursive(
        hostile_scalars(1 << 80, hostile_text(20)),
        lambda inner: st.one_of(
            st.lists(inner, max_size=max_size), st.dictionaries(hostile_text(10), inner, max_size=max_size)
        ),
        max_leaves=max_leaves,
    )


def hostile_text(max_size: int = 64) -> st.SearchStrategy[str]:
    """Known-hostile names, or any text (unicode, controls, NUL) up to ``max_size``."""
    return st.one_of(st.sampled_from(HOSTILE_NAMES), st.text(max_size=max_size))


def assert_clear(message: str, what: str = "") -> None:
    """An error message a person can act on: not empty, no Python traceback or repr of an exception
    object, bounded in size."""
    assert message.strip(), f"empty error message {what}"
    assert "Traceback" not in message, f"traceback in an error message {what}: {message[:2000]}"
    assert 'File "' not in message, f"a source location in an error message {what}: {message[:2000]}"
    assert len(message) < 20_000, f"an error message of {len(message)} characters {what}"


def model_health(router: Any, model: str) -> tuple[float, float]:
    """(``model``'s server-side errors, the router's loop errors) from a router process's /metrics: what
    client garbage must never raise (the breaker reads the first; DESIGN.md section 8)."""
    text = router.metrics_text()
    served = sum(
        metric(text, "mcp_request_errors_total", model=model, error_class=c) for c in SERVER_SIDE_CLASSES
    )
    return served, metric(text, "mcp_loop_errors_total")
