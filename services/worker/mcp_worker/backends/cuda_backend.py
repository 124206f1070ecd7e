"""The cuda backend: a model.yaml layer graph run on one GPU by ``libs/native/cuda``'s kernels, via pycuda.

The graph is parsed and checked by the numpy backend's own code (``_Tensors`` and ``_compile``), so both
backends accept and reject exactly the same models; ``plan_layers`` turns the checked steps into kernel
launches and needs no GPU. Formulas are numpy_backend's; outputs match it within 1e-4 (tests/gpu).

Per model instance (one ``CudaBackend``): the weights, uploaded once at load; two activation buffers on the
device sized for ``max_batch_size`` rows (grown, never shrunk, if more rows come); page-locked host buffers
for the input and output; one CUDA stream. A run copies the input into the page-locked buffer (or takes it
straight from caller memory registered with ``pin_host_memory``), queues the host-to-device copy, every
kernel and the device-to-host copy on the stream, and waits for that stream alone.

Invariants (the device and its shared context: ``cuda_device``):
- One lock per instance: runs of one model are serialised (one stream, one set of buffers); runs of
  different models overlap on their own streams.
- ``memory_bytes`` counts the device bytes this instance allocated (weights and activations): what the
  worker's budget reserves. ``measured_device_bytes`` is the drop of ``mem_get_info``'s free bytes across
  the load: the allocator's 2 MiB granularity shows there (small models may share a page and show 0), and
  the kernels' code does not (CUDA loads modules lazily, at the first run). ``close`` frees all of it and
  unloads the module, so free device memory returns to its value before the load (tests/gpu checks this).
- Streams are non-blocking (they never wait on the legacy default stream, which the synchronous weight
  upload uses); the load ends with a context synchronize, so no kernel can read a weight early.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any

import numpy as np

from mcp_worker.backends import cuda_device
from mcp_worker.backends.base import Backend, short_error
from mcp_worker.backends.numpy_backend import (
    _compile,
    _sleep,
    _Tensors,
    dense,
    gelu,
    layernorm,
    relu,
    softmax,
)
from mcpcore.errors import FailedPrecondition, Internal, InvalidArgument, MCPError, ResourceExhausted
from mcpcore.modelspec import ModelConfig, layer_reads

__all__ = ["KERNELS", "ROW_THREADS", "TILE", "CudaBackend", "Op", "plan_layers"]

log = logging.getLogger(__name__)
_PAGE = 4096

#: The kernels' ``extern "C"`` names in kernels.cu, with their pycuda argument formats (struct characters).
KERNELS = {
    "mcp_dense_f32": "PPPPiii",  # x, W, b or 0, y, M, K, N
    "mcp_relu_f32": "PPq",  # x, y, n
    "mcp_gelu_f32": "PPq",
    "mcp_softmax_rows_f32": "PPii",  # x, y, rows, cols
    "mcp_layernorm_rows_f32": "PPPPiif",  # x, y, gamma or 0, beta or 0, rows, cols, eps
}
TILE = 16  # MCP_TILE in kernels.cu: dense blocks are TILE x TILE threads, one output each
ROW_THREADS = 256  # MCP_ROW_THREADS in kernels.cu: one block per row for softmax and layernorm
_ELEMENTWISE_THREADS = 256
_MAX_GRID_BLOCKS = 65535  # grid y is limited to this; the row and element-wise kernels loop past it
_MAX_ROWS = 2**31 - 1  # rows travel as a C int
_STREAM_NON_BLOCKING = 1  # CU_STREAM_NON_BLOCKING in cuda.h


# --- the plan: pure, no GPU ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One step on the GPU (or a host-side sleep); ``dim_in``/``dim_out`` are the incoming/outgoing last dims.

    ``weight``/``bias``: dense ``[in, out]``/``[out]``, or layernorm's optional ``[dim]`` scale and shift."""

    kind: str  # dense | relu | gelu | softmax | layernorm | sleep
    dim_in: int
    dim_out: int
    weight: np.ndarray | None = None
    bias: np.ndarray | None = None
    eps: float = 0.0
    seconds: float = 0.0


def plan_layers(config: ModelConfig, weights: bytes | None, where: str) -> tuple[Op, ...]:
    """The launches for ``config``'s layer graph, checked exactly as the numpy backend checks it, in FP32."""
    if not config.layers or len(config.inputs) != 1 or len(config.outputs) != 1:
        raise InvalidArgument(
            f"{where}: the cuda backend runs a chain of layers with one input and one output; this model "
            f"has {len(config.outputs)} outputs: serve it with backend numpy"
        )
    reads = layer_reads(config.layers, config.inputs[0].name)
    if any(r != i - 1 for i, r in enumerate(reads)):
        raise InvalidArgument(
            f"{where}: the cuda backend runs a chain of layers; this graph branches ('from')"
        )
    for kind, spec in (("input", config.inputs[0]), ("output", config.outputs[0])):
        if spec.dtype != "FP32":
            raise InvalidArgument(
                f"{where}: the cuda backend computes in FP32 but {kind} {spec.name} is {spec.dtype};"
                " use FP32 or serve this model with backend numpy"
            )
    dim = config.inputs[0].shape[-1]
    tensors = _Tensors(weights, np.dtype(np.float32), where, config.layers)
    ops: list[Op] = []
    for step in _compile(config.layers, tensors, dim, reads):
        func, kw = (step.func, step.keywords) if isinstance(step, partial) else (step, {})
        if func is dense:
            w = kw["weight"]
            ops.append(Op("dense", dim, w.shape[1], weight=w, bias=kw.get("bias")))
            dim = w.shape[1]
        elif func is layernorm:
            ops.append(Op("layernorm", dim, dim, weight=kw.get("weight"), bias=kw.get("bias"), eps=kw["eps"]))
        elif func is _sleep:
            ops.append(Op("sleep", dim, dim, seconds=kw["seconds"]))
        elif func in (relu, gelu, softmax):
            ops.append(Op(func.__name__, dim, dim))
        else:  # a new numpy op without a kernel: refuse the model rather than compute something else
            raise InvalidArgument(
                f"{where}: the cuda backend has no kernel for {getattr(func, '__name__', func)}"
            )
    return tuple(ops)


# --- the backend -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Launch:
    """An ``Op`` on the device: raw pointers (0 = absent) into this instance's allocations."""

    kind: str
    dim_in: int
    dim_out: int
    weight: int = 0
    bias: int = 0
    eps: float = 0.0


class CudaBackend(Backend):
    """A layer graph (one FP32 input, one FP32 output) run with the CUDA kernels on one stream."""

    name = "cuda"
    takes_device = True
    concurrent = False  # one stream and one set of buffers per instance: runs are serialised

    @classmethod
    def available(cls) -> tuple[bool, str]:
        return cuda_device.probe()

    def __init__(self, config: ModelConfig, weights: bytes | None, *, device: int | None = None) -> None:
        super().__init__(config, weights)
        ops = plan_layers(config, weights, self._where)  # every check before the GPU is touched
        src, dst = config.inputs[0], config.outputs[0]
        self._input, self._output = src.name, dst.name
        self._in_dim, self._out_dim = src.shape[-1], dst.shape[-1]
        self._max_dim = max(self._in_dim, *(op.dim_out for op in ops))
        self._sleep_s = sum(op.seconds for op in ops)  # sleeps change no data: one wait after the run
        self._ops = ops
        self._lock = threading.Lock()
        self._weight_allocs: list[Any] = []
        self._act: tuple[Any, ...] = ()
        self._h_in: np.ndarray | None = None
        self._h_out: np.ndarray | None = None
        self._host_release: Callable[[], None] | None = None
        self._registered: list[tuple[int, int, np.ndarray]] = []
        self._launches: tuple[_Launch, ...] = ()
        self._fn: dict[str, Any] = {}
        self._module: Any = None
        self.stream: Any = None  # the pycuda Stream: benchmarks record events on it
        self._rows = 0
        self._weight_bytes = self._activation_bytes = 0
        self.measured_device_bytes = 0
        try:
            self._dev = cuda_device.get_device(device)
            with self._dev.active() as cuda:
                free_before, _ = cuda.mem_get_info()
                try:
                    self._load(cuda)
                except BaseException:
                    self._free_all()  # a failed load leaves nothing on the GPU
                    raise
                free_after, _ = cuda.mem_get_info()
        except MCPError:
            raise
        except Exception as err:
            raise self._load_error(err) from None
        self.measured_device_bytes = max(0, int(free_before) - int(free_after))
        self.memory_bytes = self._weight_bytes + self._activation_bytes
        self.device = f"gpu:{self._dev.index}"
        log.info(
            "%s: loaded on device %d: %d weight and %d activation bytes (%d rows); free memory fell by %d",
            *(self._where, self._dev.index, self._weight_bytes, self._activation_bytes, self._rows),
            self.measured_device_bytes,
        )

    # --- load and release (always with the context pushed) --------------------------------------------------

    def _load(self, cuda: ModuleType) -> None:
        self._module = cuda.module_from_file(str(cuda_device.kernels_path()))
        self._fn = {name: self._module.get_function(name).prepare(fmt) for name, fmt in KERNELS.items()}
        self.stream = cuda.Stream(_STREAM_NON_BLOCKING)
        uploaded: dict[int, int] = {}  # id(array) -> device pointer: a tensor named twice is stored once

        def upload(array: np.ndarray | None) -> int:
            if array is None:
                return 0
            if id(array) not in uploaded:
                alloc = cuda.mem_alloc(array.nbytes)
                self._weight_allocs.append(alloc)
                self._weight_bytes += array.nbytes
                cuda.memcpy_htod(alloc, array)
                uploaded[id(array)] = int(alloc)
            return uploaded[id(array)]

        self._launches = tuple(
            _Launch(op.kind, op.dim_in, op.dim_out, upload(op.weight), upload(op.bias), op.eps)
            for op in self._ops
            if op.kind != "sleep"
        )
        self._allocate_activations(cuda, self._initial_rows())
        cuda.Context.synchronize()  # the upload may still be in flight; our stream does not wait for it

    def _initial_rows(self) -> int:
        mbs = self.config.max_batch_size
        rows = 1
        for i, d in enumerate(self.config.inputs[0].shape[:-1]):
            rows *= d if d != -1 else (mbs if i == 0 and mbs > 0 else 1)
        return max(rows, 1)

    def _allocate_activations(self, cuda: ModuleType, rows: int) -> None:
        """Two device buffers of ``rows`` x the widest dim (dense layers ping-pong), and page-locked I/O."""
        self._free_activations()
        nbytes = rows * self._max_dim * 4
        self._act = (cuda.mem_alloc(nbytes), cuda.mem_alloc(nbytes))
        self._h_in, self._h_out, self._host_release = _pinned_io(
            cuda, rows * self._in_dim, rows * self._out_dim
        )
        self._rows, self._activation_bytes = rows, 2 * nbytes

    def _free_activations(self) -> None:
        for alloc in self._act:
            alloc.free()
        if self._host_release is not None:
            self._host_release()
        self._act, self._h_in, self._h_out, self._host_release = (), None, None, None
        self._rows = self._activation_bytes = 0

    def _free_all(self) -> None:
        """Free everything this instance holds on the device and in page-locked memory (context pushed)."""
        for _, _, registered in self._registered:
            registered.base.unregister()
        self._registered = []
        self._free_activations()
        for alloc in self._weight_allocs:
            alloc.free()
        self._weight_allocs, self._launches, self._weight_bytes = [], (), 0
        self._fn = {}  # the functions keep the module alive: drop them first
        self._module = None  # unloads the module (its code and constants)
        self.stream = None  # destroys the stream

    def _release(self) -> None:
        with self._lock:
            if self.stream is None:
                return
            with self._dev.active():
                try:
                    self.stream.synchronize()
                finally:
                    self._free_all()

    def _load_error(self, err: Exception) -> MCPError:
        if type(err).__name__ == "MemoryError" and type(err).__module__.startswith("pycuda"):
            return ResourceExhausted(f"{self._where}: the GPU has too little free memory: {short_error(err)}")
        log.error("%s: load failed", self._where, exc_info=err)
        return Internal(f"{self._where}: load failed on the GPU: {short_error(err)}")

    # --- running --------------------------------------------------------------------------------------------

    def pin_host_memory(self, array: np.ndarray) -> np.ndarray:
        """Page-lock ``array`` (page-aligned address and size, e.g. a native pool buffer) and return the view
        to fill: inputs that lie inside it are copied to the GPU straight from it, without the staging copy.
        Register a buffer with one backend only; the registration ends at ``close``."""
        with self._lock:
            if self.stream is None:
                raise FailedPrecondition(f"{self._where} is closed")
            with self._dev.active() as cuda:
                registered = cuda.register_host_memory(array)
            start = registered.__array_interface__["data"][0]
            self._registered.append((start, start + registered.nbytes, registered))
        return registered

    def _run(
        self, inputs: Mapping[str, np.ndarray], *, skip: frozenset[str], parameters: Mapping[str, str]
    ) -> dict[str, np.ndarray]:
        x = inputs[self._input]
        out_shape = (*x.shape[:-1], self._out_dim)
        rows = x.size // self._in_dim
        if rows == 0:
            return {self._output: np.zeros(out_shape, np.float32)}
        if rows > _MAX_ROWS:
            raise InvalidArgument(f"{self._where}: {rows} rows is more than one run can take ({_MAX_ROWS})")
        with self._lock:
            if self.stream is None:
                raise FailedPrecondition(f"{self._where} is closed")
            with self._dev.active() as cuda:
                if rows > self._rows:
                    self._grow(cuda, rows)
                y = self._execute(cuda, np.ascontiguousarray(x).reshape(-1), rows)
        if self._sleep_s:
            time.sleep(self._sleep_s)
        return {self._output: y.reshape(out_shape)}

    def _grow(self, cuda: ModuleType, rows: int) -> None:
        log.warning(
            "%s: %d rows exceed the %d allocated; reallocating activations", self._where, rows, self._rows
        )
        self._allocate_activations(cuda, rows)
        self.memory_bytes = self._weight_bytes + self._activation_bytes

    def _execute(self, cuda: ModuleType, flat: np.ndarray, rows: int) -> np.ndarray:
        assert self._h_in is not None and self._h_out is not None
        host_in = flat if self._is_pinned(flat) else self._stage(flat)
        cur, other = int(self._act[0]), int(self._act[1])
        cuda.memcpy_htod_async(cur, host_in, self.stream)
        for op in self._launches:
            if op.kind == "dense":
                self._dense(op, cur, other, rows)
                cur, other = other, cur
            else:
                self._in_place(op, cur, rows)
        host_out = self._h_out[: rows * self._out_dim]
        cuda.memcpy_dtoh_async(host_out, cur, self.stream)
        self.stream.synchronize()
        return host_out.copy()  # the page-locked buffer is reused by the next run

    def _stage(self, flat: np.ndarray) -> np.ndarray:
        assert self._h_in is not None
        staged = self._h_in[: flat.size]
        staged[...] = flat
        return staged

    def _is_pinned(self, flat: np.ndarray) -> bool:
        if not self._registered:
            return False
        start = flat.__array_interface__["data"][0]
        return any(lo <= start and start + flat.nbytes <= hi for lo, hi, _ in self._registered)

    def _dense(self, op: _Launch, x: int, y: int, rows: int) -> None:
        chunk = _MAX_GRID_BLOCKS * TILE  # rows per launch: grid y is bounded
        for start in range(0, rows, chunk):
            m = min(chunk, rows - start)
            grid = ((op.dim_out + TILE - 1) // TILE, (m + TILE - 1) // TILE)
            self._fn["mcp_dense_f32"].prepared_async_call(
                grid,
                (TILE, TILE, 1),
                self.stream,
                x + start * op.dim_in * 4,
                op.weight,
                op.bias,
                y + start * op.dim_out * 4,
                m,
                op.dim_in,
                op.dim_out,
            )

    def _in_place(self, op: _Launch, x: int, rows: int) -> None:
        if op.kind in ("relu", "gelu"):
            n = rows * op.dim_in
            blocks = min((n + _ELEMENTWISE_THREADS - 1) // _ELEMENTWISE_THREADS, 16 * _MAX_GRID_BLOCKS)
            self._fn[f"mcp_{op.kind}_f32"].prepared_async_call(
                (blocks, 1), (_ELEMENTWISE_THREADS, 1, 1), self.stream, x, x, n
            )
            return
        grid = (min(rows, _MAX_GRID_BLOCKS), 1)
        if op.kind == "softmax":
            self._fn["mcp_softmax_rows_f32"].prepared_async_call(
                grid, (ROW_THREADS, 1, 1), self.stream, x, x, rows, op.dim_in
            )
        else:
            self._fn["mcp_layernorm_rows_f32"].prepared_async_call(
                grid, (ROW_THREADS, 1, 1), self.stream, x, x, op.weight, op.bias, rows, op.dim_in, op.eps
            )


def _pinned_io(cuda: ModuleType, n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, Callable[[], None]]:
    """Page-locked FP32 staging buffers for a model's input and output.

    From a native pool block (page-aligned arena, registered with ``register_host_memory``) when
    ``mcp_native`` is built, so the H2D copies read pinned pool memory; else pycuda's ``pagelocked_empty``.
    Returns the two arrays and the function that unpins and frees them.
    """
    in_bytes = -(-n_in * 4 // _PAGE) * _PAGE  # the output view starts on a page boundary
    try:
        from mcp_native import pool as native  # noqa: PLC0415  (optional: built by make native)

        ok, _ = native.available()
    except ImportError:
        ok = False
    if ok:
        arena_pool = native.Pool(in_bytes + n_out * 4, 1, alignment=_PAGE)
        pinned = cuda.register_host_memory(arena_pool.arena())
        h_in = pinned[: n_in * 4].view(np.float32)
        h_out = pinned[in_bytes : in_bytes + n_out * 4].view(np.float32)

        def release() -> None:
            pinned.base.unregister()  # the RegisteredHostMemory behind the array
            arena_pool.close()

        return h_in, h_out, release
    h_in = cuda.pagelocked_empty(n_in, np.float32)
    h_out = cuda.pagelocked_empty(n_out, np.float32)

    def free() -> None:
        h_in.base.free()  # the PagelockedHostAllocation behind each array
        h_out.base.free()

    return h_in, h_out, free
