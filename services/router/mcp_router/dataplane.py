"""The router's transport-neutral data plane: what the v1, v2 and KServe V2 front ends adapt to.

The front ends convert protobuf to these values and back and hold no logic; ``Router`` (router.py)
implements this interface over the etcd-fed snapshot and the ZeroMQ forwarder.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = ["DataPlane", "InferResult", "ModelIndexEntry", "ModelMetadata", "RouteDecision", "TensorMeta"]


@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype: str  # Triton style: "FP32"
    shape: tuple[int, ...]  # -1 = variable


@dataclass(frozen=True)
class ModelMetadata:
    name: str
    versions: tuple[str, ...]  # versions that can serve now
    platform: str  # the backend, e.g. "numpy" or "onnx"
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]


@dataclass(frozen=True)
class RouteDecision:
    model: str
    version: str
    worker_id: str
    data_endpoint: str  # the worker's ZeroMQ endpoint
    breaker_level: int
    header_flags: int  # TensorHeader flags the request must carry (e.g. secondary features off)


@dataclass(frozen=True)
class InferResult:
    model: str
    version: str
    worker_id: str
    outputs: dict[str, np.ndarray]


@dataclass(frozen=True)
class ModelIndexEntry:
    name: str
    version: str
    state: str  # Triton's words: "READY", "UNAVAILABLE", "LOADING", "UNLOADING"
    reason: str = ""


class DataPlane(abc.ABC):
    @abc.abstractmethod
    def live(self) -> bool: ...

    @abc.abstractmethod
    def ready(self) -> bool:
        """Serving: the snapshot is synced from etcd at least once."""

    @abc.abstractmethod
    def model_ready(self, model: str, version: str = "") -> bool: ...

    @abc.abstractmethod
    def model_metadata(self, model: str, version: str = "") -> ModelMetadata:
        """``NotFound`` when the model has no serving version."""

    @abc.abstractmethod
    def route(self, model: str, version: str = "", routing_key: str = "") -> RouteDecision: ...

    @abc.abstractmethod
    async def infer(
        self,
        model: str,
        version: str,
        request_id: str,
        inputs: Mapping[str, np.ndarray],
        *,
        routing_key: str = "",
        priority: int = 0,
        timeout_s: float | None = None,
        outputs: tuple[str, ...] = (),
        parameters: Mapping[str, str] = field(default_factory=dict),  # type: ignore[assignment]
    ) -> InferResult:
        """Route and run one request; errors are MCPErrors (``NotFound``, ``InvalidArgument``, ...).
        ``outputs`` (empty: all) are checked here: an unknown name is ``InvalidArgument``, and the result
        holds the named ones that were computed (breaker level 2 may leave a secondary one out)."""

    @abc.abstractmethod
    def index(self) -> list[ModelIndexEntry]: ...

    @abc.abstractmethod
    async def load(self, model: str, version: str = "") -> None:
        """Forwarded to the scheduler (RepositoryModelLoad)."""

    @abc.abstractmethod
    async def unload(self, model: str) -> None:
        """Forwarded to the scheduler (RepositoryModelUnload)."""
