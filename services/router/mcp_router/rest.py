"""KServe V2 / Open Inference Protocol over HTTP (Triton's REST API), on 8000: the same DataPlane as gRPC.

A thin adapter like ``kserve.py``: it converts JSON (and the binary tensor data extension) to numpy and
DataPlane values and back, and holds no routing logic. It runs on the router's event loop (aiohttp).

Endpoints (Triton's paths; ``[/versions/{version}]`` is optional everywhere it appears):
- ``GET /v2/health/live``, ``GET /v2/health/ready``: 200 when true, 400 when false (as Triton answers).
- ``GET /v2``: server metadata; ``GET /v2/models/{model}[/versions/{version}]``: model metadata;
  ``.../ready``: 200 or 400; ``.../config``: the version's configuration (ModelConfig as JSON).
- ``GET /v2/models[/{model}[/versions/{version}]]/stats``: statistics (``{"model_stats": [...]}``).
- ``POST /v2/models/{model}[/versions/{version}]/infer``: one inference, JSON tensors or the binary
  tensor data extension (``Inference-Header-Content-Length``: that many bytes of JSON, then each binary
  input's ``binary_data_size`` bytes in input order; outputs asked for with ``binary_data`` come back the
  same way).
- ``POST /v2/repository/index``, ``POST /v2/repository/models/{model}/load`` and ``.../unload``.
- ``GET``/``POST /v2/logging``: the router's log settings (``mcp_router.logsettings``).

Invariants:
- Errors (aiohttp's own 404 and 405 too) are ``{"error": message}`` with the HTTP status
  ``mcpcore.errors.http_status`` gives the error's gRPC code (Triton's table: 400 bad input, 404 not
  found, 503 unavailable, 500 internal, ...); a body that is not JSON, or binary data that does not add
  up, is a 400 naming what is wrong.
- A request body over ``max_body_bytes`` is refused 413 before it is read whole.
- Tensors are numeric: BYTES is refused as on gRPC; FP16 and BF16 travel as binary data only.
- System shared memory (``/v2/systemsharedmemory/...``) shares its regions with the gRPC front door: a
  region registered over either is usable from both; CUDA shared memory answers 503.
- Request parameters are Triton's ("priority", "timeout" in microseconds, "routing_key", "sequence_id",
  "binary_data_output"), read by the same ``infer_options`` as gRPC.
- With tracing on (``mcpcore.tracing``), an inference's W3C ``traceparent``/``tracestate`` headers are
  the trace context its span is a child of; tracing off, they are not read.
- With the router's ``tls`` set, the port speaks HTTPS only (with a CA: client certificates required), and
  the endpoints that change the mesh or the router (repository load/unload, logging and trace settings)
  need an allowed certificate name, as the gRPC control methods do (403 otherwise).
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import numpy as np
import orjson
from aiohttp import web
from google.protobuf import json_format

from mcp_router import logsettings, trace
from mcp_router.dataplane import DataPlane, InferResult
from mcp_router.kserve import (
    EXTENSIONS,
    NO_CUDA_SHM,
    SERVER_NAME,
    check_shape,
    infer_options,
    load_version,
    model_config_proto,
    shm_reference,
    statistics_proto,
    trace_settings,
)
from mcp_router.shm import SharedMemory
from mcpcore import dtypes, tracing
from mcpcore.errors import Internal, InvalidArgument, MCPError, http_status, log_unexpected
from mcpcore.tls import Access, TLSConfig, http_peer_names

__all__ = ["HEADER_LENGTH", "RestFrontEnd"]

#: The binary tensor data extension's header: the length of the JSON part of the body.
HEADER_LENGTH = "Inference-Header-Content-Length"
# Fields of Triton's JSON that are 64-bit integers: protobuf's JSON writes those as strings, Triton (and
# its clients) as numbers.
_INT64_FIELDS = frozenset(
    {
        "dims",
        "versions",
        "max_queue_delay_microseconds",
        "default_timeout_microseconds",
        "priority_levels",
        "default_priority_level",
        "last_inference",
        "inference_count",
        "execution_count",
        "count",
        "ns",
        "batch_size",
        "byte_size",
        "id",
    }
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _numbers(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _numbers(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v, key) for v in value]
    if key in _INT64_FIELDS and isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return value


def _as_json(message: Any) -> Any:
    return _numbers(
        json_format.MessageToDict(
            message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
    )


def _error(err: MCPError) -> web.Response:
    return web.json_response({"error": err.message}, status=http_status(err.code))


@web.middleware
async def _json_refusals(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own refusals (no such path 404, a wrong method 405) as ``{"error": ...}`` too: a client
    reads every error of this port the same way (aiohttp answers them in plain text)."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        message = f"{exc.reason}: {request.method} {request.path[:200]}"
        return web.json_response({"error": message}, status=exc.status, headers=allow)


def _guarded(handler: Handler, max_body: int) -> Handler:
    """The REST twin of ``GuardedServer``: an MCPError is its status and message, anything else 500."""

    async def run(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except MCPError as err:
            return _error(err)
        except web.HTTPRequestEntityTooLarge:
            message = f"the request body is over the {max_body}-byte limit; send less per request"
            return web.json_response({"error": message}, status=413)
        except web.HTTPException:
            raise
        except Exception as exc:
            return _error(log_unexpected(exc, f"{request.method} {request.path}"))

    return run


class RestFrontEnd:
    def __init__(
        self,
        dataplane: DataPlane,
        *,
        version: str,
        max_body_bytes: int = 64 << 20,
        shm: SharedMemory | None = None,
        tracer: trace.Tracer | None = None,
        drain_timeout_s: float = 30.0,
        tls: TLSConfig | None = None,
    ) -> None:
        self._dataplane = dataplane
        self._tls = tls if tls is not None and tls.enabled else None
        self._access = Access(self._tls)  # under mutual TLS, control endpoints check the certificate
        self._shm = shm if shm is not None else SharedMemory()
        self._tracer = tracer if tracer is not None else trace.Tracer()
        self._tracing = tracing.enabled()  # OpenTelemetry, apart from TraceSetting's tracer
        self._version = version
        self._max_body = max_body_bytes
        self._runner: web.AppRunner | None = None
        self._grace_s = drain_timeout_s

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self._max_body, middlewares=[_json_refusals])
        model = "/v2/models/{model}"
        versioned = (model, model + "/versions/{version}")
        routes = [
            web.get("/v2/health/live", self._live),
            web.get("/v2/health/ready", self._ready),
            web.get("/v2", self._server_metadata),
            web.get("/v2/models/stats", self._stats),
            web.post("/v2/repository/index", self._index),
            web.post("/v2/repository/models/{model}/load", self._control(self._load)),
            web.post("/v2/repository/models/{model}/unload", self._control(self._unload)),
            web.get("/v2/systemsharedmemory/status", self._shm_status),
            web.get("/v2/systemsharedmemory/region/{region}/status", self._shm_status),
            web.post("/v2/systemsharedmemory/region/{region}/register", self._shm_register),
            web.post("/v2/systemsharedmemory/unregister", self._shm_unregister),
            web.post("/v2/systemsharedmemory/region/{region}/unregister", self._shm_unregister),
            web.get("/v2/trace/setting", self._control(self._trace)),
            web.post("/v2/trace/setting", self._control(self._trace)),
            web.get(model + "/trace/setting", self._control(self._trace)),
            web.post(model + "/trace/setting", self._control(self._trace)),
            web.get("/v2/logging", self._control(self._logging)),
            web.post("/v2/logging", self._control(self._logging)),
            web.get("/v2/cudasharedmemory/status", self._no_cuda_shm),
            web.get("/v2/cudasharedmemory/region/{region}/status", self._no_cuda_shm),
            web.post("/v2/cudasharedmemory/region/{region}/register", self._no_cuda_shm),
            web.post("/v2/cudasharedmemory/unregister", self._no_cuda_shm),
            web.post("/v2/cudasharedmemory/region/{region}/unregister", self._no_cuda_shm),
        ]
        for path in versioned:
            routes += [
                web.get(path, self._model_metadata),
                web.get(path + "/ready", self._model_ready),
                web.get(path + "/config", self._config),
                web.get(path + "/stats", self._stats),
                web.post(path + "/infer", self._infer),
            ]
        app.add_routes([web.route(r.method, r.path, _guarded(r.handler, self._max_body)) for r in routes])  # type: ignore[attr-defined]
        return app

    def _control(self, handler: Handler) -> Handler:
        """``handler`` behind the control allow-list (mutual TLS), as the gRPC control methods are."""

        async def run(request: web.Request) -> web.StreamResponse:
            peer = request.transport.get_extra_info("peercert") if request.transport is not None else None
            self._access.require(f"{request.method} {request.path}", http_peer_names(peer))
            return await handler(request)

        return run

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> int:
        """Bind (port 0 picks one) and serve; returns the bound port. ``reuse_port``: SO_REUSEPORT, so
        that other router processes serve the same port."""
        self._runner = web.AppRunner(
            self.app(), access_log=None, handle_signals=False, shutdown_timeout=self._grace_s
        )
        await self._runner.setup()
        context = self._tls.ssl_context() if self._tls is not None and self._tls.cert_file else None
        site = web.TCPSite(
            self._runner, host, port, reuse_address=True, reuse_port=reuse_port or None, ssl_context=context
        )
        await site.start()
        server = site._server
        return int(server.sockets[0].getsockname()[1]) if server is not None else port

    async def stop(self) -> None:
        """Stop taking connections; requests in flight get ``drain_timeout_s`` to finish."""
        if self._runner is not None:
            await self._runner.shutdown()
            await self._runner.cleanup()
            self._runner = None

    # -- health and metadata ---------------------------------------------------------------------------
    async def _live(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self._dataplane.live() else 400)

    async def _ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self._dataplane.ready() else 400)

    async def _server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"name": SERVER_NAME, "version": self._version, "extensions": list(EXTENSIONS)}
        )

    async def _model_metadata(self, request: web.Request) -> web.Response:
        model, version = _names(request)
        meta = self._dataplane.model_metadata(model, version)
        tensors = lambda ts: [{"name": t.name, "datatype": t.dtype, "shape": list(t.shape)} for t in ts]  # noqa: E731
        return web.json_response(
            {
                "name": meta.name,
                "versions": list(meta.versions),
                "platform": meta.platform,
                "inputs": tensors(meta.inputs),
                "outputs": tensors(meta.outputs),
            }
        )

    async def _model_ready(self, request: web.Request) -> web.Response:
        model, version = _names(request)
        return web.Response(status=200 if self._dataplane.model_ready(model, version) else 400)

    async def _config(self, request: web.Request) -> web.Response:
        model, version = _names(request)
        return web.json_response(_as_json(model_config_proto(self._dataplane.model_config(model, version))))

    async def _stats(self, request: web.Request) -> web.Response:
        model, version = _names(request)
        stats = await self._dataplane.model_statistics(model, version)
        return web.json_response({"model_stats": [_as_json(statistics_proto(s)) for s in stats]})

    # -- repository ------------------------------------------------------------------------------------
    async def _index(self, request: web.Request) -> web.Response:
        await _json_body(request, allow_empty=True)  # {"ready": bool} may come; the index lists every model
        entries = self._dataplane.index()
        return web.json_response(
            [
                {
                    "name": e.name,
                    "version": e.version,
                    "state": e.state,
                    **({"reason": e.reason} if e.reason else {}),
                }
                for e in entries
            ]
        )

    async def _load(self, request: web.Request) -> web.Response:
        body = await _json_body(request, allow_empty=True)
        params = body.get("parameters") or {}
        if not isinstance(params, dict):
            raise InvalidArgument("parameters must be a JSON object")
        await self._dataplane.load(request.match_info["model"], load_version(params))
        return web.Response(status=200)

    async def _unload(self, request: web.Request) -> web.Response:
        await _json_body(request, allow_empty=True)
        await self._dataplane.unload(request.match_info["model"])
        return web.Response(status=200)

    # -- shared memory ---------------------------------------------------------------------------------
    async def _shm_status(self, request: web.Request) -> web.Response:
        regions = self._shm.status(request.match_info.get("region", ""))
        rows = [{"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size} for r in regions]
        return web.json_response(rows)

    async def _shm_register(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        key, offset, size = body.get("key"), body.get("offset", 0), body.get("byte_size")
        if not isinstance(key, str) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in (offset, size)
        ):
            raise InvalidArgument('register needs {"key": "/name", "offset": bytes, "byte_size": bytes}')
        self._shm.register(request.match_info["region"], key, offset, size)
        return web.Response(status=200)

    async def _shm_unregister(self, request: web.Request) -> web.Response:
        await _json_body(request, allow_empty=True)
        self._shm.unregister(request.match_info.get("region", ""))
        return web.Response(status=200)

    async def _no_cuda_shm(self, request: web.Request) -> web.Response:
        raise NO_CUDA_SHM

    async def _trace(self, request: web.Request) -> web.Response:
        """Triton's REST form: values are a string or a list of strings (null clears one); answers give
        each setting as a string, trace_level as a list."""
        body = await _json_body(request, allow_empty=True) if request.method == "POST" else {}
        model = request.match_info.get("model", "")
        settings = trace_settings(self._tracer, self._dataplane, model, body)
        return web.json_response({k: v if k == "trace_level" else v[0] for k, v in settings.items()})

    async def _logging(self, request: web.Request) -> web.Response:
        changes = await _json_body(request, allow_empty=True) if request.method == "POST" else {}
        return web.json_response(logsettings.apply(changes) if changes else logsettings.current())

    # -- inference -------------------------------------------------------------------------------------
    async def _infer(self, request: web.Request) -> web.Response:
        model, version = _names(request)
        body = await request.read()
        header, binary = _split_body(request, body)
        if not isinstance(header, dict):
            raise InvalidArgument("the inference request must be a JSON object")
        inputs = _decode_inputs(header.get("inputs"), binary, self._shm)
        params = header.get("parameters") or {}
        if not isinstance(params, dict):
            raise InvalidArgument("parameters must be a JSON object")
        options = infer_options(params)
        outputs, binary_out, into_shm = _requested(header.get("outputs"), params)
        request_id = header.get("id", "")
        if not isinstance(request_id, str):
            raise InvalidArgument("id must be a string")
        caller = tracing.attach(tracing.extract_headers(request.headers)) if self._tracing else None
        traced = trace.begin(self._tracer, model, version, request_id, inputs)
        try:
            result = await self._dataplane.infer(
                model,
                version,
                request_id,
                inputs,
                routing_key=options.routing_key,
                priority=options.priority,
                timeout_s=options.timeout_s,
                outputs=tuple(outputs),
                parameters=options.parameters,
                sequence=options.sequence,
                trace=traced,
            )
        except BaseException:
            trace.end(traced)
            raise
        finally:
            if caller is not None:
                tracing.detach(caller)
        trace.end(traced, result.outputs)
        return _encode_result(result, request_id, outputs, binary_out, into_shm=into_shm, shm=self._shm)


def _names(request: web.Request) -> tuple[str, str]:
    return request.match_info.get("model", ""), request.match_info.get("version", "")


# What orjson would read otherwise, found in one pass that maps every digit to 9 and "{" to "[" (1.4 us for
# a KServe request here; a regex takes 24): 19 digits in a row, maybe an integer past 64 bits, which
# orjson reads as a float (18 never are); and enough brackets to nest past where the standard library
# stops (Python's recursion limit less the frames above it: ~890 levels here), which orjson reads up to
# 1,024 levels deep and whose values then break whatever recurses over them.
_NORMALISED = bytes.maketrans(b"0123456789{", b"9999999999[")
_LONG_DIGITS = b"9" * 19
_MANY_BRACKETS = 256


def _loads(raw: bytes) -> Any:
    """A JSON document, read as the standard library reads it: by orjson (a tenth of the standard library's
    time for a KServe request here), or by the standard library where orjson would read it otherwise
    (integers past 64 bits; 256 brackets or more, which may nest deeper than the standard library reads)
    or refuses it (``NaN``, ``Infinity`` and numbers past the float range, a BOM, UTF-16 or UTF-32, lone
    surrogates), so what is accepted, and the error for what is not, stay the standard library's."""
    normalised = raw.translate(_NORMALISED)
    if _LONG_DIGITS not in normalised and normalised.count(b"[") < _MANY_BRACKETS:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(raw)


def _dumps(doc: dict[str, Any], *, finite: bool) -> bytes:
    """``doc`` as compact JSON: by orjson when it writes what the standard library would (it writes a
    non-finite float as ``null``, so ``finite`` says there is none), else by the standard library, which
    writes ``NaN`` and ``Infinity`` as Triton's REST API does."""
    if finite:
        try:
            return orjson.dumps(doc)
        except orjson.JSONEncodeError:  # a string with lone surrogates, an integer past 64 bits
            pass
    return json.dumps(doc, separators=(",", ":")).encode()


async def _json_body(request: web.Request, *, allow_empty: bool = False) -> dict[str, Any]:
    raw = await request.read()
    if not raw and allow_empty:
        return {}
    try:
        body = _loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument(f"the request body is not JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(body, dict):
        raise InvalidArgument("the request body must be a JSON object")
    return body


def _split_body(request: web.Request, body: bytes) -> tuple[Any, memoryview]:
    """(the JSON part, parsed; the binary part) of an inference request."""
    length = request.headers.get(HEADER_LENGTH)
    view = memoryview(body)
    if length is None:
        cut = len(body)
    else:
        try:
            cut = int(length)
        except ValueError:
            raise InvalidArgument(f"{HEADER_LENGTH} is {length!r}, not a number of bytes") from None
        if not 0 <= cut <= len(body):
            raise InvalidArgument(f"{HEADER_LENGTH} is {cut} but the body has {len(body)} bytes")
    try:
        header = _loads(view[:cut].tobytes())
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument(f"the inference request's JSON does not parse ({type(exc).__name__})") from None
    return header, view[cut:]


def _decode_inputs(specs: Any, binary: memoryview, shm: SharedMemory) -> dict[str, np.ndarray]:
    if not isinstance(specs, list) or not specs:
        raise InvalidArgument("inputs must be a non-empty list of tensors")
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    for i, spec in enumerate(specs):
        if not isinstance(spec, dict):
            raise InvalidArgument(f"inputs[{i}] must be a JSON object")
        name, datatype, shape = spec.get("name"), spec.get("datatype"), spec.get("shape")
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"inputs[{i}] has no name")
        if name in arrays:
            raise InvalidArgument(f"input {name} appears twice; send each input once")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) for d in shape
        ):
            raise InvalidArgument(f"input {name}: shape must be a list of non-negative integers")
        check_shape(f"input {name}", tuple(shape))
        try:
            dtype = dtypes.numpy_dtype(datatype)
        except (InvalidArgument, TypeError, KeyError):
            raise InvalidArgument(f"input {name}: unknown datatype {datatype!r}") from None
        count = math.prod(shape)
        text = datatype == dtypes.BYTES
        params = spec.get("parameters") or {}
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        if isinstance(params, dict) and "shared_memory_region" in params:
            region, shm_offset, shm_size = shm_reference(params, f"input {name}")
            what = f"input {name}"
            arrays[name] = shm.read(
                region, shm_offset, shm_size, datatype=datatype, shape=tuple(shape), what=what
            )
            continue
        if size is not None:
            arrays[name] = _binary_input(name, datatype, tuple(shape), size, binary=binary, offset=offset)
            offset += size
            continue
        if datatype in ("FP16", "BF16"):
            raise InvalidArgument(f"input {name}: {datatype} travels as binary data only (binary_data_size)")
        if "data" not in spec:
            raise InvalidArgument(f"input {name} has neither data nor binary_data_size")
        try:
            array = _strings(spec["data"], name) if text else np.asarray(spec["data"], dtype=dtype)
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise InvalidArgument(f"input {name}: data is not {datatype} ({exc})") from None
        if array.size != count:
            raise InvalidArgument(f"input {name}: {array.size} values for shape {shape} ({count} needed)")
        arrays[name] = array.reshape(shape)
    if offset != len(binary):
        raise InvalidArgument(f"{len(binary) - offset} bytes of binary data belong to no input")
    return arrays


def _binary_input(
    name: str, datatype: str, shape: tuple[int, ...], size: Any, *, binary: memoryview, offset: int
) -> np.ndarray:
    """An input sent as binary data: its ``size`` bytes from ``offset`` in the binary part."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InvalidArgument(f"input {name}: binary_data_size {size!r} is not a number of bytes")
    if datatype != dtypes.BYTES:
        need = math.prod(shape) * dtypes.numpy_dtype(datatype).itemsize
        if size != need:
            raise InvalidArgument(
                f"input {name}: binary_data_size {size!r} but shape {list(shape)} of {datatype} needs "
                f"{need} bytes"
            )
    if offset + size > len(binary):
        raise InvalidArgument(
            f"input {name}: binary data ends at byte {len(binary)}; {offset + size} are needed"
        )
    return dtypes.from_bytes(datatype, binary[offset : offset + size], shape, f"input {name}")


def _strings(data: Any, name: str) -> np.ndarray:
    """BYTES elements from JSON: strings (sent as their UTF-8), in nested lists or flat."""
    flat: list[bytes] = []
    stack = [data]
    while stack:  # row-major order, without recursion a hostile nesting could exhaust
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, str):
            flat.append(item.encode())
        else:
            raise InvalidArgument(f"input {name}: BYTES data are strings, got {type(item).__name__}")
    array = np.empty(len(flat), dtype=object)
    array[:] = flat
    return array


def _json_strings(array: np.ndarray) -> list[str] | None:
    """A BYTES output's elements as JSON strings, or None when one is not UTF-8 (it goes as binary)."""
    try:
        return [bytes(v).decode() if not isinstance(v, str) else v for v in array.reshape(-1)]
    except UnicodeDecodeError:
        return None


def _requested(
    specs: Any, params: Mapping[str, Any]
) -> tuple[list[str], set[str], dict[str, tuple[str, int, int]]]:
    """The outputs asked for (empty: all), which of them go back as binary data, and which go into
    shared memory (name -> region, offset, byte size)."""
    default_binary = params.get("binary_data_output") is True
    if specs is None:
        return [], ({"*"} if default_binary else set()), {}
    if not isinstance(specs, list):
        raise InvalidArgument("outputs must be a list")
    names, binary, into_shm = [], set(), {}
    for i, spec in enumerate(specs):
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise InvalidArgument(f"outputs[{i}] must be an object with a name")
        p = spec.get("parameters") or {}
        if not isinstance(p, dict):
            raise InvalidArgument(f"outputs[{i}].parameters must be an object")
        if "classification" in p:
            raise InvalidArgument(f"output {spec['name']}: classification is not supported")
        names.append(spec["name"])
        if "shared_memory_region" in p:
            into_shm[spec["name"]] = shm_reference(p, f"output {spec['name']}")
        elif p.get("binary_data", default_binary) is True:
            binary.add(spec["name"])
    return names, binary, into_shm


def _encode_result(
    result: InferResult,
    request_id: str,
    requested: list[str],
    binary: set[str],
    *,
    into_shm: Mapping[str, tuple[str, int, int]],
    shm: SharedMemory,
) -> web.Response:
    names = [n for n in requested if n in result.outputs] if requested else list(result.outputs)
    outputs, blobs = [], []
    finite = True  # every float written as JSON data is (``_dumps``)
    for name in names:
        array = result.outputs[name]
        try:
            datatype = dtypes.from_numpy(array.dtype)
        except InvalidArgument as err:
            raise Internal(f"output {name} of model {result.model}: {err.message}") from None
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        target = into_shm.get(name)
        strings = _json_strings(array) if datatype == dtypes.BYTES else None
        if target is not None:  # written into the client's region: the reply carries its shape only
            region, offset, size = target
            shm.write(region, offset, size, dtypes.to_bytes(array), what=f"output {name}")
        elif (
            name in binary
            or "*" in binary
            or datatype in ("FP16", "BF16")
            or (datatype == dtypes.BYTES and strings is None)  # not UTF-8: JSON cannot carry it
        ):
            blob = bytes(dtypes.to_bytes(array))
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            if array.dtype.kind == "f" and finite:
                finite = bool(np.isfinite(array).all())
            entry["data"] = strings if strings is not None else array.reshape(-1).tolist()
        outputs.append(entry)
    doc: dict[str, Any] = {"model_name": result.model, "model_version": result.version, "outputs": outputs}
    if request_id:
        doc["id"] = request_id
    head = _dumps(doc, finite=finite)
    if not blobs:
        return web.Response(body=head, content_type="application/json")
    return web.Response(
        body=b"".join([head, *blobs]),
        headers={HEADER_LENGTH: str(len(head))},
        content_type="application/octet-stream",
    )
