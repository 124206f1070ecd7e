"""Remote model repositories: where a file comes from (HTTP(S), S3); ``cache`` holds what they send.

- ``HttpSource``: ``http://`` / ``https://`` base URL; ``GET <base>/<model>/<version>/<file>`` with the
  standard library (proxies from ``HTTP(S)_PROXY`` as urllib reads them). A user and password in the URL
  are sent as HTTP Basic auth and never shown: every URL in a message or log line has them removed.
- ``S3Source``: ``s3://bucket/prefix``; boto3 (imported only for such a repository) with its own
  environment: ``AWS_ENDPOINT_URL`` (MinIO, Ceph), ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
  ``AWS_DEFAULT_REGION``, profiles and instance roles. Nothing of them is logged.

Every failure is an ``MCPError`` that names the URL (or ``s3://`` key) and says what to do: ``NotFound``
(HTTP 404/410, no such key or bucket), ``PermissionDenied`` (HTTP 401/403, S3 access denied, no
credentials), ``Unavailable`` (cannot connect, timeout, HTTP 5xx, a transfer cut short), ``DataLoss``
(a transfer that does not add up).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import logging
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any, Protocol

from mcpcore.errors import (
    FailedPrecondition,
    InvalidArgument,
    MCPError,
    NotFound,
    PermissionDenied,
    Unavailable,
)

__all__ = [
    "CHUNK_BYTES",
    "DEFAULT_TIMEOUT_S",
    "HttpSource",
    "S3Source",
    "Source",
    "open_source",
    "redact",
]

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
DEFAULT_TIMEOUT_S = 30.0


class Source(Protocol):
    """Where a remote repository's files come from; ``rel`` is ``index.json`` or ``<m>/<v>/<file>``."""

    location: str  # the repository, as shown in messages (no credentials)

    def url(self, rel: str) -> str: ...

    def chunks(self, rel: str) -> Iterator[bytes]:
        """The file's bytes, piece by piece; errors (raised from the iteration) name the URL."""
        ...


def redact(url: str) -> str:
    """``url`` without its user and password (and without a query or fragment)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def open_source(location: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Source:
    scheme = urllib.parse.urlsplit(location).scheme.lower()
    if scheme in ("http", "https"):
        return HttpSource(location, timeout_s=timeout_s)
    if scheme == "s3":
        return S3Source(location, timeout_s=timeout_s)
    raise InvalidArgument(
        f"repository {redact(location)}: unsupported scheme {scheme!r} (a folder, file://, http://, "
        "https:// or s3://bucket/prefix)"
    )


# --- HTTP(S) ------------------------------------------------------------------------------------------------


class HttpSource:
    def __init__(self, base: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        parts = urllib.parse.urlsplit(base)
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise InvalidArgument(f"repository {redact(base)}: not an http(s) URL with a host")
        if parts.query or parts.fragment:
            raise InvalidArgument(
                f"repository {redact(base)}: a repository URL takes no query or fragment (the files are "
                "<base>/<model>/<version>/<file>)"
            )
        self._headers = {"User-Agent": "mcpmesh-worker"}
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
            token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
            self._headers["Authorization"] = f"Basic {token}"
        netloc = parts.netloc.rpartition("@")[2]
        path = parts.path if parts.path.endswith("/") else parts.path + "/"
        self._base = urllib.parse.urlunsplit((parts.scheme.lower(), netloc, path, "", ""))
        self.location = redact(self._base)
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"HttpSource({self.location!r})"

    def url(self, rel: str) -> str:
        return self.location + urllib.parse.quote(rel)

    def chunks(self, rel: str) -> Iterator[bytes]:
        url = self.url(rel)
        # the scheme is http or https (checked in __init__)
        request = urllib.request.Request(self._base + urllib.parse.quote(rel), headers=self._headers)  # noqa: S310
        try:
            # the scheme is http or https (checked in __init__); redirects are followed, and what they
            # bring is checked against the manifest like anything else
            response = urllib.request.urlopen(request, timeout=self.timeout_s)  # noqa: S310
        except urllib.error.HTTPError as err:
            err.close()
            raise _http_error(url, err.code, str(err.reason)) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
            reason = getattr(err, "reason", err)
            raise Unavailable(
                f"{url}: cannot reach the model repository ({_reason(reason)}): check that the server is "
                "up and reachable from this worker, and MCP_WORKER_REPOSITORY"
            ) from None
        with response:
            length = response.headers.get("Content-Length")
            expected = int(length) if length and length.isdigit() else None
            got = 0
            while True:
                try:
                    chunk = response.read(CHUNK_BYTES)
                except (OSError, http.client.HTTPException) as err:
                    raise Unavailable(
                        f"{url}: the transfer failed ({_reason(err)}): try the load again"
                    ) from None
                if not chunk:
                    break
                got += len(chunk)
                yield chunk
            if expected is not None and got < expected:  # http.client does not say so itself
                raise Unavailable(
                    f"{url}: the transfer failed (the connection closed after {got} of {expected} bytes): "
                    "try the load again"
                )


def _reason(err: object) -> str:
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    text = str(err) or type(err).__name__
    return text[:200]


def _http_error(url: str, status: int, reason: str) -> MCPError:
    said = f"HTTP {status} {reason}".strip()
    if status in (404, 410):
        return NotFound(
            f"{url}: {said}: the repository does not have this file; publish the model there "
            "(python -m mcp_worker.repository publish DIR, then copy DIR to the server) or check "
            "MCP_WORKER_REPOSITORY"
        )
    if status in (401, 403):
        return PermissionDenied(
            f"{url}: {said}: the server refuses this worker; check the credentials in the repository URL "
            "and the server's access rules"
        )
    if status >= 500 or status in (408, 429):
        return Unavailable(f"{url}: {said}: the repository server failed; try the load again")
    return FailedPrecondition(f"{url}: {said}: the repository server refused the request")


# --- S3 -----------------------------------------------------------------------------------------------------

_S3_NOT_FOUND = frozenset({"NoSuchKey", "404", "NotFound"})
_S3_DENIED = frozenset(
    {
        "AccessDenied",
        "403",
        "Forbidden",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "AllAccessDisabled",
        "AccountProblem",
    }
)


class S3Source:
    def __init__(self, url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme.lower() != "s3" or not parts.netloc or "@" in parts.netloc:
            raise InvalidArgument(f"repository {redact(url)}: expected s3://bucket/prefix")
        if parts.query or parts.fragment:
            raise InvalidArgument(f"repository {redact(url)}: an s3:// repository takes no query or fragment")
        self.bucket = parts.netloc
        prefix = parts.path.strip("/")
        self.prefix = f"{prefix}/" if prefix else ""
        self.location = f"s3://{self.bucket}/{self.prefix}"
        self.timeout_s = timeout_s
        self._client: Any = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"S3Source({self.location!r})"

    def url(self, rel: str) -> str:
        return self.location + rel

    def _s3(self) -> Any:
        with self._lock:
            if self._client is None:
                try:
                    import boto3  # noqa: PLC0415  only s3:// repositories need it
                    from botocore.config import Config  # noqa: PLC0415
                except ImportError:
                    raise FailedPrecondition(
                        f"repository {self.location}: s3:// repositories need boto3 on the worker "
                        "(pip install boto3)"
                    ) from None
                config = Config(
                    connect_timeout=min(self.timeout_s, 10.0),
                    read_timeout=self.timeout_s,
                    retries={"max_attempts": 3, "mode": "standard"},
                    user_agent_extra="mcpmesh-worker",
                )
                # botocore's DEBUG lines carry request headers and signing input: never in our logs
                for name in ("botocore", "boto3", "s3transfer"):
                    quiet = logging.getLogger(name)
                    if quiet.getEffectiveLevel() < logging.INFO:
                        quiet.setLevel(logging.INFO)
                # credentials, region and endpoint (AWS_ENDPOINT_URL: MinIO, Ceph) from boto3's own chain
                self._client = boto3.session.Session().client("s3", config=config)
            return self._client

    def chunks(self, rel: str) -> Iterator[bytes]:
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError  # noqa: PLC0415

        url, client = self.url(rel), self._s3()
        try:
            body = client.get_object(Bucket=self.bucket, Key=self.prefix + rel)["Body"]
        except ClientError as err:
            raise _s3_error(url, self.bucket, err.response) from None
        except NoCredentialsError:
            raise PermissionDenied(
                f"{url}: no AWS credentials: give the worker AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                "(or a profile or instance role) that may read the bucket"
            ) from None
        except BotoCoreError as err:
            raise Unavailable(
                f"{url}: cannot reach the model repository ({type(err).__name__}): check AWS_ENDPOINT_URL "
                "and that the S3 server is up and reachable from this worker"
            ) from None
        with contextlib.closing(body):
            while True:
                try:
                    chunk = body.read(CHUNK_BYTES)
                except (BotoCoreError, OSError) as err:
                    raise Unavailable(
                        f"{url}: the transfer failed ({type(err).__name__}): try the load again"
                    ) from None
                if not chunk:
                    return
                yield chunk


def _s3_error(url: str, bucket: str, response: dict[str, Any]) -> MCPError:
    code = str(response.get("Error", {}).get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    said = f"S3 {code or status}"
    if code == "NoSuchBucket":
        return NotFound(
            f"{url}: {said}: there is no bucket {bucket!r} at this endpoint; check the repository"
        )
    if code in _S3_NOT_FOUND or status == 404:
        return NotFound(
            f"{url}: {said}: the bucket does not have this key; publish the model there "
            "(python -m mcp_worker.repository publish DIR, then sync DIR to the bucket) or check "
            "MCP_WORKER_REPOSITORY"
        )
    if code in _S3_DENIED or status in (401, 403):
        return PermissionDenied(
            f"{url}: {said}: access denied: the worker's AWS credentials (AWS_ACCESS_KEY_ID, a profile or "
            "role) need s3:GetObject on this bucket and prefix"
        )
    if status >= 500 or code in ("SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout"):
        return Unavailable(f"{url}: {said}: the S3 server failed; try the load again")
    return FailedPrecondition(f"{url}: {said}: the S3 server refused the request")
