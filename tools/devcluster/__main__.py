"""``python -m mcp_devcluster up|down|status``: what ``make up``, ``make down`` and ``make status`` run."""

import sys

from mcp_devcluster.launcher import main

sys.exit(main())
