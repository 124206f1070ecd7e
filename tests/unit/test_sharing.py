"""Weighted sharing: the article's calculate_weights with its defects fixed, and the stride scheduler."""

import itertools
import math
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_worker.batching.compute_shares import MIN_SHARE, ModelShare, StrideScheduler, calculate_weights

shares = st.builds(
    ModelShare,
    priority=st.integers(-5, 1000),
    latency_sensitivity=st.floats(0.0, 1.0),
)
loads = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(0.0, 1.0))


@given(st.lists(shares, min_size=1, max_size=20), loads)
def test_weights_sum_to_one_and_stay_above_the_floor(models, load):
    weights = calculate_weights(models, load)
    assert len(weights) == len(models)
    assert math.isclose(sum(weights), 1.0, rel_tol=1e-9)
    floor = MIN_SHARE / len(models)
    assert all(math.isfinite(w) and w >= floor * (1 - 1e-9) and w > 0 for w in weights)


@given(
    st.lists(st.integers(-5, 1000), min_size=2, max_size=10),
    st.floats(0.0, 1.0),
    st.floats(0.0, 2.0),
)
def test_monotone_in_priority_for_equal_sensitivity(priorities, sensitivity, load):
    models = [ModelShare(p, sensitivity) for p in priorities]
    weights = calculate_weights(models, load)
    ranked = sorted(zip(priorities, weights, strict=True))
    for (_, w_lo), (_, w_hi) in itertools.pairwise(ranked):
        assert w_lo <= w_hi * (1 + 1e-9)


def test_no_division_by_zero_when_all_are_fully_latency_sensitive_at_high_load():
    # The article's code divides 0 by 0 here; every model is reduced alike, so the base shares stand.
    weights = calculate_weights([ModelShare(3, 1.0), ModelShare(1, 1.0)], system_load=1.0)
    assert weights[0] / weights[1] == pytest.approx((0.95 * 0.75 + 0.025) / (0.95 * 0.25 + 0.025))


def test_a_fully_reduced_model_keeps_a_share():
    weights = calculate_weights([ModelShare(1, 1.0), ModelShare(1, 0.0)], system_load=0.9)
    assert weights[0] == pytest.approx(MIN_SHARE / 2)
    assert sum(weights) == pytest.approx(1.0)


def test_edge_inputs():
    assert calculate_weights([], 0.5) == []
    assert calculate_weights([ModelShare(0, 0.5)] * 4, 0.5) == pytest.approx([0.25] * 4)
    assert calculate_weights([ModelShare(-3, 0.5), ModelShare(0, 0.5)], 0.2) == pytest.approx([0.5, 0.5])
    # NaN and negative loads count as no load: the priorities decide alone.
    for load in (math.nan, -1.0, 0.0):
        assert calculate_weights([ModelShare(3, 1.0), ModelShare(1, 0.0)], load) == pytest.approx(
            [0.95 * 0.75 + 0.025, 0.95 * 0.25 + 0.025]
        )
    assert sum(calculate_weights([ModelShare(10**400, 0.5), ModelShare(1, 0.5)], 0.5)) == pytest.approx(1)


def test_load_shrinks_latency_sensitive_models_from_the_knee():
    models = [ModelShare(1, 1.0), ModelShare(1, 0.0)]
    low, knee, high = (calculate_weights(models, x)[0] for x in (0.2, 0.8, 1.0))
    assert low > knee
    assert knee == pytest.approx(high)


def test_stride_picks_in_proportion_to_weights():
    sched = StrideScheduler()
    weights = {"a": 0.5, "b": 0.3, "c": 0.2}
    counts = Counter(sched.pick(["a", "b", "c"], weights) for _ in range(1000))
    assert counts == {"a": 500, "b": 300, "c": 200}


def test_stride_gives_no_burst_to_a_model_back_from_idle():
    sched = StrideScheduler()
    weights = {"a": 0.5, "b": 0.5}
    for _ in range(100):
        sched.pick(["a"], weights)  # b idle meanwhile
    picks = [sched.pick(["a", "b"], weights) for _ in range(20)]
    assert abs(picks.count("b") - 10) <= 1  # alternates: no run of 100 b's to "catch up"
    assert "aa" not in "".join(picks[1:]) and "bb" not in "".join(picks[1:])


def test_stride_survives_zero_missing_and_nan_weights():
    sched = StrideScheduler()
    picks = Counter(sched.pick(["a", "b"], {"a": 1.0, "b": math.nan}) for _ in range(100))
    assert picks["a"] == 99 and picks["b"] == 1  # served rarely, but served
    with pytest.raises(ValueError, match="at least one"):
        sched.pick([], {})
    sched.forget("b")
    assert sched.pick(["b"], {}) == "b"
