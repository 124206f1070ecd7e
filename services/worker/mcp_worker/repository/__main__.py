"""``python -m mcp_worker.repository``: publish, check or list a model repository (``cli``)."""

import sys

from mcp_worker.repository.cli import main

sys.exit(main())
