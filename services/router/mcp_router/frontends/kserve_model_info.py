"""Triton's ModelConfig and ModelStatistics messages for a model version, from DataPlane values: the gRPC
door sends them as they are, the REST door writes them as Triton's JSON.

Invariants: dims leave out the batch dimension when the model batches (max_batch_size > 0), as Triton's
do; a datatype protobuf's DataType lacks is TYPE_INVALID, never an error.
"""

from __future__ import annotations

from mcp_router.dataplane import Duration, ModelConfigInfo, ModelStats
from mcpapi.kserve import grpc_service_pb2 as pb
from mcpapi.kserve import model_config_pb2 as mc

__all__ = ["model_config_proto", "statistics_proto"]


def _duration(d: Duration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=d.count, ns=d.ns)


def statistics_proto(s: ModelStats) -> pb.ModelStatistics:
    return pb.ModelStatistics(
        name=s.name,
        version=s.version,
        last_inference=s.last_inference_ms,
        inference_count=s.inference_count,
        execution_count=s.execution_count,
        inference_stats=pb.InferStatistics(
            success=_duration(s.success),
            fail=_duration(s.fail),
            queue=_duration(s.queue),
            compute_input=_duration(s.compute_input),
            compute_infer=_duration(s.compute_infer),
            compute_output=_duration(s.compute_output),
        ),
        batch_stats=[
            pb.InferBatchStatistics(
                batch_size=b.batch_size,
                compute_input=_duration(b.compute_input),
                compute_infer=_duration(b.compute_infer),
                compute_output=_duration(b.compute_output),
            )
            for b in s.batches
        ],
    )


# --- model configuration -----------------------------------------------------------------------------

# Triton's names for our backends: (backend, platform)
_BACKEND = {"onnx": ("onnxruntime", "onnxruntime_onnx")}
_DATA_TYPES = frozenset(mc.DataType.keys())


def _config_dtype(dtype: str) -> int:
    """A datatype string as model_config's DataType: "FP32" -> TYPE_FP32, "BYTES" -> TYPE_STRING."""
    name = "TYPE_STRING" if dtype == "BYTES" else f"TYPE_{dtype}"
    return mc.DataType.Value(name) if name in _DATA_TYPES else mc.TYPE_INVALID


def model_config_proto(info: ModelConfigInfo) -> mc.ModelConfig:
    """Triton's ModelConfig for one version. Dims leave out the batch dimension when the model batches
    (max_batch_size > 0), as Triton's do; the queue policy rejects on timeout, and a request's own
    deadline may shorten the wait (the worker waits min(policy, deadline))."""
    batched = info.max_batch_size > 0
    backend, platform = _BACKEND.get(info.backend, (info.backend, ""))
    config = mc.ModelConfig(
        name=info.name,
        platform=platform,
        backend=backend,
        max_batch_size=info.max_batch_size,
        version_policy=mc.ModelVersionPolicy(
            specific=mc.ModelVersionPolicy.Specific(versions=[int(v) for v in info.versions])
        ),
        input=[
            mc.ModelInput(
                name=t.name, data_type=_config_dtype(t.dtype), dims=t.shape[1:] if batched else t.shape
            )
            for t in info.inputs
        ],
        output=[
            mc.ModelOutput(
                name=t.name, data_type=_config_dtype(t.dtype), dims=t.shape[1:] if batched else t.shape
            )
            for t in info.outputs
        ],
        instance_group=[
            mc.ModelInstanceGroup(
                name=f"{info.name}_{info.version}",
                count=info.instance_count,
                kind=mc.ModelInstanceGroup.KIND_GPU
                if info.device == "gpu"
                else mc.ModelInstanceGroup.KIND_CPU,
            )
        ],
        model_transaction_policy=mc.ModelTransactionPolicy(decoupled=info.decoupled),
    )
    batching = info.dynamic_batching
    if batching is not None:
        levels = batching.priority_levels if batching.priority_levels > 1 else 0  # Triton: 0 = no levels
        config.dynamic_batching.CopyFrom(
            mc.ModelDynamicBatching(
                preferred_batch_size=batching.preferred_batch_sizes,
                max_queue_delay_microseconds=batching.max_queue_delay_us,
                priority_levels=levels,
                default_priority_level=batching.default_priority_level if levels else 0,
                default_queue_policy=mc.ModelQueuePolicy(
                    timeout_action=mc.ModelQueuePolicy.REJECT,
                    default_timeout_microseconds=batching.default_queue_timeout_us,
                    allow_timeout_override=True,
                    max_queue_size=batching.max_queue_size,
                ),
            )
        )
    return config
