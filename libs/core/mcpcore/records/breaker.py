"""Circuit breakers' documents: ``/mcp/breakers/<m>`` (the level) and ``/mcp/config/breaker`` (the policy)
(DESIGN.md sections 4, 7, 8). Both are operator documents: strict.

Level document: ``{"level": 0-3, "reason": str, "since": unix s, "set_by": str, "until": unix s or null}``,
written by the health service and by operators.
Levels: 0 closed, 1 workers halve the model's max batch size, 2 secondary features off, 3 fallback version.

Policy document (the article's format, operator-written; ``min_requests`` is ours and optional):
``{"levels": [{"threshold": 0.3, "action": "reduce_batch_size", "params": {"ratio": 0.5}}, ...],
"metrics_window": "30s", "cool_down": "5m", "min_requests": 20}``.

Invariants:
- Every error is an ``InvalidArgument`` naming the key and the field; unknown fields are errors; JSON nested
  too deeply is an ``InvalidArgument``, never a ``RecursionError``.
- A policy has 1-3 levels; ``levels[i]`` is breaker level ``i + 1``. Workers act by level number, so
  ``levels[i].action`` must be level ``i + 1``'s action (``ACTIONS[i]``); thresholds rise strictly in (0, 1].
- ``LevelRule.params`` is read-only and holds only the keys its action knows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any

from mcpcore.config_values import parse_duration
from mcpcore.errors import InvalidArgument
from mcpcore.records.base import decode, dumps

__all__ = [
    "ACTIONS",
    "DEFAULT_POLICY",
    "MAX_LEVEL",
    "BreakerDoc",
    "BreakerPolicy",
    "LevelRule",
    "format_duration",
]

MAX_LEVEL = 3
_FIELDS = {"level", "reason", "since", "set_by", "until"}


@dataclass(frozen=True)
class BreakerDoc:
    level: int = 0
    reason: str = ""
    since: float = 0.0
    set_by: str = ""
    until: float | None = None  # an operator's forced level holds until then

    def level_at(self, now: float) -> int:
        """The level in force at ``now`` (unix s): an operator's forced level holds until ``until``."""
        return 0 if self.until is not None and self.until <= now else self.level

    @classmethod
    def parse(cls, key: str, raw: bytes | str) -> BreakerDoc:
        doc = decode(key, raw)
        if not isinstance(doc, dict):
            raise InvalidArgument(f'{key}: must be a JSON object like {{"level": 1}}')
        unknown = sorted(set(doc) - _FIELDS)
        if unknown:
            raise InvalidArgument(f"{key}: unknown field(s) {unknown}; known: {sorted(_FIELDS)}")
        try:
            return cls(**doc)
        except InvalidArgument as exc:
            raise InvalidArgument(f"{key}: {exc.message}") from None

    def to_json(self) -> bytes:
        return dumps(asdict(self), sort_keys=True)

    def __post_init__(self) -> None:
        level = self.level
        if not isinstance(level, int) or isinstance(level, bool) or not 0 <= level <= MAX_LEVEL:
            raise InvalidArgument(f"level: must be an integer 0..{MAX_LEVEL}, got {self.level!r}")
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int | float) or not math.isfinite(value)):
                raise InvalidArgument(f"{name}: must be a unix time in seconds, got {value!r}")
        for name in ("reason", "set_by"):
            if not isinstance(getattr(self, name), str):
                raise InvalidArgument(f"{name}: must be a string")


# --- the policy: /mcp/config/breaker -------------------------------------------------------------------

#: ``ACTIONS[i]`` is what workers do at breaker level ``i + 1``.
ACTIONS = ("reduce_batch_size", "disable_secondary_features", "fallback_to_static")
_POLICY_FIELDS = {"levels", "metrics_window", "cool_down", "min_requests"}
_RULE_FIELDS = {"threshold", "action", "params"}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _ratio(value: Any) -> float:
    if not _is_number(value) or not 0 < value < 1:
        raise InvalidArgument(f"params.ratio: must be a number in (0, 1), got {value!r}")
    return float(value)


def _features(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(f, str) and f for f in value):
        raise InvalidArgument(f"params.features: must be a list of feature names, got {value!r}")
    return tuple(value)


def _version(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"params.version: must be a non-empty version string, got {value!r}")
    return value


_PARAMS = {  # action -> param name -> check that returns the value to keep
    "reduce_batch_size": {"ratio": _ratio},
    "disable_secondary_features": {"features": _features},
    "fallback_to_static": {"version": _version},
}


def _check_params(action: str, params: Any) -> Mapping[str, Any]:
    if not isinstance(params, Mapping):
        raise InvalidArgument(f"params: must be a JSON object, got {params!r}")
    known = _PARAMS[action]
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise InvalidArgument(f"params: unknown field(s) {unknown} for {action}; known: {sorted(known)}")
    return MappingProxyType({name: known[name](value) for name, value in params.items()})


@dataclass(frozen=True)
class LevelRule:
    """One level of the policy: at ``threshold`` (error rate in (0, 1]) workers take ``action``."""

    threshold: float
    action: str
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not _is_number(self.threshold) or not 0 < self.threshold <= 1:
            raise InvalidArgument(f"threshold: must be an error rate in (0, 1], got {self.threshold!r}")
        if self.action not in ACTIONS:
            raise InvalidArgument(f"action: must be one of {list(ACTIONS)}, got {self.action!r}")
        object.__setattr__(self, "threshold", float(self.threshold))
        object.__setattr__(self, "params", _check_params(self.action, self.params))


@dataclass(frozen=True)
class BreakerPolicy:
    """When the health service raises a model's breaker level (DESIGN.md section 8)."""

    levels: tuple[LevelRule, ...]
    metrics_window_s: float
    cool_down_s: float
    #: Fewer requests than this in the window is too little evidence: the level does not change.
    min_requests: int = 20

    def __post_init__(self) -> None:
        object.__setattr__(self, "levels", tuple(self.levels))
        if not 1 <= len(self.levels) <= MAX_LEVEL:
            raise InvalidArgument(f"levels: must list 1 to {MAX_LEVEL} levels, got {len(self.levels)}")
        for i, rule in enumerate(self.levels):
            if rule.action != ACTIONS[i]:
                raise InvalidArgument(
                    f"levels[{i}].action: level {i + 1} is {ACTIONS[i]!r} (workers act by level), "
                    f"got {rule.action!r}"
                )
            if i and rule.threshold <= self.levels[i - 1].threshold:
                raise InvalidArgument(
                    f"levels[{i}].threshold: must be above levels[{i - 1}].threshold "
                    f"({self.levels[i - 1].threshold:g}), got {rule.threshold:g}"
                )
        for name in ("metrics_window_s", "cool_down_s"):
            value = getattr(self, name)
            if not _is_number(value) or value <= 0:
                raise InvalidArgument(f"{name[:-2]}: must be a positive duration, got {value!r}")
        count = self.min_requests
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise InvalidArgument(f"min_requests: must be an integer >= 1, got {self.min_requests!r}")

    @classmethod
    def parse(cls, key: str, raw: bytes | str) -> BreakerPolicy:
        """The policy in ``/mcp/config/breaker``; ``InvalidArgument`` ("<key>: <field>: ...") if bad."""
        doc = decode(key, raw)
        try:
            return _policy(doc)
        except InvalidArgument as exc:
            raise InvalidArgument(f"{key}: {exc.message}") from None

    def to_json(self) -> bytes:
        """The policy in the article's format; ``min_requests`` only when it is not the default."""
        doc: dict[str, Any] = {
            "levels": [
                {"threshold": r.threshold, "action": r.action, "params": dict(r.params)} for r in self.levels
            ],
            "metrics_window": format_duration(self.metrics_window_s),
            "cool_down": format_duration(self.cool_down_s),
        }
        if self.min_requests != BreakerPolicy.min_requests:
            doc["min_requests"] = self.min_requests
        return dumps(doc)

    def threshold(self, level: int) -> float:
        """The error rate that holds ``level`` (1..3); a level above the policy's highest uses the highest."""
        return self.levels[min(level, len(self.levels)) - 1].threshold

    def target(self, rate: float) -> int:
        """The highest level whose threshold ``rate`` reaches; 0 when it reaches none."""
        return sum(1 for rule in self.levels if rule.threshold <= rate)

    @property
    def features_off(self) -> tuple[str, ...]:
        """What level 2 disables (its ``features`` param; () when the policy names none)."""
        if len(self.levels) < 2:
            return ()
        return tuple(self.levels[1].params.get("features", ()))


DEFAULT_POLICY = BreakerPolicy(
    levels=(
        LevelRule(0.3, "reduce_batch_size", {"ratio": 0.5}),
        LevelRule(0.6, "disable_secondary_features", {"features": ["recommend", "ranking"]}),
        LevelRule(0.9, "fallback_to_static", {"version": "v1.0-backup"}),
    ),
    metrics_window_s=30.0,
    cool_down_s=300.0,
)


def _duration(doc: Mapping[str, Any], name: str) -> float:
    if name not in doc:
        raise InvalidArgument(f'{name}: required, a duration such as "30s" or "5m"')
    try:
        return parse_duration(doc[name])
    except InvalidArgument as exc:
        raise InvalidArgument(f"{name}: {exc.message}") from None


def _rule(i: int, raw: Any) -> LevelRule:
    if not isinstance(raw, dict):
        raise InvalidArgument(f'levels[{i}]: must be a JSON object like {{"threshold": 0.3, "action": ...}}')
    unknown = sorted(set(raw) - _RULE_FIELDS)
    if unknown:
        raise InvalidArgument(f"levels[{i}]: unknown field(s) {unknown}; known: {sorted(_RULE_FIELDS)}")
    missing = sorted({"threshold", "action"} - set(raw))
    if missing:
        raise InvalidArgument(f"levels[{i}]: missing field(s) {missing}")
    try:
        return LevelRule(raw["threshold"], raw["action"], raw.get("params", {}))
    except InvalidArgument as exc:
        raise InvalidArgument(f"levels[{i}].{exc.message}") from None


def _policy(doc: Any) -> BreakerPolicy:
    if not isinstance(doc, dict):
        raise InvalidArgument('must be a JSON object like {"levels": [...], "cool_down": "5m"}')
    unknown = sorted(set(doc) - _POLICY_FIELDS)
    if unknown:
        raise InvalidArgument(f"unknown field(s) {unknown}; known: {sorted(_POLICY_FIELDS)}")
    levels = doc.get("levels")
    if not isinstance(levels, list):
        raise InvalidArgument(f"levels: required, a list of 1 to {MAX_LEVEL} level objects")
    return BreakerPolicy(
        levels=tuple(_rule(i, raw) for i, raw in enumerate(levels)),
        metrics_window_s=_duration(doc, "metrics_window"),
        cool_down_s=_duration(doc, "cool_down"),
        min_requests=doc.get("min_requests", 20),
    )


def format_duration(seconds: float) -> str:
    """``300.0`` as ``"5m"``, ``30.0`` as ``"30s"``, ``0.25`` as ``"250ms"``; ``parse_duration`` reads it
    back exactly (a value no unit fits is written as plain seconds)."""
    for unit, size in (("h", 3600.0), ("m", 60.0), ("s", 1.0), ("ms", 1e-3)):
        count = seconds / size
        if count >= 1 and count == int(count) and int(count) * size == seconds:
            return f"{int(count)}{unit}"
    return repr(float(seconds))
