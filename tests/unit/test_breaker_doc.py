"""The breaker level document (``/mcp/breakers/<m>``): an operator document, strict; errors name the key."""

import pytest

from mcpcore.errors import InvalidArgument
from mcpcore.records import BreakerDoc

KEY = "/mcp/breakers/demo-mlp"


def test_round_trip_and_defaults():
    doc = BreakerDoc(level=2, reason="error rate 0.65", since=10.0, set_by="health", until=None)
    assert BreakerDoc.parse(KEY, doc.to_json()) == doc
    assert BreakerDoc.parse(KEY, b'{"level": 1}') == BreakerDoc(level=1)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"{level: 1}", "not JSON"),
        (b"[1]", "JSON object"),
        (b'{"level": 4}', "/mcp/breakers/demo-mlp: level: must be an integer 0..3, got 4"),
        (b'{"level": "1"}', "level: must be an integer"),
        (b'{"level": true}', "level: must be an integer"),
        (b'{"level": 1, "untill": 5}', r"unknown field\(s\) \['untill'\]"),
        (b'{"level": 1, "until": "tomorrow"}', "until: must be a unix time"),
        (b'{"level": 1, "reason": 5}', "reason: must be a string"),
    ],
)
def test_operator_typos_are_rejected_by_name(raw, match):
    with pytest.raises(InvalidArgument, match=match):
        BreakerDoc.parse(KEY, raw)


def test_deeply_nested_json_is_rejected_not_crashing():
    with pytest.raises(InvalidArgument, match="not JSON"):
        BreakerDoc.parse(KEY, b"[" * 100_000 + b"]" * 100_000)


def test_level_in_force_ends_at_until():
    doc = BreakerDoc(level=3, until=100.0)
    assert doc.level_at(99.9) == 3 and doc.level_at(100.0) == 0
    assert BreakerDoc(level=2).level_at(1e12) == 2
