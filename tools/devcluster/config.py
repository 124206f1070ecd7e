"""What the development cluster reads from its environment, read once, here and nowhere else in it.

``DevClusterConfig.from_env()`` is called once by ``launcher.main``; the rest of the package gets the
values from the object. The services it starts inherit ``environ`` (a copy taken at that moment), with
what the launcher sets on top (each service's etcd endpoints, the demo repository, ...).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["DevClusterConfig"]


@dataclass(frozen=True)
class DevClusterConfig:
    #: ``MCP_ETCD_ENDPOINTS``: an etcd already running, handed to every service; None starts one (port 2379).
    etcd_endpoints: str | None = None
    #: The environment the services inherit (read-only).
    environ: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DevClusterConfig:
        env = dict(os.environ if environ is None else environ)
        return cls(etcd_endpoints=env.get("MCP_ETCD_ENDPOINTS"), environ=MappingProxyType(env))
