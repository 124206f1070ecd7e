"""The builtin backend: a few fixed functions of the worker's own code, for the demo models that need no
weights (DESIGN §13). A model chooses one with ``function:``; a repository never supplies code.

- ``strlen``: one BYTES input; an INT32 or INT64 output of the same shape, each element's length in
  bytes, and optionally a BYTES output, the strings back unchanged (so a client sees its bytes make the
  round trip) (``demo-strlen``).
- ``chunks``: a decoupled model (``decoupled: true``). Input ``N`` (INT32, one element, 0..1024): answers
  ``N`` times, answer ``i`` holding ``INDEX`` = ``[i]`` (INT32) and ``TEXT`` = ``[b"chunk i"]`` (BYTES). The
  request parameter ``delay_ms`` (0..10000, default 0) waits that long before each answer, so a client
  sees them arrive one by one (``demo-stream``).

Invariants: every signature is checked at load (``InvalidArgument`` naming the tensor); a bad parameter
or input value is ``InvalidArgument`` before anything is answered; the functions hold no state, so
concurrent runs are safe.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

import numpy as np

from mcp_worker.backends.base import Backend
from mcpcore.errors import InvalidArgument
from mcpcore.modelspec import ModelConfig

__all__ = ["MAX_CHUNKS", "MAX_DELAY_MS", "BuiltinBackend"]

MAX_CHUNKS = 1024
MAX_DELAY_MS = 10_000


class BuiltinBackend(Backend):
    name = "builtin"

    def __init__(self, config: ModelConfig, weights: bytes | None) -> None:
        super().__init__(config, weights)
        self._function = config.function
        if self._function == "strlen":
            self._check_strlen()
        elif self._function == "chunks":
            self._check_chunks()
        else:
            raise InvalidArgument(f"{self._where}: no builtin function {self._function!r}")

    # -- signatures ------------------------------------------------------------------------------------
    def _check_strlen(self) -> None:
        ins, outs = self.config.inputs, self.config.outputs
        lengths = [o for o in outs if o.dtype in ("INT32", "INT64")]
        echoes = [o for o in outs if o.dtype == "BYTES"]
        if len(ins) != 1 or ins[0].dtype != "BYTES" or len(lengths) != 1 or len(outs) != 1 + len(echoes) > 2:
            raise InvalidArgument(
                f"{self._where}: strlen takes one BYTES input and makes one INT32 or INT64 output (and "
                "optionally one BYTES output)"
            )
        for out in outs:
            if out.shape != ins[0].shape:
                raise InvalidArgument(
                    f"{self._where}: strlen's output {out.name} has shape {list(out.shape)}; it must be "
                    f"its input's {list(ins[0].shape)}"
                )
        if self.config.decoupled:
            raise InvalidArgument(f"{self._where}: strlen answers once: drop decoupled")

    def _check_chunks(self) -> None:
        ins, outs = self.config.inputs, self.config.outputs
        fine = (
            len(ins) == 1
            and ins[0].name == "N"
            and ins[0].dtype == "INT32"
            and sorted((o.name, o.dtype) for o in outs) == [("INDEX", "INT32"), ("TEXT", "BYTES")]
            and self.config.max_batch_size == 0
        )
        if not fine:
            raise InvalidArgument(
                f"{self._where}: chunks takes input N (INT32, one element) and makes outputs INDEX (INT32) "
                "and TEXT (BYTES), without batching (max_batch_size 0)"
            )
        if not self.config.decoupled:
            raise InvalidArgument(f"{self._where}: chunks answers several times: set decoupled: true")

    # -- running ---------------------------------------------------------------------------------------
    def _run(
        self, inputs: Mapping[str, np.ndarray], *, skip: frozenset[str], parameters: Mapping[str, str]
    ) -> dict[str, np.ndarray] | Iterator[dict[str, np.ndarray]]:
        if self._function == "strlen":
            text = inputs[self.config.inputs[0].name]
            lengths = np.fromiter((len(v) for v in text.reshape(-1)), dtype=np.int64, count=text.size)
            return {
                o.name: text
                if o.dtype == "BYTES"
                else lengths.reshape(text.shape).astype(self._out_dtype(o.dtype))
                for o in self.config.outputs
            }
        n = inputs["N"]
        if n.size != 1 or not 0 <= int(n.reshape(-1)[0]) <= MAX_CHUNKS:
            raise InvalidArgument(
                f"{self._where}: input N must be one number in 0..{MAX_CHUNKS}, got {n.tolist()}"
            )
        delay_ms = _int_parameter(parameters, "delay_ms", 0, MAX_DELAY_MS, self._where)
        return _chunks(int(n.reshape(-1)[0]), delay_ms / 1000.0)

    @staticmethod
    def _out_dtype(name: str) -> type[np.integer]:
        return np.int32 if name == "INT32" else np.int64

    def _release(self) -> None:
        pass


def _chunks(n: int, delay_s: float) -> Iterator[dict[str, np.ndarray]]:
    for i in range(n):
        if delay_s:
            time.sleep(delay_s)  # on the executor thread: the pacing a client asked for
        text = np.empty(1, dtype=object)
        text[0] = f"chunk {i}".encode()
        yield {"INDEX": np.array([i], dtype=np.int32), "TEXT": text}


def _int_parameter(parameters: Mapping[str, str], key: str, default: int, high: int, where: str) -> int:
    raw = parameters.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= high:
        raise InvalidArgument(
            f"{where}: request parameter {key} must be an integer in 0..{high}, got {raw!r}"
        )
    return value
