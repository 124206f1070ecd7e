"""The worker's prometheus metrics, defined once: the standard request metrics (``mcpcore.metrics``) and
the worker's own. The batcher, the tensor socket and the control service each feed theirs."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from mcpcore.metrics import RequestMetrics

__all__ = ["WorkerMetrics"]


class WorkerMetrics(RequestMetrics):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.batch_size = self.standard("mcp_batch_size")
        self.batch_utilization = self.standard("mcp_batch_utilization_ratio")
        self.queue_depth = self.standard("mcp_queue_depth")
        self.queue_delay = self.standard("mcp_queue_delay_seconds")
        self.model_state = self.standard("mcp_model_state")
        self.gpu_memory = self.standard("mcp_gpu_memory_used_bytes")
        self.gpu_utilization = self.standard("mcp_gpu_utilization_ratio")
        self.load_failures = self.standard("mcp_model_load_failures_total")
        self.breaker_level = self.standard("mcp_breaker_level")
        self.executions = self.counter(
            "mcp_worker_executions_total", "Requests executed (as their batch started).", ("model",)
        )
        self.duplicate_executions = self.counter(
            "mcp_worker_duplicate_executions_total",
            "Requests executed again on this worker (a request id seen before, within the window).",
            ("model",),
        )
        self.deadline_dropped = self.counter(
            "mcp_worker_deadline_dropped_total",
            "Requests dropped before they ran: their deadline or the model's queue timeout passed.",
            ("model", "version"),
        )
        self.fenced_calls = self.counter(
            "mcp_worker_fenced_calls_total",
            "Control calls refused because they came from a deposed leader.",
            ("role",),
        )
        self.zmq_messages = self.counter(
            "mcp_worker_zmq_messages_total",
            "Request messages on the tensor socket: single, or coalesced (several requests in one).",
            ("kind",),
        )
        self.inline_batches = self.counter(
            "mcp_worker_inline_batches_total",
            "Batches run on the event loop: the model's recent batches each took at most inline_batch_ms.",
            ("model", "version"),
        )
        self.coalesced_requests = self.counter(
            "mcp_worker_coalesced_requests_total", "Requests that arrived in coalesced messages."
        )
        self.shared_memory_bytes = self.counter(
            "mcp_worker_shared_memory_bytes_total",
            "Tensor bytes same-host senders passed in their shared memory: inputs read there (in), outputs "
            "written into their reply regions (out).",
            ("direction",),
        )
        self.shared_memory_refused = self.counter(
            "mcp_worker_shared_memory_refused_total",
            "Requests whose shared memory could not be taken (answered with an error; not started when "
            "the sender may resend them with frames). The worker log says why.",
        )
        self.admission_refused = self.counter(
            "mcp_worker_admission_refused_total",
            "Requests refused at the door: the worker was full (exceeds maximum queue size).",
        )
        self.macs = self.counter(
            "mcp_worker_macs_total", "Multiply-accumulates the layer graphs' dense layers did.", ("model",)
        )
        self.blas_threads = self.gauge(
            "mcp_worker_blas_threads",
            "Threads a numpy model's matrix product may use, as the BLAS library reports it.",
        )
