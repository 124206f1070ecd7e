"""Canary split: sticky per key by hash, smooth weighted round robin without a key, and choose_version."""

from collections import Counter
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_router.routing.split import SmoothWeightedRoundRobin, canary_for_key, choose_version

KEYS = [f"user-{i}" for i in range(2000)]


# -- sticky split by key ----------------------------------------------------------------------------


def test_bucket_is_fixed_across_processes() -> None:
    # xxh3_64(b"v2\0user-42") % 10_000 == 2584, computed once: guards against a salted hash().
    assert not canary_for_key("user-42", 25, salt="v2")
    assert canary_for_key("user-42", 26, salt="v2")


def test_ten_percent_of_keys() -> None:
    share = sum(canary_for_key(k, 10, salt="v2") for k in KEYS) / len(KEYS)
    assert 0.07 <= share <= 0.13


def test_sticky_per_key_and_salted() -> None:
    first = [canary_for_key(k, 30, salt="v2") for k in KEYS]
    assert [canary_for_key(k, 30, salt="v2") for k in KEYS] == first
    assert [canary_for_key(k, 30, salt="v3") for k in KEYS] != first  # a new canary, a new cohort


@given(st.text(), st.integers(0, 100), st.integers(0, 100))
def test_raising_the_percent_keeps_canary_keys(key: str, low: int, high: int) -> None:
    low, high = min(low, high), max(low, high)
    if canary_for_key(key, low, salt="v2"):
        assert canary_for_key(key, high, salt="v2")


@pytest.mark.parametrize(("percent", "expected"), [(0, False), (-5, False), (100, True), (150, True)])
def test_percent_bounds(percent: int, expected: bool) -> None:
    assert {canary_for_key(k, percent, salt="v2") for k in KEYS[:100]} == {expected}


# -- smooth weighted round robin --------------------------------------------------------------------


def test_nginx_sequence() -> None:
    rr = SmoothWeightedRoundRobin({"a": 5, "b": 1, "c": 1})
    assert "".join(rr.pick() for _ in range(14)) == "aabacaa" * 2


def test_ninety_ten_is_exact_and_smooth() -> None:
    rr = SmoothWeightedRoundRobin({"stable": 90, "canary": 10})
    picks = [rr.pick() for _ in range(100)]
    assert Counter(picks) == {"stable": 90, "canary": 10}
    at = [i for i, v in enumerate(picks) if v == "canary"]
    assert [b - a for a, b in pairwise(at)] == [10] * 9  # evenly spread, never bunched


@given(st.dictionaries(st.text(min_size=1, max_size=4), st.integers(0, 20), min_size=1, max_size=6))
def test_every_period_is_exact(weights: dict[str, int]) -> None:
    if not any(weights.values()):
        with pytest.raises(ValueError, match="positive weight"):
            SmoothWeightedRoundRobin(weights)
        return
    rr = SmoothWeightedRoundRobin(weights)
    period = sum(weights.values())
    for _ in range(2):
        counts = Counter(rr.pick() for _ in range(period))
        assert counts == {v: w for v, w in weights.items() if w > 0}


def test_deterministic() -> None:
    a, b = (SmoothWeightedRoundRobin({"x": 3, "y": 2, "z": 1}) for _ in range(2))
    assert [a.pick() for _ in range(30)] == [b.pick() for _ in range(30)]


@pytest.mark.parametrize("weight", [-1, 1.5, "3"])
def test_bad_weight(weight: object) -> None:
    with pytest.raises(ValueError, match="'x'"):
        SmoothWeightedRoundRobin({"x": weight, "y": 1})  # type: ignore[dict-item]


def test_for_canary() -> None:
    assert SmoothWeightedRoundRobin.for_canary("1", "2", 10).weights == {"1": 90, "2": 10}
    assert SmoothWeightedRoundRobin.for_canary("1", "2", 100).weights == {"1": 0, "2": 100}


# -- choose_version ---------------------------------------------------------------------------------


def test_no_canary_means_stable() -> None:
    assert choose_version("1", None, 50, "k", None) == "1"
    assert choose_version("1", "2", 0, None, None) == "1"
    assert choose_version("1", "1", 50, None, None) == "1"
    assert choose_version("1", "2", 100, None, None) == "2"


def test_keyed_requests_follow_the_hash() -> None:
    for key in KEYS[:200]:
        expected = "2" if canary_for_key(key, 10, salt="2") else "1"
        assert choose_version("1", "2", 10, key, None) == expected


def test_keyless_requests_use_the_round_robin() -> None:
    rr = SmoothWeightedRoundRobin.for_canary("1", "2", 10)
    picks = Counter(choose_version("1", "2", 10, None, rr) for _ in range(100))
    assert picks == {"1": 90, "2": 10}
    assert choose_version("1", "2", 10, "", rr) in {"1", "2"}  # "" is proto3's unset key: no key
    with pytest.raises(ValueError, match="without a key"):
        choose_version("1", "2", 10, None, None)
