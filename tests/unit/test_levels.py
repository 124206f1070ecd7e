import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_health.levels import BreakerController, Decision, error_rate
from mcpcore.errors import InvalidArgument
from mcpcore.records.breaker import DEFAULT_POLICY, BreakerDoc

COOL = DEFAULT_POLICY.cool_down_s  # 300 s
MANY = 412  # requests: well above min_requests


def window(requests, **errors):
    counts = dict.fromkeys(("timeout", "resource", "backend", "unavailable", "client"), 0)
    return {"router": "r1", "window_s": 30.0, "at": 1.0, "requests": requests, **counts, **errors}


class Model:
    """One model's breaker as the health service sees it: the doc in force follows each decision."""

    def __init__(self, controller=None, doc=None):
        self.controller = controller or BreakerController(DEFAULT_POLICY)
        self.doc = doc

    def tick(self, rate, now, requests=MANY):
        decision = self.controller.decide("m", rate, requests, now, self.doc)
        if decision is not None:
            self.doc = decision.doc
        return decision

    @property
    def level(self):
        return 0 if self.doc is None else self.doc.level


# --- error_rate -------------------------------------------------------------------------------------------


def test_error_rate_sums_routers_and_counts_server_side_classes_only():
    rate, requests = error_rate(
        [window(100, timeout=10, resource=5, client=50), window(300, backend=20, unavailable=5, client=200)]
    )
    assert (rate, requests) == (40 / 400, 400)


def test_error_rate_of_nothing_and_cap():
    assert error_rate([]) == (0.0, 0)
    assert error_rate([window(0, timeout=3)]) == (0.0, 0)
    assert error_rate([window(10, timeout=8, resource=8)]) == (1.0, 10)  # inconsistent windows: capped
    assert error_rate([{"requests": 50}]) == (0.0, 50)  # missing classes count as 0


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "3", True, None])
def test_error_rate_rejects_bad_counts_by_name(bad):
    with pytest.raises(InvalidArgument, match=r"stats\[1\].timeout: must be a count >= 0"):
        error_rate([window(10), window(10, timeout=bad)])


def test_client_errors_alone_never_raise_a_level():
    model = Model()
    rate, requests = error_rate([window(1000, client=1000)])
    assert rate == 0.0
    assert model.tick(rate, 0.0, requests) is None
    assert model.level == 0


# --- stepping up ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "level", "threshold"), [(0.35, 1, "0.3"), (0.65, 2, "0.6"), (0.95, 3, "0.9")]
)
def test_rates_raise_levels_at_once_from_closed(rate, level, threshold):
    decision = BreakerController(DEFAULT_POLICY).decide("m", rate, MANY, 100.0, None)
    assert decision == Decision(
        model="m",
        level=level,
        previous=0,
        reason=f"error rate {rate:.2f} >= {threshold} over 30s ({MANY} requests)",
        doc=BreakerDoc(level=level, reason=decision.reason, since=100.0, set_by="health", until=None),
    )
    assert BreakerDoc.parse("breaker of m", decision.doc.to_json()) == decision.doc


def test_reason_reads_like_the_design():
    decision = BreakerController(DEFAULT_POLICY).decide("m", 0.65, 412, 0.0, None)
    assert decision.reason == "error rate 0.65 >= 0.6 over 30s (412 requests)"


def test_reason_never_rounds_a_rate_onto_the_wrong_side():
    decision = BreakerController(DEFAULT_POLICY).decide("m", 0.5999, MANY, 0.0, None)
    assert decision.level == 1 and decision.reason.startswith("error rate 0.5999 >= 0.3")
    decision = BreakerController(DEFAULT_POLICY).decide("m", 0.2999, MANY, 0.0, None)
    assert decision is None


def test_stepping_up_between_levels():
    model = Model()
    assert model.tick(0.35, 0.0).level == 1
    assert model.tick(0.4, 10.0) is None  # still level 1
    step = model.tick(0.65, 20.0)
    assert (step.previous, step.level) == (1, 2)
    step = model.tick(0.95, 30.0)
    assert (step.previous, step.level) == (2, 3)
    assert model.tick(1.0, 40.0) is None  # nothing above 3


def test_too_few_requests_change_nothing():
    model = Model()
    assert model.tick(0.95, 0.0, requests=19) is None
    assert model.tick(0.95, 1.0, requests=20).level == 3
    # at level 3, a quiet model with too little evidence neither steps down nor runs the cool-down
    for t in range(10, 2000, 10):
        assert model.tick(0.0, float(t), requests=3) is None
    assert model.tick(0.0, 2000.0) is None  # evidence again: the cool-down starts now
    assert model.tick(0.0, 2000.0 + COOL).level == 2


def test_min_requests_comes_from_the_policy():
    policy = dataclasses.replace(DEFAULT_POLICY, min_requests=1)
    assert BreakerController(policy).decide("m", 1.0, 1, 0.0, None).level == 3


# --- stepping down ----------------------------------------------------------------------------------------


def test_steps_down_one_level_per_full_cool_down():
    model = Model()
    model.tick(0.95, 0.0)
    assert model.tick(0.05, 10.0) is None  # below 0.9: the timer starts
    assert model.tick(0.05, 10.0 + COOL - 1) is None
    step = model.tick(0.05, 10.0 + COOL)
    assert (step.previous, step.level) == (3, 2)
    assert step.reason == "error rate 0.05 < 0.9 for 5m: stepping down"
    assert step.doc.since == 10.0 + COOL and step.doc.set_by == "health" and step.doc.until is None
    assert model.tick(0.05, 10.0 + 2 * COOL - 1) is None  # the next step needs a full cool-down again
    assert model.tick(0.05, 10.0 + 2 * COOL).level == 1
    assert model.tick(0.05, 10.0 + 3 * COOL).level == 0
    assert model.tick(0.0, 10.0 + 10 * COOL) is None


def test_timer_restarts_when_the_rate_rises_again():
    model = Model()
    model.tick(0.65, 0.0)
    assert model.tick(0.1, 10.0) is None
    assert model.tick(0.7, 200.0) is None  # back above 0.6 (no change of level): the timer restarts
    assert model.tick(0.1, 250.0) is None
    assert model.tick(0.1, 10.0 + COOL) is None  # 310: would have stepped without the restart
    assert model.tick(0.1, 250.0 + COOL - 1) is None
    assert model.tick(0.1, 250.0 + COOL).level == 1


def test_only_the_current_levels_threshold_matters_for_stepping_down():
    model = Model()
    model.tick(0.95, 0.0)
    assert model.tick(0.7, 1.0) is None
    assert model.tick(0.7, 1.0 + COOL).level == 2
    assert model.tick(0.7, 1.0 + 10 * COOL) is None  # 0.7 holds level 2


def test_a_rise_after_a_step_down_goes_up_at_once():
    model = Model()
    model.tick(0.95, 0.0)
    model.tick(0.1, 1.0)
    assert model.tick(0.1, 1.0 + COOL).level == 2
    assert model.tick(0.95, 2.0 + COOL).level == 3


# --- operators and the doc in force -----------------------------------------------------------------------


def test_forced_level_with_expiry_wins_until_it_expires():
    forced = BreakerDoc(level=0, reason="maintenance", since=0.0, set_by="ops", until=1000.0)
    model = Model(doc=forced)
    assert model.tick(0.95, 10.0) is None
    assert model.tick(0.95, 999.9) is None
    step = model.tick(0.95, 1000.0)  # expired: evaluation resumes from the level in force, 0
    assert (step.previous, step.level, step.doc.set_by) == (0, 3, "health")


def test_forced_high_level_expires_to_closed_and_evaluation_starts_afresh():
    model = Model()
    model.tick(0.65, 0.0)
    model.tick(0.1, 1.0)  # health's cool-down timer runs ...
    model.doc = BreakerDoc(level=3, reason="incident", since=100.0, set_by="ops", until=200.0)
    assert model.tick(0.1, 1.0 + COOL) is None  # ... but the operator's level holds
    assert model.tick(0.1, 200.0 + 1) is None  # expired: level 0 in force, nothing to do
    assert model.tick(0.35, 1000.0).level == 1


def test_forced_level_without_expiry_is_permanent():
    for doc in (
        BreakerDoc(level=2, set_by="ops"),
        BreakerDoc(level=0),
        BreakerDoc.parse("breaker of m", b'{"level": 1}'),
    ):
        model = Model(doc=doc)
        for t, rate in ((0.0, 0.95), (1e6, 0.0), (1e9, 1.0)):
            assert model.tick(rate, t) is None
        assert model.doc is doc
    model.doc = None  # the operator deleted the doc: health takes over again
    assert model.tick(0.95, 2e9).level == 3


def test_current_doc_is_the_truth():
    controller = BreakerController(DEFAULT_POLICY)
    first = controller.decide("m", 0.95, MANY, 0.0, None)
    assert first.level == 3
    # the doc was deleted: level 0 is in force, so a high rate raises it again
    again = controller.decide("m", 0.65, MANY, 10.0, None)
    assert (again.previous, again.level) == (0, 2)
    # a doc written by health elsewhere (a restart): adopted, with a fresh timer
    elsewhere = BreakerDoc(level=1, set_by="health", since=5.0)
    assert controller.decide("m", 0.0, MANY, 20.0, elsewhere) is None
    assert controller.decide("m", 0.0, MANY, 20.0 + COOL - 1, elsewhere) is None
    assert controller.decide("m", 0.0, MANY, 20.0 + COOL, elsewhere).level == 0


def test_models_are_independent_and_forget_drops_memory():
    controller = BreakerController(DEFAULT_POLICY)
    doc_a = controller.decide("a", 0.95, MANY, 0.0, None).doc
    doc_b = controller.decide("b", 0.35, MANY, 0.0, None).doc
    assert controller.decide("a", 0.0, MANY, 1.0, doc_a) is None
    assert controller.decide("b", 0.0, MANY, 1.0, doc_b) is None
    controller.forget("a")
    assert controller.decide("a", 0.0, MANY, 1.0 + COOL, doc_a) is None  # timer restarted by forget
    assert controller.decide("b", 0.0, MANY, 1.0 + COOL, doc_b).level == 0


def test_a_smaller_policy_steps_down_from_levels_it_no_longer_has():
    controller = BreakerController(DEFAULT_POLICY)
    doc = controller.decide("m", 0.95, MANY, 0.0, None).doc
    controller.policy = dataclasses.replace(DEFAULT_POLICY, levels=DEFAULT_POLICY.levels[:1])
    assert controller.decide("m", 0.95, MANY, 1.0, doc) is None  # 0.95 >= the highest threshold, 0.3
    assert controller.decide("m", 0.1, MANY, 2.0, doc) is None
    assert controller.decide("m", 0.1, MANY, 2.0 + COOL, doc).level == 2


@pytest.mark.parametrize("rate", [-0.1, 1.5, float("nan")])
def test_rate_out_of_range_is_a_bug(rate):
    with pytest.raises(ValueError, match="error rate must be in"):
        BreakerController(DEFAULT_POLICY).decide("m", rate, MANY, 0.0, None)


# --- the property -----------------------------------------------------------------------------------------

RATES = st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.0, 0.05, 0.3, 0.35, 0.6, 0.65, 0.9, 0.95, 1.0]))
STEPS = st.lists(
    st.tuples(RATES, st.sampled_from([0.0, 1.0, 30.0, 100.0, 299.0, 300.0, 301.0, 1000.0]), st.booleans()),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(STEPS)
def test_levels_move_up_at_once_and_down_slowly(steps):
    model = Model()
    now = 0.0
    seen: list[tuple[float, float]] = []  # (time, rate) of every tick with enough requests
    last_change = -1e18
    for rate, dt, enough in steps:
        now += dt
        previous = model.level
        decision = model.tick(rate, now, requests=MANY if enough else 3)
        level = model.level
        assert 0 <= level <= 3
        if enough:
            seen.append((now, rate))
            assert level >= DEFAULT_POLICY.target(rate)
        if decision is None:
            assert level == previous
            continue
        assert decision.previous == previous and decision.level != previous and enough
        if level < previous:
            assert previous - level == 1
            assert now - last_change >= COOL
            threshold = DEFAULT_POLICY.threshold(previous)
            assert all(r < threshold for t, r in seen if t > now - COOL)
        last_change = now
