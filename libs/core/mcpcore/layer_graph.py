"""The rules of a layer graph (backends numpy and cuda), checked while ``mcpcore.model_yaml`` reads a file.

Invariants:
- Pure (no I/O). Every violation goes to ``fail(key path, message)``, which raises (the reader's
  ``InvalidArgument`` naming the file and the key path), so a graph that returns passed them all.
- One input and one or more outputs, each in a floating dtype (``LAYER_GRAPH_DTYPES``) with a fixed last
  dim; every output has the input's dims but for the last. Each layer reads an existing result with the
  dim it needs (dense layers chain the last dim), every output is made exactly once with its last dim, and
  every layer feeds some output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import NoReturn

from mcpcore.modelspec import Layer, TensorSpec

__all__ = ["LAYER_GRAPH_DTYPES", "Fail", "check_graph"]

#: Where a violation goes: (key path, what is wrong); it raises.
Fail = Callable[[str, str], NoReturn]
LAYER_GRAPH_DTYPES = ("FP16", "BF16", "FP32", "FP64")


def check_graph(
    fail: Fail, layers: tuple[Layer, ...], src: TensorSpec, outputs: tuple[TensorSpec, ...]
) -> tuple[Layer, ...]:
    """Each layer's input exists and has the dim it needs; every output is made exactly once, with its
    last dim; every layer feeds an output. Returns the layers with the implicit single output marked."""
    _check_graph_io(fail, src, outputs)
    if not any(layer.output for layer in layers):
        if len(outputs) != 1:
            fail("layers", f"{len(outputs)} outputs: mark the layer that makes each with 'output'")
        layers = (*layers[:-1], replace(layers[-1], output=outputs[0].name))
    reads = _walk_graph(fail, layers, src, {o.name: o for o in outputs})
    live = {i for i, layer in enumerate(layers) if layer.output}
    for i in range(len(layers) - 1, -1, -1):  # a layer lives when a living layer reads it
        if i in live and reads[i] >= 0:
            live.add(reads[i])
    dead = [i for i in range(len(layers)) if i not in live]
    if dead:
        fail(f"layers[{dead[0]}]", f"({layers[dead[0]].op}) feeds no output")
    return layers


def _check_graph_io(fail: Fail, src: TensorSpec, outputs: tuple[TensorSpec, ...]) -> None:
    for path, t in (("inputs[0]", src), *((f"outputs[{i}]", o) for i, o in enumerate(outputs))):
        if t.dtype not in LAYER_GRAPH_DTYPES:
            fail(f"{path}.dtype", f"a layer graph computes in {'/'.join(LAYER_GRAPH_DTYPES)}, got {t.dtype}")
        if len(t.shape) < 1 or t.shape[-1] < 1:
            fail(f"{path}.shape", f"a layer graph needs a fixed last dim, got {list(t.shape)}")
        if t is not src and t.shape[:-1] != src.shape[:-1]:
            fail(f"{path}.shape", f"must match the input's {list(src.shape[:-1])} but for the last dim")


def _walk_graph(
    fail: Fail, layers: tuple[Layer, ...], src: TensorSpec, wanted: Mapping[str, TensorSpec]
) -> list[int]:
    """Follow the dims through the layers; returns the index each layer reads (-1: the input)."""
    names: dict[str, tuple[int, int]] = {src.name: (-1, src.shape[-1])}  # name -> (layer, its dim)
    made: set[str] = set()
    reads: list[int] = []
    prev, dim = -1, src.shape[-1]
    for i, layer in enumerate(layers):
        at = f"layers[{i}]"
        if layer.source is not None:
            if layer.source not in names:
                fail(f"{at}.from", f"{layer.source!r} is not the input or an earlier layer's name")
            prev, dim = names[layer.source]
        reads.append(prev)
        if layer.op == "dense":
            if layer.in_dim != dim:
                fail(f"{at}.in", f"{layer.in_dim} does not match the incoming dim {dim}")
            dim = layer.out_dim  # type: ignore[assignment]  # required for dense
        elif layer.op == "count":
            dim = 1
        if layer.name is not None:
            if layer.name in names:
                fail(f"{at}.name", f"{layer.name!r} names another result already")
            names[layer.name] = (i, dim)
        if layer.output is not None:
            out = wanted.get(layer.output)
            if out is None:
                fail(f"{at}.output", f"{layer.output!r} is not one of the outputs {sorted(wanted)}")
            if layer.output in made:
                fail(f"{at}.output", f"output {layer.output!r} is made twice")
            if dim != out.shape[-1]:
                fail(f"{at}.output", f"the graph reaches dim {dim}; {out.name} has last dim {out.shape[-1]}")
            made.add(layer.output)
        prev = i
    missing = sorted(set(wanted) - made)
    if missing:
        fail("layers", f"no layer makes output(s) {missing}")
    return reads
