"""``RetryBudget``: retries stay a bounded fraction of requests (the router's and the SDK's)."""

from __future__ import annotations

from mcpcore.retry import RetryBudget


def test_a_burst_then_a_fraction_of_the_requests() -> None:
    budget = RetryBudget(ratio=0.2, burst=3.0)
    assert [budget.spend() for _ in range(4)] == [True, True, True, False]
    for _ in range(4):
        budget.earn()
    assert not budget.spend()  # 0.8 of a retry earned: not yet one
    budget.earn()
    assert budget.spend() and not budget.spend()


def test_earning_never_exceeds_the_burst() -> None:
    budget = RetryBudget(ratio=1.0, burst=2.0)
    for _ in range(100):
        budget.earn()
    assert [budget.spend() for _ in range(3)] == [True, True, False]
