"""Native libraries' helper threads run under ``SCHED_BATCH`` (Linux), so waking one does not preempt the
event loop that woke it.

A ``SCHED_BATCH`` thread never preempts on wake-up: it runs on an idle CPU at once, or when the waker's
slice ends; why and what it measured: docs/design/helper-threads-sched-batch.md. Whether a process batches
them is a tuning knob whose default follows its cores (``mcpcore.tuning``).

The helpers are found by name (``HELPERS``: grpc++'s callback-queue threads, grpc core's executor threads,
libzmq's I/O and reaper threads): the process's own Python threads and the libraries' compute pools keep
the default. Threads the libraries start later are caught by calling ``batch_helpers`` again (the runner
does every ``RESCAN_S``). Off Linux, or where the kernel refuses, nothing changes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = ["HELPERS", "RESCAN_S", "batch_helpers"]

log = logging.getLogger(__name__)

#: Name prefixes (``/proc/self/task/*/comm``, 15 characters at most) of the threads put under SCHED_BATCH.
HELPERS = ("nexting_thread", "default-executo", "ZMQbg/")
RESCAN_S = 10.0  # how often the runner looks for helper threads started since


def batch_helpers(tasks: Path = Path("/proc/self/task")) -> int:
    """Put this process's helper threads that are not yet under ``SCHED_BATCH``; returns how many changed
    (0 off Linux). A thread that ended meanwhile, or a refusal, is skipped."""
    batch = getattr(os, "SCHED_BATCH", None)
    if batch is None or not tasks.is_dir():
        return 0
    changed = 0
    for task in tasks.iterdir():
        try:
            name = (task / "comm").read_text().rstrip("\n")
            if not name.startswith(HELPERS):
                continue
            tid = int(task.name)
            if os.sched_getscheduler(tid) != batch:
                os.sched_setscheduler(tid, batch, os.sched_param(0))
                changed += 1
        except (OSError, ValueError) as exc:  # ended meanwhile, or refused (a sandbox): it keeps its policy
            log.debug("helper thread %s keeps its scheduling policy: %s", task.name, exc)
    return changed
