"""``MeshClient``: the blocking client, ``AsyncMeshClient``'s methods run on a private event loop in a
daemon thread, so one client may be shared by threads.

    with MeshClient("127.0.0.1:8001") as mesh:
        out = mesh.infer("demo-mlp", {"INPUT0": x})              # through the router
        out = mesh.infer("demo-mlp", {"INPUT0": x}, direct=True)  # tensors straight to the worker

Invariants:
- Every call runs on the client's one loop; the calling thread only waits for it. A caller interrupted
  while waiting (``KeyboardInterrupt``) cancels its call.
- ``close()`` (or leaving the ``with`` block) ends it: calls still running then fail ``Unavailable``
  "closed" (a direct one that was out may have run), and later calls fail ``Unavailable`` at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from mcpclient.async_client import DEFAULT_ROUTER, AsyncMeshClient
from mcpclient.values import ClientStats, ModelInfo, Route
from mcpcore.errors import Unavailable

__all__ = ["MeshClient"]

T = TypeVar("T")


class MeshClient:
    """The blocking client: ``AsyncMeshClient``'s methods, run on a private event loop in a daemon thread
    (so it may be shared by threads). Use it as a context manager, or call ``close()``: calls still
    running then fail ``Unavailable`` "closed" (a direct one that was out may have run)."""

    def __init__(self, routers: str | Sequence[str] = DEFAULT_ROUTER, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcpclient", daemon=True)
        self._lock = threading.Lock()
        self._closed = False
        self._calls: set[concurrent.futures.Future[Any]] = set()
        self._thread.start()
        try:
            self._client: AsyncMeshClient = self._run(_create(routers, options))
        except BaseException:
            self._stop()
            raise

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            if self._closed:
                coro.close()
                raise Unavailable("this MeshClient is closed")
            future = asyncio.run_coroutine_threadsafe(coro, self._loop)
            self._calls.add(future)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise Unavailable("this MeshClient was closed while the call ran") from None
        except BaseException:  # KeyboardInterrupt, ...: the call stops too
            future.cancel()
            raise
        finally:
            with self._lock:
                self._calls.discard(future)

    def __enter__(self) -> MeshClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def stats(self) -> ClientStats:
        return self._client.stats

    @property
    def in_flight(self) -> int:
        return self._run(_in_flight(self._client))

    def infer(self, model: str, inputs: Mapping[str, Any], **kw: Any) -> dict[str, np.ndarray]:
        return self._run(self._client.infer(model, inputs, **kw))

    def route(self, model: str, key: str | None = None, **kw: Any) -> Route:
        return self._run(self._client.route(model, key, **kw))

    def load(self, model: str, versions: Sequence[str] = ("1",), replicas: int = 1, **kw: Any) -> ModelInfo:
        return self._run(self._client.load(model, versions, replicas, **kw))

    def unload(self, model: str, version: str | None = None, **kw: Any) -> None:
        self._run(self._client.unload(model, version, **kw))

    def status(self, model: str | None = None, **kw: Any) -> list[ModelInfo]:
        return self._run(self._client.status(model, **kw))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            running = list(self._calls)
        for future in running:  # their tasks are cancelled on the loop; their callers get Unavailable
            future.cancel()
        try:
            concurrent.futures.wait(running, timeout=5)
            asyncio.run_coroutine_threadsafe(self._client.close(), self._loop).result(timeout=10)
        finally:
            self._stop()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


async def _in_flight(client: AsyncMeshClient) -> int:
    return client.in_flight


async def _create(routers: str | Sequence[str], options: Mapping[str, Any]) -> AsyncMeshClient:
    return AsyncMeshClient(routers, **options)
