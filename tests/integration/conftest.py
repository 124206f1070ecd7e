"""Fixtures for the integration tests that several modules share (see also ``tests/conftest.py``).

- ``repo``: the demo model repository (``make models``' script, fixed seeds), built once per module into
  its own temporary directory. A module that needs extra models defines its own ``repo`` over it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from grpc_conformance import TRANSPORTS
from harness import make_demo_repository

from mcpcore.call_context import RpcServer


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo_repository(tmp_path_factory.mktemp("repo") / "models")


@pytest.fixture(params=sorted(TRANSPORTS))
def transport(request: pytest.FixtureRequest) -> type[RpcServer]:
    """The server under test: grpc.aio (the reference) or the grpc++ front door."""
    return TRANSPORTS[request.param]
