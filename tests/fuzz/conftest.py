"""Fixtures of the fuzz tests (the processes under test are started once, never once per example).

- ``repo``: the demo model repository (``make models``' script), built once; a module that adds hostile
  models copies it first.
- ``mesh``: one worker, scheduler and router with demo-mlp versions 1 and 2 routed, shared by the
  modules that fuzz the router (KServe gRPC and REST: the same router's two ports; the operator keys,
  which flip its traffic). Their probes name version 1, so a flip of the default does not change them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import SmallMesh, make_demo_repository, small_mesh


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo_repository(tmp_path_factory.mktemp("repo") / "models")


@pytest.fixture(scope="session")
def mesh(repo: Path, etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SmallMesh]:
    with small_mesh(tmp_path_factory.mktemp("mesh"), etcd_endpoint, repo, "demo-mlp", ["1", "2"]) as m:
        yield m
