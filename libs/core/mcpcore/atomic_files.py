"""Files replaced whole or not at all.

Invariant: a reader of ``path`` sees its old content or its new content, never a part: the new one is
written to a temporary file beside it (same file system), flushed to disk, and renamed over it; on any
error the temporary file goes and ``path`` is untouched.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

__all__ = ["atomic_write"]


def atomic_write(path: Path, pieces: Iterable[bytes], mode: int) -> None:
    """Replace ``path`` with ``pieces``, in that order, as a file of permissions ``mode``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            for piece in pieces:
                f.write(piece)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
