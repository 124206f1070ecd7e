"""``RetryBudget``: the token bucket every sender (the router, the SDK's direct path) draws its retries from,
so retries after a refusal stay a bounded fraction of recent requests and cannot amplify an overload."""

from __future__ import annotations

__all__ = ["RetryBudget"]


class RetryBudget:
    """Token bucket: each request earns ``ratio`` of a retry, each retry spends one (at most ``burst``)."""

    def __init__(self, ratio: float = 0.2, burst: float = 20.0) -> None:
        self._ratio, self._burst, self._tokens = ratio, burst, burst

    def earn(self) -> None:
        self._tokens = min(self._burst, self._tokens + self._ratio)

    def spend(self) -> bool:
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False
