"""mcp_native: the ctypes binding to the C code in ``libs/native`` (build it with ``make native``).

Importing this package never loads the library; ``available()`` says whether it can be, so callers fall
back to numpy buffers when it is not built.
"""

from mcp_native.pool import LIBRARY, Block, Pool, PoolExhausted, PoolStats, available

__all__ = ["LIBRARY", "Block", "Pool", "PoolExhausted", "PoolStats", "available"]
