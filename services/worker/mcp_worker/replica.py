"""A replica this worker holds (``Replica``): its model, backend and queue, and what its record in etcd says
of it (``info``, which routers read); and what a scheduler's spec may override in model.yaml."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from mcp_worker.backends import Backend
from mcp_worker.batching import ModelQueue
from mcpcore.keys import ReplicaId
from mcpcore.lifecycle import ReplicaRecord, ReplicaState
from mcpcore.modelspec import ModelConfig, TensorSpec

__all__ = ["LoadOverrides", "Replica", "apply_overrides"]


@dataclass(frozen=True)
class LoadOverrides:
    """What a scheduler's spec may override in model.yaml (zero/None = keep model.yaml's)."""

    memory_bytes: int = 0
    max_batch_size: int = 0
    max_queue_delay_us: int | None = None
    priority: int | None = None
    latency_sensitivity: float | None = None


@dataclass
class Replica:
    rid: ReplicaId
    config: ModelConfig
    backend: Backend
    queue: ModelQueue
    memory_bytes: int
    state: ReplicaState
    since: float
    reason: str = ""
    record: ReplicaRecord | None = field(default=None, repr=False)

    @property
    def info(self) -> dict[str, Any]:
        """What the replica record says of the loaded model (routers read it); a re-sync writes it again,
        whatever survived in etcd."""
        config = self.config
        return {
            "memory_bytes": self.memory_bytes,
            "platform": config.backend,
            "inputs": _signature(config.inputs),
            "outputs": _signature(config.outputs),
            "secondary": list(config.qos.secondary_features),
            "idempotent": config.idempotent,
            "max_ongoing_requests": config.max_ongoing_requests,
            "config": _config_summary(config, self.backend),
        }

    @property
    def key(self) -> str:
        return f"{self.rid.model}/{self.rid.version}"

    @property
    def max_batch_size(self) -> int:
        """The max batch size in force (a breaker may have lowered it); 0: the model does not batch."""
        return self.queue.policy.max_batch_size if self.config.max_batch_size else 0


def apply_overrides(config: ModelConfig, o: LoadOverrides | None) -> ModelConfig:
    """``config`` with what ``o`` overrides (a scheduler's spec; zero/None keeps model.yaml's)."""
    if o is None:
        return config
    changes: dict[str, Any] = {}
    if o.memory_bytes:
        changes["memory_bytes"] = o.memory_bytes
    if o.max_batch_size:
        changes["max_batch_size"] = min(o.max_batch_size, config.max_batch_size) or config.max_batch_size
    if o.priority is not None:
        changes["priority"] = o.priority
    if o.latency_sensitivity is not None:
        changes["qos"] = replace(config.qos, latency_sensitivity=o.latency_sensitivity)
    if o.max_queue_delay_us is not None and config.dynamic_batching is not None:
        changes["dynamic_batching"] = replace(
            config.dynamic_batching, max_queue_delay_us=o.max_queue_delay_us
        )
    return replace(config, **changes)


def _config_summary(config: ModelConfig, backend: Backend) -> dict[str, Any]:
    """How the replica batches and where it runs, as routers report it (KServe ModelConfig): ``device``
    is ``gpu`` or ``cpu``, ``device_id`` the GPU's index, ``cpu_fallback`` why a model that asks for a GPU
    runs on the CPU."""
    batching = config.dynamic_batching
    kind, _, index = backend.device.partition(":")
    return {
        "max_batch_size": config.max_batch_size,
        "instance_count": config.instance_count,
        "device": kind,
        "device_id": int(index) if index else None,
        "cpu_fallback": backend.fallback,
        "decoupled": config.decoupled,
        "dynamic_batching": None
        if batching is None
        else {
            "max_queue_delay_us": batching.max_queue_delay_us,
            "preferred_batch_sizes": list(batching.preferred_batch_sizes),
            "priority_levels": batching.priority_levels,
            "default_priority_level": batching.default_priority_level,
            "default_queue_timeout_us": batching.default_queue_timeout_us,
            "max_queue_size": batching.max_queue_size,
        },
    }


def _signature(tensors: tuple[TensorSpec, ...]) -> list[dict[str, Any]]:
    """A model's inputs or outputs as the replica record carries them (routers serve model metadata)."""
    return [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in tensors]
