"""Circuit breakers (DESIGN.md sections 7 and 8): what a breaker level does to a model's outputs.

The documents themselves (the level at ``/mcp/breakers/<m>``, the policy at ``/mcp/config/breaker``) are
``mcpcore.records.breaker``'s.

Invariant: pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["secondary_outputs_off"]


def secondary_outputs_off(secondary: Sequence[str], features: Sequence[str]) -> frozenset[str]:
    """The outputs a model skips at level 2: its ``qos.secondary_features`` that the policy's level-2
    ``features`` name, or all of them when the policy names none of them (a policy written for other
    models, like the article's ``["recommend", "ranking"]``, must not leave level 2 doing nothing)."""
    named = frozenset(secondary) & frozenset(features)
    return named or frozenset(secondary)
