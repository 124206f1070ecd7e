"""Shared test fixtures: real etcd servers on free loopback ports, and an ``EtcdStore`` on them.

- ``etcd_server`` / ``etcd_endpoint``: one etcd for the whole session; tests keep apart by key prefix.
- ``key_prefix`` / ``store``: a unique ``/t/<hex>/`` prefix per test and a connected store (cleaned after).
- ``restartable_etcd``: a private etcd per test, which the test may stop, restart or kill.

Invariants: no fixed sleeps (servers are polled for health with a bounded deadline); no etcd outlives
pytest (fixture finalizers, then an ``atexit`` sweep; only a SIGKILLed pytest can leave one behind); a
server that does not come up fails with the tail of its log.
"""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from mcp_devcluster.localetcd import EtcdServer
from mcpcore import errors
from mcpcore.etcd_store import EtcdStore


@pytest.fixture(scope="session")
def built_library() -> Path:
    """libs/native's pool library, (re)built with the system compiler when missing or stale."""
    from mcp_native import pool as native_pool  # noqa: PLC0415

    native = Path(__file__).resolve().parents[1] / "libs" / "native"
    sources = [*native.glob("src/*.c"), *native.glob("include/*.h")]
    library = native_pool.LIBRARY
    if not library.is_file() or library.stat().st_mtime < max(s.stat().st_mtime for s in sources):
        subprocess.run([str(native / "build.sh"), "lib"], check=True, capture_output=True, timeout=120)
    return library


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd-session"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def etcd_endpoint(etcd_server: EtcdServer) -> str:
    return etcd_server.endpoint


@pytest.fixture
def key_prefix() -> str:
    return f"/t/{uuid.uuid4().hex}/"


@pytest.fixture
async def store(etcd_endpoint: str, key_prefix: str) -> AsyncIterator[EtcdStore]:
    async with EtcdStore([etcd_endpoint], timeout=5.0) as s:
        yield s
        with contextlib.suppress(errors.MCPError):
            await s.delete(key_prefix, prefix=True)


@pytest.fixture
def restartable_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path / "etcd")
    server.start()
    yield server
    server.stop()
