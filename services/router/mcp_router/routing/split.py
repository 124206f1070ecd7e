"""Traffic split between a model's stable version and its canary (DESIGN.md section 7).

- With a routing key (a user or session id) the split is sticky: ``canary_for_key`` hashes the salt and the
  key (xxh3_64, the same in every process and router) into 10,000 buckets, and the first
  ``percent * 100`` buckets go to the canary. Raising the percent only adds buckets, so a key that was on
  the canary stays there; changing the salt (the router uses the canary version) reshuffles the cohort.
- Without a key, ``SmoothWeightedRoundRobin`` (nginx's smooth weighted round robin) interleaves the
  versions: with weights 90/10, every run of 100 picks holds exactly 90 and 10, and the canary picks are
  spread out rather than bunched.

Pure: no I/O. A ``SmoothWeightedRoundRobin`` holds mutable state and is not thread-safe; the router uses
one per (model, split) from its event loop.
"""

from __future__ import annotations

from collections.abc import Mapping

from xxhash import xxh3_64_intdigest

__all__ = ["BUCKETS", "SmoothWeightedRoundRobin", "canary_for_key", "choose_version"]

#: Hash buckets for the sticky split: a percent is ``percent * 100`` of them (so 0.01% steps are possible).
BUCKETS = 10_000


def canary_for_key(key: str, canary_percent: int, *, salt: str) -> bool:
    """Whether ``key`` goes to the canary: sticky per (salt, key), and monotone in ``canary_percent``."""
    if canary_percent <= 0:
        return False
    if canary_percent >= 100:
        return True
    # NUL between salt and key: ("a", "bc") and ("ab", "c") must not share a bucket by construction.
    bucket = xxh3_64_intdigest(f"{salt}\0{key}".encode()) % BUCKETS
    return bucket < canary_percent * (BUCKETS // 100)


class SmoothWeightedRoundRobin:
    """nginx's smooth weighted round robin over ``{version: weight}``: deterministic, exact per period.

    Each pick adds every weight to its version's running score, takes the highest score (the earliest
    version in the mapping's order on a tie) and subtracts the total weight from it. Over any
    ``sum(weights)`` consecutive picks each version is picked exactly ``weight`` times. Versions of weight 0
    are never picked.
    """

    __slots__ = ("_current", "_given", "_names", "_total", "_weights")

    def __init__(self, weights: Mapping[str, int]) -> None:
        for name, weight in weights.items():
            if not isinstance(weight, int) or weight < 0:
                raise ValueError(f"version {name!r}: weight must be a non-negative integer, got {weight!r}")
        self._given = dict(weights)
        self._names = [name for name, weight in weights.items() if weight > 0]
        if not self._names:
            raise ValueError(f"at least one version needs a positive weight, got {dict(weights)!r}")
        self._weights = [weights[name] for name in self._names]
        self._total = sum(self._weights)
        self._current = [0] * len(self._names)

    @classmethod
    def for_canary(cls, stable: str, canary: str, canary_percent: int) -> SmoothWeightedRoundRobin:
        """The round robin matching a canary split: ``{stable: 100 - percent, canary: percent}``."""
        percent = min(100, max(0, canary_percent))
        return cls({stable: 100 - percent, canary: percent})

    @property
    def weights(self) -> dict[str, int]:
        """The weights as given, zeros included (compare with the split in force to see if it is stale)."""
        return dict(self._given)

    def pick(self) -> str:
        current, weights = self._current, self._weights
        best = 0
        for i, weight in enumerate(weights):
            current[i] += weight
            if current[i] > current[best]:
                best = i
        current[best] -= self._total
        return self._names[best]


def choose_version(
    routing_stable: str,
    canary: str | None,
    canary_percent: int,
    key: str | None,
    rr: SmoothWeightedRoundRobin | None,
) -> str:
    """The version a request goes to: by ``key``'s hash when it has one (``""`` is none: proto3's
    unset string), else by ``rr``.

    ``rr`` should be ``SmoothWeightedRoundRobin.for_canary(routing_stable, canary, canary_percent)``, kept
    across requests; it is needed only for requests without a key while a canary takes traffic, and a
    ValueError says so if it is missing then. The canary version is the salt of the sticky split.
    """
    if canary is None or canary == routing_stable or canary_percent <= 0:
        return routing_stable
    if canary_percent >= 100:
        return canary
    if key:
        return canary if canary_for_key(key, canary_percent, salt=canary) else routing_stable
    if rr is None:
        raise ValueError("a request without a key needs the split's SmoothWeightedRoundRobin")
    return rr.pick()
