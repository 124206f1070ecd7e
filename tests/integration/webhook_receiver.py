"""A real HTTP webhook receiver for tests: records POSTed JSON bodies, answers scripted statuses.

It listens on ``127.0.0.1:0`` (the bound port is in ``url``) and serves from a background thread. Tests wait
on what arrived with ``wait_for(predicate, timeout)``, which blocks on a ``threading.Condition`` notified by
each request, so nothing sleeps. Use it as a context manager, or call ``close()``.

    with WebhookReceiver(statuses=[500]) as hook:       # first POST gets 500, the rest 200
        ...                                             # point the code under test at hook.url
        hook.wait_for(lambda posts: len(posts) >= 2, timeout=5)
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Post", "WebhookReceiver"]


@dataclass(frozen=True)
class Post:
    """One request received: its path, the parsed JSON body (None if not JSON), and the status answered."""

    path: str
    body: Any
    status: int
    content_type: str


class WebhookReceiver:
    def __init__(self, statuses: Iterable[int] = (), default_status: int = 200, path: str = "/api/v2/alerts"):
        self._statuses = list(statuses)
        self._default_status = default_status
        self._posts: list[Post] = []
        self._cond = threading.Condition()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}{path}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="webhook-receiver", daemon=True
        )
        self._thread.start()

    @property
    def posts(self) -> list[Post]:
        """Every request so far, the ones answered with an error status included."""
        with self._cond:
            return list(self._posts)

    @property
    def accepted(self) -> list[Any]:
        """The JSON bodies of the requests answered 2xx."""
        return [p.body for p in self.posts if 200 <= p.status < 300]

    def wait_for(self, predicate: Callable[[list[Post]], bool], timeout: float = 5.0) -> list[Post]:
        """Block until ``predicate(posts)`` holds; AssertionError with what arrived if it does not in time."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(list(self._posts)):
                left = deadline - time.monotonic()
                if left <= 0 or not self._cond.wait(left):
                    if predicate(list(self._posts)):
                        break
                    raise AssertionError(f"webhook: condition not met in {timeout}s; got {self._posts!r}")
            return list(self._posts)

    async def wait_for_async(
        self, predicate: Callable[[list[Post]], bool], timeout_s: float = 5.0
    ) -> list[Post]:
        """``wait_for`` from a coroutine: it blocks a worker thread, so the event loop (and the code under
        test that runs on it) goes on."""
        return await asyncio.to_thread(self.wait_for, predicate, timeout_s)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> WebhookReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _record(self, path: str, raw: bytes, content_type: str) -> int:
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        with self._cond:
            status = self._statuses.pop(0) if self._statuses else self._default_status
            self._posts.append(Post(path, body, status, content_type))
            self._cond.notify_all()
        return status

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = receiver._record(self.path, raw, self.headers.get("Content-Type", ""))
                payload = b"{}" if status < 300 else b'{"error": "scripted failure"}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                pass

        return Handler
