import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcpcore.breaker import secondary_outputs_off
from mcpcore.config import parse_duration
from mcpcore.errors import InvalidArgument
from mcpcore.records.breaker import DEFAULT_POLICY, BreakerPolicy, LevelRule, format_duration

ARTICLE = {
    "levels": [
        {"threshold": 0.3, "action": "reduce_batch_size", "params": {"ratio": 0.5}},
        {
            "threshold": 0.6,
            "action": "disable_secondary_features",
            "params": {"features": ["recommend", "ranking"]},
        },
        {"threshold": 0.9, "action": "fallback_to_static", "params": {"version": "v1.0-backup"}},
    ],
    "metrics_window": "30s",
    "cool_down": "5m",
}


def policy_json(**changes) -> bytes:
    doc = json.loads(json.dumps(ARTICLE))
    for path, value in changes.items():
        *parents, last = path.split("__")
        target = doc
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        if value is ...:
            del target[int(last) if last.isdigit() else last]
        else:
            target[int(last) if last.isdigit() else last] = value
    return json.dumps(doc).encode()


def test_default_policy_is_the_articles():
    assert BreakerPolicy.parse("breaker policy", json.dumps(ARTICLE).encode()) == DEFAULT_POLICY
    assert json.loads(DEFAULT_POLICY.to_json()) == ARTICLE
    assert DEFAULT_POLICY.metrics_window_s == 30.0 and DEFAULT_POLICY.cool_down_s == 300.0
    assert DEFAULT_POLICY.min_requests == 20
    assert [r.threshold for r in DEFAULT_POLICY.levels] == [0.3, 0.6, 0.9]
    assert DEFAULT_POLICY.levels[1].params["features"] == ("recommend", "ranking")


def test_round_trip_keeps_min_requests_and_odd_durations():
    policy = BreakerPolicy.parse(
        "breaker policy", policy_json(min_requests=5, metrics_window="1h30m", cool_down=90)
    )
    assert policy.min_requests == 5 and policy.metrics_window_s == 5400.0 and policy.cool_down_s == 90.0
    assert BreakerPolicy.parse("breaker policy", policy.to_json()) == policy


def test_one_level_without_params_is_enough():
    raw = b'{"levels": [{"threshold": 0.5, "action": "reduce_batch_size"}], "metrics_window": "10s", '
    policy = BreakerPolicy.parse("breaker policy", raw + b'"cool_down": "1m"}')
    assert policy.levels == (LevelRule(0.5, "reduce_batch_size"),)
    assert policy.target(0.49) == 0 and policy.target(0.5) == 1 and policy.target(1.0) == 1


def test_levels_and_targets():
    p = DEFAULT_POLICY
    assert [p.target(r) for r in (0.0, 0.29, 0.3, 0.59, 0.6, 0.89, 0.9, 1.0)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [p.threshold(level) for level in (1, 2, 3)] == [0.3, 0.6, 0.9]


def test_params_are_read_only_and_policy_hashable():
    with pytest.raises(TypeError):
        DEFAULT_POLICY.levels[0].params["ratio"] = 0.9  # type: ignore[index]
    assert hash(DEFAULT_POLICY) == hash(BreakerPolicy.parse("breaker policy", DEFAULT_POLICY.to_json()))


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"{levels: []}", "breaker policy: not JSON"),
        (b"[1]", "breaker policy: must be a JSON object"),
        (policy_json(cooldown="5m"), r"breaker policy: unknown field\(s\) \['cooldown'\]"),
        (policy_json(levels=...), "breaker policy: levels: required"),
        (policy_json(levels={"a": 1}), "breaker policy: levels: required, a list"),
        (policy_json(levels=[]), "breaker policy: levels: must list 1 to 3 levels, got 0"),
        (policy_json(levels=[*ARTICLE["levels"], ARTICLE["levels"][2]]), "must list 1 to 3 levels, got 4"),
        (policy_json(levels__1=0.6), r"breaker policy: levels\[1\]: must be a JSON object"),
        (policy_json(levels__0__treshold=0.3), r"levels\[0\]: unknown field\(s\) \['treshold'\]"),
        (policy_json(levels__2__threshold=...), r"levels\[2\]: missing field\(s\) \['threshold'\]"),
        (policy_json(levels__0__threshold=0), r"levels\[0\].threshold: must be an error rate in \(0, 1\]"),
        (policy_json(levels__2__threshold=1.5), r"levels\[2\].threshold: must be an error rate"),
        (policy_json(levels__0__threshold="0.3"), r"levels\[0\].threshold: must be an error rate"),
        (policy_json(levels__0__threshold=True), r"levels\[0\].threshold: must be an error rate"),
        (
            policy_json(levels__1__threshold=0.2),
            r"breaker policy: levels\[1\].threshold: must be above levels\[0\].threshold \(0.3\), got 0.2",
        ),
        (policy_json(levels__2__threshold=0.6), r"levels\[2\].threshold: must be above levels\[1\]"),
        (policy_json(levels__0__action="shed_load"), r"levels\[0\].action: must be one of"),
        (
            policy_json(levels=[{"threshold": 0.5, "action": "fallback_to_static"}]),
            r"levels\[0\].action: level 1 is 'reduce_batch_size' \(workers act by level\)",
        ),
        (policy_json(levels__0__params=[0.5]), r"levels\[0\].params: must be a JSON object"),
        (policy_json(levels__0__params__size=2), r"levels\[0\].params: unknown field\(s\) \['size'\]"),
        (policy_json(levels__0__params__ratio=1.5), r"levels\[0\].params.ratio: must be a number in"),
        (policy_json(levels__0__params__ratio=0), r"levels\[0\].params.ratio: must be a number in"),
        (policy_json(levels__1__params__features="ranking"), r"levels\[1\].params.features: must be a list"),
        (policy_json(levels__1__params__features=[""]), r"levels\[1\].params.features: must be a list"),
        (policy_json(levels__2__params__version=""), r"levels\[2\].params.version: must be a non-empty"),
        (policy_json(metrics_window=...), "breaker policy: metrics_window: required"),
        (policy_json(metrics_window="30 seconds"), "breaker policy: metrics_window: not a duration"),
        (policy_json(metrics_window="0s"), "breaker policy: metrics_window: must be a positive duration"),
        (policy_json(cool_down=-5), "breaker policy: cool_down: a duration must be finite and >= 0"),
        (policy_json(cool_down=None), "breaker policy: cool_down: not a duration"),
        (policy_json(min_requests=0), "breaker policy: min_requests: must be an integer >= 1, got 0"),
        (policy_json(min_requests="20"), "breaker policy: min_requests: must be an integer >= 1"),
        (policy_json(min_requests=True), "breaker policy: min_requests: must be an integer >= 1"),
        (policy_json(min_requests=2.5), "breaker policy: min_requests: must be an integer >= 1"),
    ],
)
def test_each_bad_field_is_named(raw, match):
    with pytest.raises(InvalidArgument, match=match):
        BreakerPolicy.parse("breaker policy", raw)


def test_message_is_exact_for_the_operator():
    with pytest.raises(InvalidArgument) as caught:
        BreakerPolicy.parse("breaker policy", policy_json(levels__1__threshold=0.2))
    assert caught.value.message == (
        "breaker policy: levels[1].threshold: must be above levels[0].threshold (0.3), got 0.2"
    )


def test_non_finite_threshold_is_rejected():
    raw = policy_json().replace(b'"threshold": 0.9', b'"threshold": NaN')  # Python's json reads NaN
    with pytest.raises(InvalidArgument, match=r"breaker policy: not JSON \(NaN is not allowed\)"):
        BreakerPolicy.parse("breaker policy", raw)


def test_deep_nesting_is_invalid_argument_not_recursion_error():
    with pytest.raises(InvalidArgument, match="breaker policy: not JSON"):
        BreakerPolicy.parse("breaker policy", b"[" * 100_000 + b"]" * 100_000)
    deep_params = b'{"levels": [{"threshold": 0.3, "action": "reduce_batch_size", "params": {"ratio": '
    deep_params += b"[" * 100_000 + b"]" * 100_000 + b'}}], "metrics_window": "30s", "cool_down": "5m"}'
    with pytest.raises(InvalidArgument, match="breaker policy: not JSON"):
        BreakerPolicy.parse("breaker policy", deep_params)
    shallow = deep_params.replace(b"[" * 100_000, b"[" * 50).replace(b"]" * 100_000, b"]" * 50)
    with pytest.raises(InvalidArgument, match=r"levels\[0\].params.ratio: must be a number"):
        BreakerPolicy.parse("breaker policy", shallow)


def test_direct_construction_is_validated_too():
    with pytest.raises(InvalidArgument, match="levels: must list 1 to 3"):
        BreakerPolicy(levels=(), metrics_window_s=30.0, cool_down_s=300.0)
    with pytest.raises(InvalidArgument, match="cool_down: must be a positive duration"):
        BreakerPolicy(levels=DEFAULT_POLICY.levels, metrics_window_s=30.0, cool_down_s=0.0)
    with pytest.raises(InvalidArgument, match="threshold: must be an error rate"):
        LevelRule(float("inf"), "reduce_batch_size")


@pytest.mark.parametrize(
    ("seconds", "text"), [(30.0, "30s"), (300.0, "5m"), (7200.0, "2h"), (0.25, "250ms"), (90.0, "90s")]
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


@given(st.floats(min_value=1e-9, max_value=1e9, allow_nan=False))
def test_format_duration_reads_back_exactly(seconds):
    assert parse_duration(format_duration(seconds)) == seconds


def test_level_2_drops_the_secondary_outputs_the_policy_names_or_all_of_them() -> None:
    assert DEFAULT_POLICY.features_off == ("recommend", "ranking")
    assert secondary_outputs_off(("RANK0", "REC0"), ("REC0",)) == {"REC0"}  # the policy selects
    # the article's default names none of the demo's outputs: level 2 must still drop its secondary ones
    assert secondary_outputs_off(("RANK0",), DEFAULT_POLICY.features_off) == {"RANK0"}
    assert secondary_outputs_off((), ("ranking",)) == frozenset()
