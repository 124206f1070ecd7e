"""The ONNX backend: an onnxruntime session built from the model's bytes, in memory, on the CPU or a GPU.

Invariants:
- The session is made from the (decrypted) bytes, never from a path: plaintext weights never touch disk.
- At load, the session's inputs must be exactly the config's inputs, and the config's outputs a subset of
  the session's, with equal element types and ranks; a dim the model fixes must be fixed to the same size
  in the config (a config ``-1`` where the model has a fixed size would only fail later, per request).
  Any mismatch is an ``InvalidArgument`` naming the tensor. Bytes that are not an ONNX model are
  ``DataLoss``.
- ``memory_bytes`` is the measured size of the model bytes: the weights the session holds. onnxruntime's
  arena for activations grows with batch size and is not counted.
- ``InferenceSession.run`` is thread-safe, so one session serves concurrent ``infer`` calls. Threads per
  run default to one: the worker runs several models and batches side by side, and each already has its
  own executor thread.
- onnxruntime runs every node of a graph whatever outputs are fetched (measured: fetching one output of
  two costs the same), so a model with ``qos.secondary_features`` gets a second session at load, built
  from the graph pruned to its primary outputs (``onnx.utils.Extractor``, in memory): breaker level 2
  then skips the secondary work for real. Its bytes count in ``memory_bytes``.
- Where it runs (``choose_providers``, pure): ``device: cpu`` takes the CPU provider. ``device: gpu`` takes
  onnxruntime's CUDA execution provider on the worker's GPU (``device``, the worker's ``gpu_index``), with
  the CPU provider behind it for nodes CUDA lacks. Without a CUDA provider in this onnxruntime
  (``onnxruntime-gpu``, the ``onnx-gpu`` extra), or when the session could not start it (no GPU or
  driver: onnxruntime then quietly runs on the CPU), the load fails ``FailedPrecondition`` saying what to
  install, unless model.yaml says ``cpu_fallback: true``: then it runs on the CPU and ``fallback`` says
  why (the replica record shows it). ``device`` tells where it runs: ``cpu`` or ``gpu:<index>``.
- On a GPU a run binds its inputs and outputs (``io_binding``): each input is copied once from the
  request's host memory (pageable: no pinned staging buffer yet) to the device, each output once back.
  ``measured_device_bytes`` is the rise of the device's used memory (NVML) across the load and a run at
  ``max_batch_size`` rows (the arena grows on first runs; GPU loads are serialised so each measures only
  itself, but other processes on that GPU show there too, and the first GPU model also carries the CUDA
  context), and ``memory_bytes`` the larger of it and the model's bytes. Closing drops the sessions,
  which frees their device memory (onnxruntime's arena goes with its session).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from mcp_worker.backends.base import Backend, short_error
from mcp_worker.nvml import nvml_index
from mcpcore.errors import DataLoss, FailedPrecondition, InvalidArgument
from mcpcore.modelspec import ModelConfig, TensorSpec

try:
    import onnx
    import onnx.utils
    import onnxruntime as ort
except ImportError as _err:  # the worker still serves layer-graph models without it
    ort = None
    _IMPORT_ERROR = short_error(_err)

__all__ = ["CPU_PROVIDER", "CUDA_PROVIDER", "ORT_TYPES", "OnnxBackend", "choose_providers"]

log = logging.getLogger(__name__)

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
_PROVIDER = CPU_PROVIDER  # every onnxruntime build has it: the backend is available wherever that is
_GPU_LOADS = threading.Lock()  # GPU loads measure device memory around themselves: one at a time
_INSTALL_HINT = (
    "on a host with CUDA, put onnxruntime-gpu in place of onnxruntime "
    "(pip uninstall -y onnxruntime; pip install 'mcpmesh[onnx-gpu]')"
)
_WARNINGS_OFF = 3  # onnxruntime log severity: errors and fatal only

#: onnxruntime's element type names -> ours (mcpcore.dtypes).
ORT_TYPES: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(bfloat16)": "BF16",
}


class OnnxBackend(Backend):
    """One onnxruntime ``InferenceSession``, on the CPU or (``device: gpu``) the CUDA execution provider."""

    name = "onnx"
    takes_device = True
    inline = True  # ``InferenceSession.run`` is thread-safe and takes no request parameters

    def __init__(
        self,
        config: ModelConfig,
        weights: bytes | None,
        *,
        device: int | None = None,
        intra_op_num_threads: int = 1,
    ) -> None:
        super().__init__(config, weights)
        ok, reason = self.available()
        if not ok:
            raise FailedPrecondition(f"{self._where}: unavailable: {reason}")
        if not weights:
            raise InvalidArgument(f"{self._where}: no model bytes given (the config's weights file)")
        index = 0 if device is None else device
        self._providers, self.fallback = choose_providers(
            config, ort.get_available_providers(), index, self._where
        )
        gpu = self._providers[0] != CPU_PROVIDER
        self.measured_device_bytes = 0
        self._pruned: dict[frozenset[str], Any] = {}  # skipped outputs -> a session without their nodes
        self._threads = intra_op_num_threads
        self._bytes = bytes(weights) if config.qos.secondary_features else b""
        self._lock = threading.Lock()
        self._outputs = [spec.name for spec in config.outputs]
        with _GPU_LOADS if gpu else contextlib.nullcontext():  # one at a time: each measures its own load
            used_before = _device_used_bytes(index) if gpu else None
            self._session: Any = _session(bytes(weights), intra_op_num_threads, self._where, self._providers)
            if gpu and CUDA_PROVIDER not in self._session.get_providers():  # it could not start the provider
                why = (
                    f"onnxruntime could not start {CUDA_PROVIDER} on GPU {index} (no GPU or driver, a device "
                    "index past the visible GPUs, or no device memory left; onnxruntime's own words are on "
                    "the worker's stdout)"
                )
                if not config.cpu_fallback:
                    raise FailedPrecondition(
                        f"{self._where}: device: gpu, but {why}; or set cpu_fallback: true"
                    )
                self._providers, self.fallback, gpu = [CPU_PROVIDER], why, False
            self.device = f"gpu:{index}" if gpu else "cpu"
            if self.fallback:
                log.warning("%s: runs on the CPU: %s (cpu_fallback: true)", self._where, self.fallback)
            self._check_signature()
            self.memory_bytes = len(weights)
            if config.qos.secondary_features:  # the one breaker level 2 uses with the default policy
                self._session_for(frozenset(config.qos.secondary_features))
            if gpu and used_before is not None:
                self.infer(self._largest_batch())  # onnxruntime's device arena grows on the first runs
                used_after = _device_used_bytes(index)
                if used_after is not None:
                    self.measured_device_bytes = max(0, used_after - used_before)
                    self.memory_bytes = max(self.memory_bytes, self.measured_device_bytes)

    def _largest_batch(self) -> dict[str, np.ndarray]:
        """Zeros at ``max_batch_size`` rows (every other variable dim 1): what the arena must hold."""
        batched = self.config.max_batch_size > 0
        return {
            spec.name: np.zeros(
                [
                    self.config.max_batch_size if i == 0 and batched else max(d, 1)
                    for i, d in enumerate(spec.shape)
                ],
                dtype=self._dtypes[spec.name],
            )
            for spec in self.config.inputs
        }

    @classmethod
    def available(cls) -> tuple[bool, str]:
        if ort is None:
            return False, f"onnxruntime cannot be imported: {_IMPORT_ERROR}"
        if _PROVIDER not in ort.get_available_providers():
            return False, f"onnxruntime has no {_PROVIDER} (has {ort.get_available_providers()})"
        return True, ""

    def _run(
        self, inputs: Mapping[str, np.ndarray], *, skip: frozenset[str], parameters: Mapping[str, str]
    ) -> dict[str, np.ndarray]:
        session = self._session  # a local reference: a concurrent close cannot pull it away mid-run
        if session is None:
            raise FailedPrecondition(f"{self._where} is closed")
        feed = {name: np.ascontiguousarray(array) for name, array in inputs.items()}
        skip = skip & frozenset(self.config.qos.secondary_features)
        if skip:
            session = self._session_for(skip)
        wanted = [name for name in self._outputs if name not in skip]
        if self.device == "cpu":
            results = session.run(wanted, feed)
        else:  # one copy in, one copy out, bound to the request's own memory
            binding = session.io_binding()
            for name, array in feed.items():
                binding.bind_cpu_input(name, array)
            for name in wanted:
                binding.bind_output(name)
            session.run_with_iobinding(binding)
            results = binding.copy_outputs_to_cpu()
        return dict(zip(wanted, results, strict=True))

    def _session_for(self, skip: frozenset[str]) -> Any:
        """The session of the graph pruned to the outputs not in ``skip`` (built once per ``skip``)."""
        pruned = self._pruned.get(skip)
        if pruned is not None:
            return pruned
        with self._lock:
            pruned = self._pruned.get(skip)
            if pruned is None:
                keep = [name for name in self._outputs if name not in skip]
                model = onnx.load_model_from_string(self._bytes)
                inputs = [spec.name for spec in self.config.inputs]
                small = onnx.utils.Extractor(model).extract_model(inputs, keep).SerializeToString()
                pruned = self._pruned[skip] = _session(small, self._threads, self._where, self._providers)
                self.memory_bytes += len(small)
        return pruned

    def _release(self) -> None:
        self._session = None
        self._pruned.clear()
        self._bytes = b""

    def _check_signature(self) -> None:
        model_in = {arg.name: arg for arg in self._session.get_inputs()}
        model_out = {arg.name: arg for arg in self._session.get_outputs()}
        want_in = [spec.name for spec in self.config.inputs]
        if sorted(model_in) != sorted(want_in):
            raise InvalidArgument(
                f"{self._where}: model.yaml inputs {sorted(want_in)} differ from the ONNX model's inputs "
                f"{sorted(model_in)}"
            )
        unknown = [spec.name for spec in self.config.outputs if spec.name not in model_out]
        if unknown:
            raise InvalidArgument(
                f"{self._where}: model.yaml outputs {unknown} are not outputs of the ONNX model "
                f"(it has {sorted(model_out)})"
            )
        for spec in self.config.inputs:
            self._check_arg("input", spec, model_in[spec.name])
        for spec in self.config.outputs:
            self._check_arg("output", spec, model_out[spec.name])

    def _check_arg(self, kind: str, spec: TensorSpec, arg: Any) -> None:
        what = f"{self._where}: {kind} {spec.name}"
        dtype = ORT_TYPES.get(arg.type, arg.type)
        if dtype != spec.dtype:
            raise InvalidArgument(f"{what}: model.yaml says {spec.dtype} but the ONNX model has {dtype}")
        model_shape = [d if isinstance(d, int) else -1 for d in arg.shape]
        mismatch = len(model_shape) != len(spec.shape) or any(
            m not in (-1, s) for m, s in zip(model_shape, spec.shape, strict=True)
        )
        if mismatch:
            raise InvalidArgument(
                f"{what}: model.yaml shape {list(spec.shape)} does not fit the ONNX model's {model_shape}"
                " (-1 = variable)"
            )


def choose_providers(
    config: ModelConfig, available: list[str], device: int, where: str
) -> tuple[list[Any], str]:
    """The execution providers a session of ``config`` gets, given the ones this onnxruntime has, and
    why it runs on the CPU though model.yaml asks for a GPU (empty when it does not)."""
    if config.device != "gpu":
        return [CPU_PROVIDER], ""
    if CUDA_PROVIDER in available:
        return [(CUDA_PROVIDER, {"device_id": device}), CPU_PROVIDER], ""
    why = f"this onnxruntime has no {CUDA_PROVIDER} (it has {', '.join(available) or 'none'})"
    if not config.cpu_fallback:
        raise FailedPrecondition(
            f"{where}: device: gpu, but {why}; {_INSTALL_HINT}, or set cpu_fallback: true"
        )
    return [CPU_PROVIDER], why


def _device_used_bytes(cuda_index: int) -> int | None:
    """The used memory of the GPU CUDA calls ``cuda_index``, from NVML (every process's), or None without
    NVML or a mapping to its device (``nvml.nvml_index``)."""
    try:
        import pynvml  # noqa: PLC0415  (nvidia-ml-py; only GPU hosts have it)

        pynvml.nvmlInit()
        try:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            index = nvml_index(cuda_index, pynvml, handles)
            return None if index is None else int(pynvml.nvmlDeviceGetMemoryInfo(handles[index]).used)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def _session(model: bytes, intra_op_num_threads: int, where: str, providers: list[Any]) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_num_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = _WARNINGS_OFF
    try:
        return ort.InferenceSession(model, options, providers=providers)
    except Exception as err:
        if type(err).__name__ == "InvalidProtobuf":
            raise DataLoss(f"{where}: the model bytes are not an ONNX model: {short_error(err)}") from None
        raise InvalidArgument(f"{where}: onnxruntime cannot load the model: {short_error(err)}") from None
