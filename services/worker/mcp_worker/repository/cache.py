"""The local cache of a remote repository's files: by sha256 (``<cache>/sha256/<digest>``), each downloaded
into ``<cache>/tmp`` and checked (size and sha256 against its manifest entry) before it is renamed into
place, so a file under ``sha256/`` is whole and was right when written; least recently used files (by
mtime, touched on every use) are removed past ``max_bytes``, never one pinned by a load in progress.

Every failure is an ``MCPError`` that names the file: ``DataLoss`` (size or sha256 differs from the
manifest), ``ResourceExhausted`` (a file larger than the cache), and those of the source it came from.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from mcpcore.errors import (
    DataLoss,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
)

__all__ = ["ContentCache"]

log = logging.getLogger(__name__)

#: Partial downloads older than this in ``<cache>/tmp`` are left over from a crash: removed at start.
STALE_TMP_S = 3600.0


def _touch(path: Path) -> None:
    """Mark ``path`` most recently used: its mtime from the fine clock (file times tick coarsely)."""
    now = time.time_ns()
    with contextlib.suppress(OSError):
        os.utime(path, ns=(now, now))


class ContentCache:
    """Files by sha256 under ``root``, at most ``max_bytes`` of them (least recently used go first)."""

    def __init__(self, root: str | Path, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise InvalidArgument(f"repository cache {root}: the size limit must be > 0, got {max_bytes}")
        self.root = Path(root)
        self.max_bytes = max_bytes
        self._blobs = self.root / "sha256"
        self._tmp = self.root / "tmp"
        self._lock = threading.Lock()  # the pins and the per-digest locks
        self._pins: dict[str, int] = {}
        self._fetching: dict[str, threading.Lock] = {}
        self._ready = False
        self.downloads = 0  # files fetched (tests and logs)

    def __repr__(self) -> str:
        return f"ContentCache({str(self.root)!r}, max_bytes={self.max_bytes})"

    def _prepare(self) -> None:
        if self._ready:
            return
        try:
            for d in (self.root, self._blobs, self._tmp):
                d.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as err:
            raise FailedPrecondition(
                f"repository cache {self.root}: cannot create it ({err.strerror or err}): set "
                "MCP_WORKER_REPOSITORY_CACHE to a writable directory"
            ) from None
        now = time.time()
        for stale in self._tmp.iterdir():
            with contextlib.suppress(OSError):
                if now - stale.stat().st_mtime > STALE_TMP_S:
                    stale.unlink()
        self._ready = True

    def path(self, digest: str) -> Path:
        return self._blobs / digest

    @contextlib.contextmanager
    def pinned(self, digests: Iterable[str]) -> Iterator[None]:
        """Keep these files from eviction while the block runs (a load in progress)."""
        held = list(digests)
        with self._lock:
            for d in held:
                self._pins[d] = self._pins.get(d, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                for d in held:
                    left = self._pins[d] - 1
                    if left:
                        self._pins[d] = left
                    else:
                        del self._pins[d]

    def forget(self, digest: str) -> None:
        """Drop a cached file found bad on use; it is fetched again next time."""
        with contextlib.suppress(FileNotFoundError):
            self.path(digest).unlink()

    def get(
        self, digest: str, size: int, download: Callable[[], Iterator[bytes]], *, url: str
    ) -> tuple[Path, bool]:
        """The cached file holding ``digest`` (``size`` bytes), downloaded first if absent; and whether it
        was downloaded now. The caller pins ``digest`` first."""
        self._prepare()
        path = self.path(digest)
        with self._lock:
            lock = self._fetching.setdefault(digest, threading.Lock())
        with lock:
            try:
                st = path.stat()
            except FileNotFoundError:
                st = None
            if st is not None and st.st_size == size:
                _touch(path)
                return path, False
            if st is not None:
                self.forget(digest)
            if size > self.max_bytes:
                raise ResourceExhausted(
                    f"{url}: {size} bytes, larger than the whole repository cache "
                    f"({self.max_bytes} bytes): raise MCP_WORKER_REPOSITORY_CACHE_BYTES"
                )
            self.evict(room=size)
            self._download(path, digest, size, download, url)
            self.downloads += 1
        self.evict()
        return path, True

    def _download(
        self, path: Path, digest: str, size: int, download: Callable[[], Iterator[bytes]], url: str
    ) -> None:
        tmp = self._tmp / f"{digest}.{os.getpid()}.{threading.get_ident()}.part"
        h, got = hashlib.sha256(), 0
        started = time.monotonic()
        try:
            with tmp.open("wb") as f:
                pieces = download()
                try:
                    for chunk in pieces:
                        got += len(chunk)
                        if got > size:
                            raise DataLoss(
                                f"{url}: larger than the {size} bytes its manifest says: the file changed "
                                "after the manifest was written; republish (python -m mcp_worker.repository "
                                "publish DIR) or restore the file"
                            )
                        h.update(chunk)
                        f.write(chunk)
                finally:
                    close = getattr(pieces, "close", None)
                    if close is not None:
                        close()
                f.flush()
                os.fsync(f.fileno())
            if got != size:
                raise DataLoss(
                    f"{url}: {got} bytes, but its manifest says {size}: the file changed after the "
                    "manifest was written; republish (python -m mcp_worker.repository publish DIR) or "
                    "restore the file"
                )
            if h.hexdigest() != digest:
                raise DataLoss(
                    f"{url}: sha256 {h.hexdigest()}, but its manifest says {digest}: the file was modified "
                    "or damaged; restore it, or republish the manifest if the change is intended "
                    "(python -m mcp_worker.repository publish DIR)"
                )
            os.replace(tmp, path)
            _touch(path)
        except OSError as err:
            raise FailedPrecondition(
                f"repository cache {self.root}: cannot write {url} into it ({err.strerror or err}): free "
                "disk space or set MCP_WORKER_REPOSITORY_CACHE to a writable directory"
            ) from None
        finally:
            tmp.unlink(missing_ok=True)
        log.info(
            "fetched %s (%d bytes) into the repository cache in %.2fs", url, size, time.monotonic() - started
        )

    def evict(self, room: int = 0) -> list[str]:
        """Remove least recently used files until the cache holds at most ``max_bytes - room``; pinned
        files stay. Returns the digests removed."""
        entries = []
        try:
            with os.scandir(self._blobs) as it:
                for e in it:
                    with contextlib.suppress(OSError):
                        st = e.stat(follow_symlinks=False)
                        entries.append((st.st_mtime, e.name, st.st_size))
        except FileNotFoundError:
            return []
        total = sum(size for _, _, size in entries)
        limit = self.max_bytes - room
        removed: list[str] = []
        for _, name, size in sorted(entries):
            if total <= limit:
                break
            with self._lock:
                if name in self._pins:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    (self._blobs / name).unlink()
            total -= size
            removed.append(name)
        if removed:
            log.info("repository cache %s: evicted %d files, %d bytes left", self.root, len(removed), total)
        return removed

    def total_bytes(self) -> int:
        try:
            return sum(p.stat().st_size for p in self._blobs.iterdir())
        except FileNotFoundError:
            return 0
