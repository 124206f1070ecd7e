"""Circuit-breaker levels: the ``/mcp/breakers/<m>`` document (DESIGN.md sections 4, 7, 8).

``{"level": 0-3, "reason": str, "since": unix s, "set_by": str, "until": unix s or null}``, written by the
health service and by operators. Pure: parsing and validation only; every error names the field.
Levels: 0 closed, 1 workers halve the model's max batch size, 2 secondary features off, 3 fallback version.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

from mcpcore.errors import InvalidArgument

__all__ = ["MAX_LEVEL", "BreakerDoc", "breaker_to_json", "parse_breaker"]

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


def parse_breaker(model: str, raw: bytes) -> BreakerDoc:
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deeply
        raise InvalidArgument(f"breaker of {model}: not JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(doc, dict):
        raise InvalidArgument(f'breaker of {model}: must be a JSON object like {{"level": 1}}')
    unknown = sorted(set(doc) - _FIELDS)
    if unknown:
        raise InvalidArgument(f"breaker of {model}: unknown field(s) {unknown}; known: {sorted(_FIELDS)}")
    try:
        return BreakerDoc(**doc)
    except InvalidArgument as exc:
        raise InvalidArgument(f"breaker of {model}: {exc.message}") from None


def breaker_to_json(doc: BreakerDoc) -> bytes:
    return json.dumps(asdict(doc), separators=(",", ":"), sort_keys=True).encode()
