"""The environment the SDK and ``mcpctl`` read, in one place: read when asked, never at import.

- ``MCP_SCHEDULER``: the scheduler address an SDK ``Client`` made without one uses.
- ``MCPCTL_DEBUG`` (any non-empty value): ``mcpctl`` lets an internal error out with its traceback.
- ``USER``: who ``mcpctl breaker set`` records as having set the level.

mcpctl's own options take their variables (``MCP_ETCD_ENDPOINTS`` ...) through click's ``envvar``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mcpcore.config import environment

__all__ = ["ClientEnvironment", "client_environment"]


@dataclass(frozen=True)
class ClientEnvironment:
    scheduler: str  # "": unset
    ctl_debug: bool
    user: str


def client_environment(env: Mapping[str, str] | None = None) -> ClientEnvironment:
    """The variables of the module's docstring from ``env`` (default: the process's)."""
    env = environment() if env is None else env
    return ClientEnvironment(
        scheduler=env.get("MCP_SCHEDULER", "").strip(),
        ctl_debug=bool(env.get("MCPCTL_DEBUG")),
        user=env.get("USER", "") or "operator",
    )
