"""The model every peer in ``../shared/peers`` serves, as mesh model directories for ``make bench``.

``bench-mlp/1``: the peers' float32 MLP 64 -> 256 (ReLU) -> 16, weights drawn as the harness draws them
(``np.random.default_rng(1234)``: w1, b1, w2, b2 in that order), dynamic batching 32 / 3 ms as the
harness's ``mesh`` peer; input ``INPUT`` [-1, 64], output ``OUTPUT`` [-1, 16]. ``bench-bulk/1``: ReLU on
one 16 MiB FP32 row, no batching, for the bulk-tensor figure. ``same_as_peers()`` compares the weights
with the harness's own ``common/mlp.py`` when that folder is here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import safetensors.numpy

IN_DIM, HIDDEN, OUT_DIM, SEED = 64, 256, 16, 1234
BULK_FLOATS = 4 << 20  # 16 MiB of FP32
PEERS_MLP = Path(__file__).resolve().parents[2] / "shared" / "peers" / "common" / "mlp.py"


def weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)
    w1 = (rng.standard_normal((IN_DIM, HIDDEN)) / np.sqrt(IN_DIM)).astype(np.float32)
    b1 = (0.01 * rng.standard_normal(HIDDEN)).astype(np.float32)
    w2 = (rng.standard_normal((HIDDEN, OUT_DIM)) / np.sqrt(HIDDEN)).astype(np.float32)
    b2 = (0.01 * rng.standard_normal(OUT_DIM)).astype(np.float32)
    return {"fc1.weight": w1, "fc1.bias": b1, "fc2.weight": w2, "fc2.bias": b2}


def same_as_peers() -> bool | None:
    """True/False: the weights equal the harness's; None: no harness beside this checkout."""
    if not PEERS_MLP.is_file():
        return None
    spec = importlib.util.spec_from_file_location("peers_mlp", PEERS_MLP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    theirs = module.MLP()
    ours = weights()
    return all(
        np.array_equal(ours[name], getattr(theirs, attr))
        for name, attr in (("fc1.weight", "w1"), ("fc1.bias", "b1"), ("fc2.weight", "w2"), ("fc2.bias", "b2"))
    )


def write(repo: Path) -> None:
    mlp = repo / "bench-mlp" / "1"
    mlp.mkdir(parents=True, exist_ok=True)
    safetensors.numpy.save_file(weights(), str(mlp / "weights.safetensors"))
    (mlp / "model.yaml").write_text(
        f"""backend: numpy
max_batch_size: 32
dynamic_batching:
  max_queue_delay_us: 3000
  max_queue_size: 4096
inputs:
- {{name: INPUT, dtype: FP32, shape: [-1, {IN_DIM}]}}
outputs:
- {{name: OUTPUT, dtype: FP32, shape: [-1, {OUT_DIM}]}}
memory_bytes: 1048576
weights: weights.safetensors
layers:
- {{op: dense, in: {IN_DIM}, out: {HIDDEN}, weight: fc1.weight, bias: fc1.bias}}
- {{op: relu}}
- {{op: dense, in: {HIDDEN}, out: {OUT_DIM}, weight: fc2.weight, bias: fc2.bias}}
"""
    )
    bulk = repo / "bench-bulk" / "1"
    bulk.mkdir(parents=True, exist_ok=True)
    (bulk / "model.yaml").write_text(
        f"""backend: numpy
max_batch_size: 1
inputs:
- {{name: INPUT, dtype: FP32, shape: [-1, {BULK_FLOATS}]}}
outputs:
- {{name: OUTPUT, dtype: FP32, shape: [-1, {BULK_FLOATS}]}}
memory_bytes: {8 * BULK_FLOATS * 4}
layers:
- {{op: relu}}
"""
    )
