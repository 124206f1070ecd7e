"""``mcpctl`` request-path commands, over the router's ``mcpapi.v2.Inference``: route (where a request would
go) and infer (send one).

Invariants:
- Every input is checked here before anything is sent: a bad shape, file, JSON document or element type is
  a usage error (exit 2) naming the option and what is wrong, never a traceback.
- ``infer`` takes its inputs as ``--input NAME=FILE.npy`` (the array's own dtype and shape) or
  ``--input NAME=JSON`` (a nested list, of ``--dtype``); without ``--input``, one random FP32 ``INPUT0`` of
  ``--shape`` (default 1,64). Elements are fixed-size types: BYTES tensors have no form in
  ``mcpapi.v2.Tensor`` (its data is prod(shape) * itemsize bytes), so they are refused here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click
import numpy as np
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from mcpapi.v2 import inference_pb2
from mcpclient.ctlkit import Ctl, connects, output_option, pass_ctl
from mcpclient.views import add_row, plain_table
from mcpcore import dtypes, wire
from mcpcore.errors import InvalidArgument

__all__ = ["COMMANDS"]

MAX_ELEMENTS = 1 << 28  # a random input of 1 GiB FP32 at most: a typo in --shape must not eat the memory
SHOWN_VALUES = 8  # per output, in the table (-o json has them all)
_INPUT = "'--input'"
#: mcpapi.v2's Tensor holds fixed-size elements only (prod(shape) * itemsize bytes)
_NO_BYTES = "BYTES (string) tensors do not travel over mcpapi.v2 Infer; send them through the KServe API"
_DTYPES = sorted(dtypes.NAMES - {dtypes.BYTES})


class ShapeType(click.ParamType):
    name = "SHAPE"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        try:
            dims = tuple(int(d) for d in str(value).split(","))
        except ValueError:
            dims = ()
        if not dims or any(d <= 0 for d in dims):
            self.fail(f"{value!r} is not a shape: comma-separated positive integers, e.g. 1,64", param, ctx)
        if math.prod(dims) > MAX_ELEMENTS:
            self.fail(f"{value!r} has {math.prod(dims)} elements; at most {MAX_ELEMENTS}", param, ctx)
        return dims


class InputType(click.ParamType):
    name = "NAME=FILE.npy|NAME=JSON"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, str]:
        if isinstance(value, tuple):
            return value
        name, sep, source = str(value).partition("=")
        if not sep or not name.strip() or not source.strip():
            self.fail(f"{value!r}: expected NAME=FILE.npy or NAME=JSON, e.g. INPUT0=x.npy", param, ctx)
        return name.strip(), source


def _array(name: str, source: str, dtype: str) -> np.ndarray:
    """The array an ``--input NAME=SOURCE`` names: JSON when SOURCE parses as JSON, else a .npy file."""
    what = f"{name}={source}"
    try:
        doc = json.loads(source)
    except ValueError as exc:
        if source.lstrip().startswith("["):
            raise click.BadParameter(f"{what}: not valid JSON ({exc})", param_hint=_INPUT) from None
        return _npy(what, Path(source))
    try:
        return np.array(doc, dtype=dtypes.numpy_dtype(dtype))
    except (ValueError, TypeError, OverflowError) as exc:
        raise click.BadParameter(f"{what}: not a {dtype} tensor ({exc})", param_hint=_INPUT) from None


def _npy(what: str, path: Path) -> np.ndarray:
    try:
        arr = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise click.BadParameter(
            f"{what}: no such file (a value that is not JSON is a .npy path)", param_hint=_INPUT
        ) from None
    except (OSError, ValueError) as exc:
        raise click.BadParameter(f"{what}: not a readable .npy file ({exc})", param_hint=_INPUT) from None
    if not isinstance(arr, np.ndarray):  # an .npz archive
        raise click.BadParameter(f"{what}: an .npz archive; give one array as a .npy file", param_hint=_INPUT)
    return arr


def _tensor(name: str, arr: np.ndarray, hint: str) -> inference_pb2.Tensor:
    try:
        kind = dtypes.from_numpy(arr.dtype)
    except InvalidArgument as err:
        raise click.BadParameter(f"{name}: {err.message}", param_hint=hint) from None
    if kind == dtypes.BYTES:
        raise click.BadParameter(f"{name}: {_NO_BYTES}", param_hint=hint)
    data = bytes(dtypes.to_bytes(arr))
    return inference_pb2.Tensor(name=name, dtype=dtypes.wire_value(kind), shape=arr.shape, data=data)


def _inputs(inputs: tuple[tuple[str, str], ...], shape: tuple[int, ...] | None, dtype: str) -> list[Any]:
    if inputs and shape is not None:
        raise click.UsageError("give --input NAME=... or --shape (a random FP32 INPUT0), not both")
    if not inputs:
        x = np.random.default_rng(0).random(shape or (1, 64), dtype=np.float32)
        return [_tensor("INPUT0", x, "'--shape'")]
    names = [name for name, _ in inputs]
    if len(set(names)) != len(names):
        raise click.UsageError(f"--input names repeat: {', '.join(names)}")
    return [_tensor(name, _array(name, source, dtype), _INPUT) for name, source in inputs]


def _output_doc(t: inference_pb2.Tensor) -> dict[str, Any]:
    kind = dtypes.name_of(t.dtype)
    arr = dtypes.from_bytes(kind, t.data, tuple(t.shape), f"output {t.name}")
    if kind == dtypes.BYTES:
        data: Any = np.vectorize(lambda b: b.decode("utf-8", "backslashreplace"), otypes=[object])(
            arr
        ).tolist()
    else:
        data = (arr.astype(np.float32) if kind == "BF16" else arr).tolist()
    return {"name": t.name, "dtype": kind, "shape": list(t.shape), "data": data}


def _outputs_view(doc: dict[str, Any]) -> list[RenderableType]:
    rid = f" (request {doc['request_id']})" if doc["request_id"] else ""  # the client's id, when it gave one
    head = Text(f"{doc['model']}/{doc['version']} on {doc['worker']}{rid}")
    table = plain_table("OUTPUT", "DTYPE", "SHAPE", "VALUES")
    for out in doc["outputs"]:
        flat = np.array(out["data"], dtype=object).reshape(-1).tolist()
        shown = ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in flat[:SHOWN_VALUES])
        more = f", ... ({len(flat) - SHOWN_VALUES} more)" if len(flat) > SHOWN_VALUES else ""
        add_row(table, out["name"], out["dtype"], str(out["shape"]), f"[{shown}{more}]")
    return [head, table]


@click.command(name="infer")
@click.argument("model")
@click.option(
    "--input",
    "inputs",
    type=InputType(),
    multiple=True,
    help="an input: NAME=FILE.npy, or NAME=JSON (a nested list of --dtype); repeatable",
)
@click.option(
    "--dtype",
    type=click.Choice(_DTYPES),
    default="FP32",
    show_default=True,
    help="element type of the JSON inputs",
)
@click.option("--shape", type=ShapeType(), default=None, help="without --input: a random FP32 INPUT0 [1,64]")
@click.option("--version", default="", metavar="V", help="a version (default: the traffic split's choice)")
@click.option("--key", default="", help="sticky routing key (user or session id)")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=30.0, show_default=True)
@connects("router")
@output_option
@pass_ctl
def infer_cmd(
    ctl: Ctl, model: str, *, inputs: Any, dtype: str, shape: Any, version: str, key: str, timeout: float
) -> None:
    """Send one inference request through the router and print its outputs."""
    request = inference_pb2.InferRequest(
        model=model, version=version, routing_key=key, inputs=_inputs(inputs, shape, dtype)
    )
    reply = ctl.call("router", "Infer", request, timeout=timeout)
    doc = {
        "model": reply.model,
        "version": reply.version,
        "worker": reply.worker_id,
        "request_id": reply.request_id,
        "parameters": dict(reply.parameters),
        "outputs": [_output_doc(t) for t in reply.outputs],
    }
    ctl.emit(doc, lambda: _outputs_view(doc))


@click.command(name="route")
@click.argument("model")
@click.option("--key", default="", help="sticky routing key (user or session id)")
@click.option("--version", default="", metavar="V", help="a version (default: the traffic split's choice)")
@connects("router")
@output_option
@pass_ctl
def route_cmd(ctl: Ctl, model: str, key: str, version: str) -> None:
    """Where a request for MODEL (and --key) would go: worker, endpoint (and the same-host one), version,
    breaker level."""
    r = ctl.call(
        "router", "Route", inference_pb2.RouteRequest(model=model, version=version, routing_key=key), 10
    )
    doc = {
        "model": model,
        "worker": r.worker_id,
        "endpoint": r.data_endpoint,
        "version": r.version,
        "breaker_level": r.breaker_level,
        "header_flags": r.header_flags,
        "curve_public_key": r.curve_public_key,
        "features_off": list(r.features_off),
        "zmq_features": list(r.zmq_features),
        "incarnation": r.incarnation,
        # what a router or SDK client on the worker's own host connects to instead ("": none offered)
        "local_endpoint": wire.local_endpoint(r.worker_id, r.incarnation, r.data_endpoint, r.curve_public_key)
        if wire.FEATURE_LOCAL in r.zmq_features
        else "",
    }

    def table() -> Table:
        t = plain_table("FIELD", "VALUE", header=False)
        for field in (
            "worker",
            "endpoint",
            "local_endpoint",
            "version",
            "breaker_level",
            "incarnation",
            "zmq_features",
        ):
            value = doc[field]
            add_row(t, field.upper(), (",".join(value) if isinstance(value, list) else str(value)) or "-")
        return t

    ctl.emit(doc, table)


COMMANDS = (route_cmd, infer_cmd)
