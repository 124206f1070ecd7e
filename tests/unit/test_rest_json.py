"""The REST front door's JSON reader and writer (orjson, with the standard library where orjson would read
or write otherwise) against the standard library: every document is read to the same values, and every
reply reads back the same. The real router's side is in tests/integration/test_rest.py."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from mcp_router.frontends.kserve_rest_json import dumps, loads

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()  # unbounded: past 64 bits too
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(st.characters(exclude_categories=()))  # lone surrogates too
)
DOCS = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=25,
)


def finite(doc: Any) -> bool:
    if isinstance(doc, float):
        return math.isfinite(doc)
    if isinstance(doc, list):
        return all(finite(x) for x in doc)
    if isinstance(doc, dict):
        return all(finite(x) for x in doc.values())
    return True


@settings(max_examples=300, deadline=None)
@given(DOCS)
@example(10**20)
@example([18446744073709551616, -9223372036854775809, 9223372036854775807])
@example([float("nan"), float("inf"), -0.0, 5e-324])
@example({"id": "\ud800", "x": "réq ✓"})
def test_a_document_reads_as_the_standard_library_reads_it(doc):
    for raw in (
        json.dumps(doc).encode(),  # ASCII, NaN and Infinity as literals
        json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogatepass"),
    ):
        assert repr(loads(raw)) == repr(json.loads(raw))  # repr: types too (1 is not 1.0), NaN equal


def test_what_neither_reads_is_refused_with_the_standard_librarys_error():
    deep = b'{"a":' * 1000 + b"1" + b"}" * 1000  # orjson reads 1,024 levels; the standard library fewer
    for raw in (b"{not json", b"[1,2,]", b"", b'{"a": 1e5', b"[" * 1000 + b"]" * 1000, deep):
        try:
            json.loads(raw)
        except (ValueError, RecursionError) as exc:
            want = f"{type(exc).__name__}: {exc}"
        try:
            loads(raw)
        except (ValueError, RecursionError) as exc:
            assert f"{type(exc).__name__}: {exc}" == want
        else:
            raise AssertionError(f"{raw!r} was read")


@settings(max_examples=300, deadline=None)
@given(DOCS)
@example({"data": [float("nan"), 1.0]})
@example({"n": 1 << 70, "id": "\udc80"})
def test_a_reply_reads_back_as_the_standard_librarys_would(doc):
    wrapped = {"outputs": doc}
    written = dumps(wrapped, finite=finite(doc))
    assert repr(json.loads(written)) == repr(json.loads(json.dumps(wrapped)))  # NaN stays NaN, not null
