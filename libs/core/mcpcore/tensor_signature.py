"""Request tensors checked against a model version's signature: the one check, made by the router before
any hop (from the version's metadata) and by the worker before a request is queued (from model.yaml), so a
malformed request fails the same way, with the same message, wherever it is caught first.

Invariants: pure (no I/O); a wrong name, dtype, rank or fixed dimension, or batch sizes that disagree or
fall outside 1..max_batch_size, is an ``InvalidArgument`` naming the tensor, what was expected and what
came; inputs that pass are never modified.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from mcpcore import dtypes
from mcpcore.errors import InvalidArgument

__all__ = ["TENSOR_NAME_RE", "Tensor", "check_inputs", "check_outputs", "tensor_name_problem"]

#: Tensor names as the protocol allows them in practice: printable ASCII without spaces, bounded, so
#: TensorFlow's "input:0", ONNX's "onnx::Gemm_0" or "x/y" pass, and nothing can break a log line.
TENSOR_NAME_RE = re.compile(r"[!-~]{1,256}")


def tensor_name_problem(name: object) -> str:
    """Why ``name`` is not a valid tensor name ("" when it is)."""
    if isinstance(name, str) and TENSOR_NAME_RE.fullmatch(name):
        return ""
    return f"not a valid tensor name: {name!r} (printable ASCII without spaces, 1 to 256 characters)"


class Tensor(Protocol):
    """A declared tensor: ``modelspec.TensorSpec`` and the router's ``TensorMeta`` both are."""

    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...  # "FP32", ...
    @property
    def shape(self) -> tuple[int, ...]: ...  # -1 = variable


def _dtype_name(dtype: np.dtype) -> str:
    try:
        return dtypes.from_numpy(dtype)
    except InvalidArgument:
        return f"numpy {dtype}"


def check_inputs(
    where: str, specs: Sequence[Tensor], inputs: Mapping[str, np.ndarray], max_batch_size: int | None
) -> None:
    """``inputs`` must be exactly ``specs``, each well typed and shaped. ``max_batch_size`` > 0: the first
    dimension is the batch, the same for every input and within 1..max_batch_size; 0: no batch dimension;
    None: not known here (the batch bound is left to the worker)."""
    if len(inputs) != len(specs) or inputs.keys() != {s.name for s in specs}:
        expected = [s.name for s in specs]
        missing = [n for n in expected if n not in inputs]
        extra = sorted(n for n in inputs if n not in expected)
        parts = [f"missing {missing}" if missing else "", f"unexpected {extra}" if extra else ""]
        raise InvalidArgument(f"{where}: expects inputs {expected}: {', '.join(p for p in parts if p)}")
    batch: tuple[str, int] | None = None
    for spec in specs:
        array = inputs[spec.name]
        if not isinstance(array, np.ndarray):
            raise InvalidArgument(
                f"{where}: input {spec.name}: expected a numpy array, got {type(array).__name__}"
            )
        if array.dtype != dtypes.numpy_dtype(spec.dtype):
            raise InvalidArgument(
                f"{where}: input {spec.name}: expected dtype {spec.dtype}, got {_dtype_name(array.dtype)}"
            )
        shape, want = array.shape, spec.shape
        if len(shape) != len(want) or not all(w in (-1, g) for w, g in zip(want, shape, strict=True)):
            raise InvalidArgument(
                f"{where}: input {spec.name}: expected shape {list(want)}, got {list(shape)}"
            )
        if not max_batch_size:
            continue
        rows = int(shape[0])
        if not 1 <= rows <= max_batch_size:
            raise InvalidArgument(
                f"{where}: input {spec.name}: batch size {rows} is outside 1..{max_batch_size}"
            )
        if batch is not None and rows != batch[1]:
            raise InvalidArgument(
                f"{where}: input {spec.name} has batch size {rows} but {batch[0]} has {batch[1]}"
            )
        batch = batch or (spec.name, rows)


def check_outputs(where: str, specs: Sequence[Tensor], wanted: Sequence[str]) -> None:
    """Every output a client asks for by name is declared."""
    declared = [s.name for s in specs]
    unknown = [n for n in wanted if n not in declared]
    if unknown:
        raise InvalidArgument(f"{where} has no output(s) {unknown}; it has {sorted(declared)}")
