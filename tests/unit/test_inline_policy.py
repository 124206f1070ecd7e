"""``mcp_worker.batching.inline.InlinePolicy``: when a model's batches run on the event loop (pure logic,
numbers)."""

import pytest

from mcp_worker.batching.inline import LEAVE_AT, MAX_BACKOFF, PROBE_WALL, WINDOW, InlinePolicy

LIMIT = 1_000_000  # 1 ms
FAST = (300_000, 250_000)  # (wall, cpu) of a batch on a thread that would fit inline


def on_threads(policy: InlinePolicy, n: int, wall: int = FAST[0], cpu: int = FAST[1]) -> None:
    for _ in range(n):
        assert not policy.take()
        policy.ran(False, wall, cpu)


def inline_now(policy: InlinePolicy) -> InlinePolicy:
    on_threads(policy, WINDOW)
    assert policy.take()  # the probe
    policy.ran(True, 200_000, 200_000)
    assert policy.inline
    return policy


def test_a_fast_model_runs_on_the_threads_for_a_window_then_inline():
    policy = InlinePolicy(LIMIT)
    on_threads(policy, WINDOW - 1)
    policy.ran(False, *FAST)
    assert policy.take() and not policy.inline  # a probe: not inline until it proved itself
    policy.ran(True, 400_000, 400_000)
    assert policy.inline and policy.take()


@pytest.mark.parametrize(("limit", "allowed"), [(0, True), (LIMIT, False)])
def test_off_or_not_allowed_never_inline(limit, allowed):
    policy = InlinePolicy(limit, allowed=allowed)
    for _ in range(5 * WINDOW):
        assert not policy.take()
        policy.ran(False, 1_000, 1_000)


def test_one_batch_over_the_cpu_limit_in_the_window_stops_the_probe():
    policy = InlinePolicy(LIMIT)
    on_threads(policy, WINDOW - 1)
    policy.ran(False, LIMIT + 1, LIMIT + 1)
    assert not policy.take()
    on_threads(policy, WINDOW - 1)  # the slow one is still in the window
    assert not policy.take()
    policy.ran(False, *FAST)  # and now it left
    assert policy.take()


def test_a_model_that_waits_little_cpu_but_long_wall_time_is_never_probed():
    """A sleeping (or device-bound) model uses no CPU: its wall time keeps it off the loop."""
    policy = InlinePolicy(LIMIT)
    on_threads(policy, 4 * WINDOW, wall=PROBE_WALL * LIMIT + 1, cpu=10_000)
    assert not policy.take()


def test_wall_time_inflated_by_the_gil_still_allows_a_probe():
    policy = InlinePolicy(LIMIT)
    on_threads(policy, WINDOW, wall=3 * LIMIT, cpu=FAST[1])  # waited for the GIL: within PROBE_WALL
    assert policy.take()


def test_one_slow_inline_batch_is_tolerated_two_in_a_row_are_not():
    policy = inline_now(InlinePolicy(LIMIT))
    policy.ran(True, 2 * LIMIT, 2 * LIMIT)
    assert policy.inline  # the host may have preempted the loop
    policy.ran(True, 500_000, 500_000)
    policy.ran(True, 2 * LIMIT, 2 * LIMIT)
    assert policy.inline  # not in a row
    policy.ran(True, 2 * LIMIT, 2 * LIMIT)
    assert not policy.inline and not policy.take()


def test_an_inline_batch_far_over_the_limit_leaves_at_once():
    policy = inline_now(InlinePolicy(LIMIT))
    policy.ran(True, LEAVE_AT * LIMIT + 1, 10_000)
    assert not policy.inline and not policy.take()


def test_a_failed_inline_batch_leaves_a_failed_threaded_one_changes_nothing():
    policy = inline_now(InlinePolicy(LIMIT))
    policy.failed(False)
    assert policy.inline
    policy.failed(True)
    assert not policy.inline


def test_probes_back_off_doubling_and_reset_after_a_good_inline_batch():
    policy = inline_now(InlinePolicy(LIMIT))
    waits = []
    for _ in range(9):  # the model leaves, then every probe fails
        policy.ran(True, LEAVE_AT * LIMIT + 1, 0)
        n = 0
        while not policy.take():
            policy.ran(False, *FAST)
            n += 1
        waits.append(n)
    assert waits == [WINDOW * 2**i for i in range(8)] + [MAX_BACKOFF]
    policy.ran(True, 100_000, 100_000)  # the probe is good: inline, and the backoff is back to WINDOW
    assert policy.inline
    policy.failed(True)
    on_threads(policy, WINDOW)
    assert policy.take()


def test_a_negative_limit_is_refused():
    with pytest.raises(ValueError, match="limit_ns"):
        InlinePolicy(-1)
