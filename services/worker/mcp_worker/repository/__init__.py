"""Model repositories (DESIGN §9): ``model_repository`` (read a version from a folder or a URL),
``files`` (read and check a version's files), ``manifest`` (what a version's files must be), ``sources``
(HTTP(S) and S3), ``cache`` (the local copies of a remote repository's files), ``cli`` (publish, check,
list).
"""

from mcp_worker.repository.cli import main
from mcp_worker.repository.model_repository import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_CACHE_DIR,
    DEFAULT_MAX_WEIGHTS_BYTES,
    ModelArtifact,
    ModelRepository,
    is_remote,
)

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_CACHE_DIR",
    "DEFAULT_MAX_WEIGHTS_BYTES",
    "ModelArtifact",
    "ModelRepository",
    "is_remote",
    "main",
]
