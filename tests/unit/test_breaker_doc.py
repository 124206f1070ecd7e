import pytest

from mcpcore.breaker import BreakerDoc, breaker_to_json, parse_breaker
from mcpcore.errors import InvalidArgument


def test_round_trip_and_defaults():
    doc = BreakerDoc(level=2, reason="error rate 0.65", since=10.0, set_by="health", until=None)
    assert parse_breaker("m", breaker_to_json(doc)) == doc
    assert parse_breaker("m", b'{"level": 1}') == BreakerDoc(level=1)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"{level: 1}", "not JSON"),
        (b"[1]", "JSON object"),
        (b'{"level": 4}', "level: must be an integer 0..3, got 4"),
        (b'{"level": "1"}', "level: must be an integer"),
        (b'{"level": true}', "level: must be an integer"),
        (b'{"level": 1, "untill": 5}', r"unknown field\(s\) \['untill'\]"),
        (b'{"level": 1, "until": "tomorrow"}', "until: must be a unix time"),
        (b'{"level": 1, "reason": 5}', "reason: must be a string"),
    ],
)
def test_operator_typos_are_rejected_by_name(raw, match):
    with pytest.raises(InvalidArgument, match=match):
        parse_breaker("demo-mlp", raw)


def test_deeply_nested_json_is_rejected_not_crashing():
    with pytest.raises(InvalidArgument, match="not JSON"):
        parse_breaker("m", b"[" * 100_000 + b"]" * 100_000)


def test_level_in_force_ends_at_until():
    doc = BreakerDoc(level=3, until=100.0)
    assert doc.level_at(99.9) == 3 and doc.level_at(100.0) == 0
    assert BreakerDoc(level=2).level_at(1e12) == 2
