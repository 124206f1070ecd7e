"""Circuit breakers (DESIGN.md sections 7 and 8): what a breaker level does to a model's outputs.

The documents themselves (the level at ``/mcp/breakers/<m>``, the policy at ``/mcp/config/breaker``) are
``mcpcore.records.breaker``'s; their names are re-exported here for the code that acts on levels.

Invariant: pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from mcpcore.records.breaker import (
    ACTIONS,
    DEFAULT_POLICY,
    MAX_LEVEL,
    BreakerDoc,
    BreakerPolicy,
    LevelRule,
    format_duration,
)

__all__ = [
    "ACTIONS",
    "DEFAULT_POLICY",
    "MAX_LEVEL",
    "BreakerDoc",
    "BreakerPolicy",
    "LevelRule",
    "breaker_to_json",
    "format_duration",
    "parse_breaker",
    "parse_policy",
    "policy_to_json",
    "secondary_outputs_off",
]


def secondary_outputs_off(secondary: Sequence[str], features: Sequence[str]) -> frozenset[str]:
    """The outputs a model skips at level 2: its ``qos.secondary_features`` that the policy's level-2
    ``features`` name, or all of them when the policy names none of them (a policy written for other
    models, like the article's ``["recommend", "ranking"]``, must not leave level 2 doing nothing)."""
    named = frozenset(secondary) & frozenset(features)
    return named or frozenset(secondary)


def parse_breaker(model: str, raw: bytes) -> BreakerDoc:
    """``BreakerDoc.parse`` for a caller that holds the model, not the key: errors say "breaker of <m>"."""
    return BreakerDoc.parse(f"breaker of {model}", raw)


def breaker_to_json(doc: BreakerDoc) -> bytes:
    return doc.to_json()


def parse_policy(raw: bytes) -> BreakerPolicy:
    """``BreakerPolicy.parse`` for a policy read from no key (a file, a test): errors say "breaker policy"."""
    return BreakerPolicy.parse("breaker policy", raw)


def policy_to_json(policy: BreakerPolicy) -> bytes:
    return policy.to_json()
