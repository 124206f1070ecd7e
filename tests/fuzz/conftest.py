"""Fixtures of the fuzz tests: the demo model repository, once per module (as tests/integration's)."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import make_demo_repository


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo_repository(tmp_path_factory.mktemp("repo") / "models")
