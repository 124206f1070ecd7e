"""Real servers for remote model repositories in tests: a folder over HTTP (``http.server`` in a thread,
counting requests per path) and an S3 endpoint (moto's ``ThreadedMotoServer``) holding a copy of one.

Nothing here mocks the worker's code: the repository talks HTTP and the S3 API to these servers as it would
to nginx or MinIO.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import threading
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

#: The credentials the S3 tests use (moto accepts any; with auth on, it checks them against its IAM).
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "AKIAMCPMESHTEST00001",
    "AWS_SECRET_ACCESS_KEY": "mcpmesh-test-secret-never-logged",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class RepoHTTPServer:
    """Serves ``root`` on a free loopback port; ``hits[path]`` counts GETs, ``cut`` names paths whose body
    stops half-way (a crash mid-download), ``auth`` is a ``(user, password)`` the server requires."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.hits: Counter[str] = Counter()
        self.cut: set[str] = set()
        self.auth: tuple[str, str] | None = None
        self.seen_auth: list[str | None] = []
        outer = self

        class Handler(SimpleHTTPRequestHandler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=str(root), **kwargs)

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                rel = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
                outer.hits[rel] += 1
                given = self.headers.get("Authorization")
                outer.seen_auth.append(given)
                if outer.auth is not None:
                    want = "Basic " + base64.b64encode(":".join(outer.auth).encode()).decode()
                    if given != want:
                        self.send_error(401, "Unauthorized")
                        return
                if rel in outer.cut:
                    data = (root / rel).read_bytes()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                super().do_GET()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, args=(0.05,), name="repo-http", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/"

    def __enter__(self) -> RepoHTTPServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


class S3Server:
    """moto's S3 (and IAM) on a free loopback port, in this process; ``env`` is what a client needs."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer  # noqa: PLC0415  a test-only dependency

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)

    def __enter__(self) -> S3Server:
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.env = {**S3_ENV, "AWS_ENDPOINT_URL": self.endpoint}
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()

    def client(self, **credentials: str) -> Any:
        import boto3  # noqa: PLC0415

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=S3_ENV["AWS_DEFAULT_REGION"],
            aws_access_key_id=credentials.get("key", S3_ENV["AWS_ACCESS_KEY_ID"]),
            aws_secret_access_key=credentials.get("secret", S3_ENV["AWS_SECRET_ACCESS_KEY"]),
        )

    def upload(self, folder: Path, bucket: str, prefix: str, only: tuple[str, ...] = ()) -> None:
        """``folder``'s files (or those under the relative paths ``only``) under ``s3://bucket/prefix/``
        (the bucket is created)."""
        s3 = self.client()
        s3.create_bucket(Bucket=bucket)
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder).as_posix()
            if only and not any(rel == o or rel.startswith(f"{o}/") for o in only):
                continue
            if path.is_file():
                s3.put_object(
                    Bucket=bucket,
                    Key=f"{prefix}/{path.relative_to(folder).as_posix()}",
                    Body=path.read_bytes(),
                )

    @contextlib.contextmanager
    def auth_enforced(self) -> Iterator[None]:
        """Requests are checked against moto's IAM (unknown keys refused, policies applied) while inside."""
        self._reset_auth(0)
        try:
            yield
        finally:
            self._reset_auth(float("inf"))

    def _reset_auth(self, count: float) -> None:
        req = urllib.request.Request(
            f"{self.endpoint}/moto-api/reset-auth",
            data=str(count).encode(),
            headers={"Content-Type": "text/plain"},  # not form data: moto reads the raw body
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()


@contextlib.contextmanager
def env_vars(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set while inside (boto3 reads its settings from there)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
