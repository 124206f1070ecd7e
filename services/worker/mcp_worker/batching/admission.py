"""What a model's queue takes (pure logic, no I/O): a request's priority level, its rows and shape key
(what it may be batched with), and how long it may wait. Each refusal is ``InvalidArgument`` naming the
model; the queue's own refusals (stopped, closing, refused, full) are the queue's."""

from __future__ import annotations

from collections.abc import Hashable, Mapping

import numpy as np

from mcp_worker.batching.policy import BatchConfig
from mcpcore.errors import InvalidArgument

__all__ = ["describe", "priority_level", "queue_timeout"]


def priority_level(config: BatchConfig, key: str, priority: int | None) -> int:
    """The level a request asking for ``priority`` is served at (1 is served first)."""
    levels = config.priority_levels
    # Triton's convention: 0 (or none) is the default level, 1 the highest; a level past the
    # configured ones is served at the lowest, so clients written for other models keep working
    level = config.default_priority_level if not priority else min(priority, levels)
    if level < 1:
        raise InvalidArgument(f"priority level {priority} is not valid for model {key}: use 1..{levels}")
    return level


def describe(config: BatchConfig, key: str, inputs: Mapping[str, np.ndarray]) -> tuple[int, Hashable]:
    """(rows, shape key); checks what batching needs: arrays that agree on the batch dim."""
    if not isinstance(inputs, Mapping) or not inputs:
        raise InvalidArgument(f"a request to model {key} needs at least one input")
    if not config.batched:
        return 1, None
    first = next(iter(inputs))
    parts = []
    for name, arr in inputs.items():
        if not isinstance(arr, np.ndarray) or arr.ndim == 0:
            raise InvalidArgument(f"input {name} of model {key}: needs an array with a batch dim")
        if arr.shape[0] != inputs[first].shape[0]:
            raise InvalidArgument(
                f"inputs of model {key} disagree on the batch dim: {first} has "
                f"{inputs[first].shape[0]} rows, {name} has {arr.shape[0]}"
            )
        parts.append((name, arr.dtype.str, arr.shape[1:]))
    rows, mbs = inputs[first].shape[0], config.max_batch_size
    if not 1 <= rows <= mbs:
        raise InvalidArgument(
            f"a request to model {key} has {rows} rows; it must have 1..{mbs} (max_batch_size)"
        )
    return rows, tuple(sorted(parts))


def queue_timeout(config: BatchConfig, timeout_s: float | None) -> float | None:
    """How long a request with ``timeout_s`` left (its deadline; None: none) may wait in the queue: that,
    or the model's queue timeout when shorter (None: no limit)."""
    policy = config.default_queue_timeout_s
    if timeout_s is None:
        return policy
    return timeout_s if policy is None else min(policy, timeout_s)
