"""The worker's dynamic batcher (DESIGN §9): per-model queues, one dispatcher task, batches on threads.

One module per job: ``queue`` (one model version's queue: its waiting requests and figures),
``admission`` (what a queue takes: priority level, shape key, queue timeout: pure logic),
``dispatcher`` (the task that starts batches on free slots), ``policy`` (which requests form the next
batch, and when: pure logic), ``compute_shares`` (each model's share of the slots: pure logic),
``inline`` (when a fast model's batches run on the loop: pure logic), ``execution`` (one batch's run on its
thread), ``buffers`` (batch assembly in pool blocks), ``request`` (a queued request and its answer),
``metrics`` and ``model_statistics`` (what it reports), ``spans`` (its traces).
"""

from mcp_worker.batching.compute_shares import ModelShare
from mcp_worker.batching.dispatcher import Dispatcher
from mcp_worker.batching.metrics import BatchMetrics, QueueStats
from mcp_worker.batching.policy import BatchConfig
from mcp_worker.batching.queue import ModelQueue
from mcp_worker.batching.request import OnDone, RunBatch

__all__ = [
    "BatchConfig",
    "BatchMetrics",
    "Dispatcher",
    "ModelQueue",
    "ModelShare",
    "OnDone",
    "QueueStats",
    "RunBatch",
]
