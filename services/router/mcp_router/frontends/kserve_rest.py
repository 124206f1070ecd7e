"""KServe V2 / Open Inference Protocol over HTTP (Triton's REST API), on 8000: the same DataPlane as gRPC.

A thin adapter, sibling of ``kserve_grpc``: Triton's JSON in and out (``kserve_rest_json``), everything
else the gRPC door shares in ``kserve_codec``; no routing logic. It runs on the router's event loop
(aiohttp).

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
- ``GET``/``POST /v2/logging``: the router's log settings (``logsettings``).

Invariants:
- Errors (aiohttp's own 404 and 405 too) are ``{"error": message}`` with the HTTP status
  ``mcpcore.transport.http_status`` gives the error's code (Triton's table: 400 bad input, 404 not
  found, 503 unavailable, 500 internal, ...); a body that is not JSON, or binary data that does not add
  up, is a 400 naming what is wrong.
- A request body over ``max_body_bytes`` is refused 413: before a byte is read when its Content-Length
  says so, else as soon as it passes the limit; what the client goes on sending is dropped unread (for up
  to aiohttp's 10 s of lingering, so that it can read the answer), never kept.
- A request that is not HTTP (aiohttp's 400s before any handler) costs one WARNING line per cause every
  10 s, without a traceback; ERROR lines mean the mesh is at fault.
- A connection on which no whole request arrives within ``idle_timeout_s`` of its opening or its last
  answer is closed (aiohttp's keep-alive timer, armed from the connection's start): an idle keep-alive
  one, or one sending its headers a byte at a time. Per connection, aiohttp bounds a request line and
  each header to 8,190 bytes and a request to 128 headers.
- Tensors are numeric: BYTES is refused as on gRPC; FP16 and BF16 travel as binary data only.
- System shared memory (``/v2/systemsharedmemory/...``) shares its regions with the gRPC front door: a
  region registered over either is usable from both; CUDA shared memory answers 503.
- Request parameters are Triton's ("priority", "timeout" in microseconds, "routing_key", "sequence_id",
  "binary_data_output"), read by the same ``kserve_codec.infer_options`` as gRPC.
- With tracing on (``mcpcore.tracing``), an inference's W3C ``traceparent``/``tracestate`` headers are
  the trace context its span is a child of; tracing off, they are not read.
- With the router's ``tls`` set, the port speaks HTTPS only (with a CA: client certificates required), and
  the endpoints that change the mesh or the router (repository load/unload, logging and trace settings,
  registering shared memory) need a certificate name allowed for their gRPC twin (403 otherwise).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from mcp_router import trace
from mcp_router.dataplane import DataPlane
from mcp_router.frontends import kserve_codec, logsettings
from mcp_router.frontends.kserve_codec import EXTENSIONS, SERVER_NAME
from mcp_router.frontends.kserve_model_info import model_config_proto, statistics_proto
from mcp_router.frontends.kserve_rest_json import (
    as_json,
    decode_inputs,
    encode_result,
    read_json,
    requested_outputs,
    split_body,
)
from mcp_router.frontends.shm_regions import SharedMemory
from mcpcore import tracing
from mcpcore.errors import InvalidArgument, MCPError, forget_frames, log_unexpected
from mcpcore.logs import OncePer
from mcpcore.tls import Access, TLSConfig, http_peer_names
from mcpcore.transport.http_status import http_status

__all__ = ["RestFrontEnd"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_MAX_BODY = web.AppKey("max_body", int)
_SHM_REGISTER, _SHM_UNREGISTER = "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister"
_CUDA_SHM_REGISTER, _CUDA_SHM_UNREGISTER = "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister"


def _error(err: MCPError) -> web.Response:
    return web.json_response({"error": err.message}, status=http_status(err.code))


class _ProtocolLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's log for what it refuses before a handler runs. A request that is not HTTP (a raw byte in
    the path, a URL or a header past its limits, conflicting lengths) is the client's fault: a WARNING
    without a traceback, once per cause every ``interval_s``. Anything else stays an ERROR with its
    traceback: the mesh is at fault."""

    def __init__(self, interval_s: float = 10.0) -> None:
        super().__init__(logging.getLogger("mcp_router.rest"), {})
        self._once = OncePer(interval_s)

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if not isinstance(exc, HttpProcessingError):
            self.logger.error(msg, *args, exc_info=exc_info, **kwargs)
            return
        cause = type(exc).__name__
        if (unsaid := self._once.allow(cause)) is not None:
            more = f" ({unsaid} more since the last such line)" if unsaid else ""
            self.logger.warning("refused a malformed HTTP request: %s: %s%s", cause, _short(exc), more)


def _short(exc: HttpProcessingError) -> str:
    text = str(exc.message or exc).replace("\n", " ")
    return text if len(text) <= 200 else text[:200] + "..."


@web.middleware
async def _json_refusals(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own refusals (no such path 404, a wrong method 405) as ``{"error": ...}`` too: a client
    reads every error of this port the same way (aiohttp answers them in plain text). A body longer than
    the limit it declares is refused before a byte of it is read."""
    limit = request.app[_MAX_BODY]
    if request.content_length is not None and request.content_length > limit:
        message = f"the request body is {request.content_length} bytes, over the {limit}-byte limit"
        return web.json_response({"error": message + "; send less per request"}, status=413)
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
            forget_frames(err)  # the request's bytes go with the answer
            return _error(err)
        except web.HTTPRequestEntityTooLarge:
            message = f"the request body is over the {max_body}-byte limit; send less per request"
            return web.json_response({"error": message}, status=413)
        except web.HTTPException:
            raise
        except Exception as exc:
            answer = log_unexpected(exc, f"{request.method} {request.path}")
            forget_frames(exc)
            return _error(answer)

    return run


class RestFrontEnd:
    def __init__(
        self,
        dataplane: DataPlane,
        *,
        version: str,
        server_name: str = SERVER_NAME,
        max_body_bytes: int = 64 << 20,
        shm: SharedMemory | None = None,
        tracer: trace.Tracer | None = None,
        drain_timeout_s: float = 30.0,
        tls: TLSConfig | None = None,
        max_tensor_bytes: int = kserve_codec.DEFAULT_MAX_TENSOR_BYTES,
        idle_timeout_s: float = 60.0,
    ) -> None:
        self._dataplane = dataplane
        self._max_tensor_bytes = max_tensor_bytes
        self._idle_s = idle_timeout_s
        self._tls = tls if tls is not None and tls.enabled else None
        self._access = Access(self._tls)  # under mutual TLS, control endpoints check the certificate
        self._shm = shm if shm is not None else SharedMemory()
        self._tracer = tracer if tracer is not None else trace.Tracer()
        self._tracing = tracing.enabled()  # OpenTelemetry, apart from TraceSetting's tracer
        self._version = version
        self._server_name = server_name
        self._max_body = max_body_bytes
        self._runner: web.AppRunner | None = None
        self._grace_s = drain_timeout_s

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self._max_body, middlewares=[_json_refusals])
        app[_MAX_BODY] = self._max_body
        model = "/v2/models/{model}"
        versioned = (model, model + "/versions/{version}")
        routes = [
            web.get("/v2/health/live", self._live),
            web.get("/v2/health/ready", self._ready),
            web.get("/v2", self._server_metadata),
            web.get("/v2/models/stats", self._stats),
            web.post("/v2/repository/index", self._index),
            web.post("/v2/repository/models/{model}/load", self._control(self._load, "RepositoryModelLoad")),
            web.post(
                "/v2/repository/models/{model}/unload", self._control(self._unload, "RepositoryModelUnload")
            ),
            web.get("/v2/systemsharedmemory/status", self._shm_status),
            web.get("/v2/systemsharedmemory/region/{region}/status", self._shm_status),
            web.post(
                "/v2/systemsharedmemory/region/{region}/register",
                self._control(self._shm_register, _SHM_REGISTER),
            ),
            web.post(
                "/v2/systemsharedmemory/unregister", self._control(self._shm_unregister, _SHM_UNREGISTER)
            ),
            web.post(
                "/v2/systemsharedmemory/region/{region}/unregister",
                self._control(self._shm_unregister, _SHM_UNREGISTER),
            ),
            web.get("/v2/trace/setting", self._control(self._trace, "TraceSetting")),
            web.post("/v2/trace/setting", self._control(self._trace, "TraceSetting")),
            web.get(model + "/trace/setting", self._control(self._trace, "TraceSetting")),
            web.post(model + "/trace/setting", self._control(self._trace, "TraceSetting")),
            web.get("/v2/logging", self._control(self._logging, "LogSettings")),
            web.post("/v2/logging", self._control(self._logging, "LogSettings")),
            web.get("/v2/cudasharedmemory/status", self._cuda_shm_status),
            web.get("/v2/cudasharedmemory/region/{region}/status", self._cuda_shm_status),
            web.post(
                "/v2/cudasharedmemory/region/{region}/register",
                self._control(self._cuda_shm_register, _CUDA_SHM_REGISTER),
            ),
            web.post(
                "/v2/cudasharedmemory/unregister",
                self._control(self._cuda_shm_unregister, _CUDA_SHM_UNREGISTER),
            ),
            web.post(
                "/v2/cudasharedmemory/region/{region}/unregister",
                self._control(self._cuda_shm_unregister, _CUDA_SHM_UNREGISTER),
            ),
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

    def _control(self, handler: Handler, method: str) -> Handler:
        """``handler`` behind the allow-list of its gRPC twin ``method`` (under mutual TLS), so that both
        doors grant the same names the same rights."""
        full = f"/inference.GRPCInferenceService/{method}"

        async def run(request: web.Request) -> web.StreamResponse:
            peer = request.transport.get_extra_info("peercert") if request.transport is not None else None
            self._access.require_method(full, f"{request.method} {request.path}", http_peer_names(peer))
            return await handler(request)

        return run

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> int:
        """Bind (port 0 picks one) and serve; returns the bound port. ``reuse_port``: SO_REUSEPORT, so
        that other router processes serve the same port."""
        self._runner = web.AppRunner(
            self.app(), access_log=None, handle_signals=False, shutdown_timeout=self._grace_s,
            logger=_ProtocolLog(), keepalive_timeout=self._idle_s,
        )  # fmt: skip
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
            {"name": self._server_name, "version": self._version, "extensions": list(EXTENSIONS)}
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
        return web.json_response(as_json(model_config_proto(self._dataplane.model_config(model, version))))

    async def _stats(self, request: web.Request) -> web.Response:
        model, version = _names(request)
        stats = await self._dataplane.model_statistics(model, version)
        return web.json_response({"model_stats": [as_json(statistics_proto(s)) for s in stats]})

    # -- repository ------------------------------------------------------------------------------------
    async def _index(self, request: web.Request) -> web.Response:
        await read_json(request, allow_empty=True)  # {"ready": bool} may come; the index lists every model
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
        body = await read_json(request, allow_empty=True)
        params = body.get("parameters") or {}
        if not isinstance(params, dict):
            raise InvalidArgument("parameters must be a JSON object")
        await self._dataplane.load(request.match_info["model"], kserve_codec.load_version(params))
        return web.Response(status=200)

    async def _unload(self, request: web.Request) -> web.Response:
        await read_json(request, allow_empty=True)
        await self._dataplane.unload(request.match_info["model"])
        return web.Response(status=200)

    # -- shared memory ---------------------------------------------------------------------------------
    async def _shm_status(self, request: web.Request) -> web.Response:
        regions = self._shm.status(request.match_info.get("region", ""))
        rows = [{"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size} for r in regions]
        return web.json_response(rows)

    async def _shm_register(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        key, offset, size = body.get("key"), body.get("offset", 0), body.get("byte_size")
        if not isinstance(key, str) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in (offset, size)
        ):
            raise InvalidArgument('register needs {"key": "/name", "offset": bytes, "byte_size": bytes}')
        self._shm.register(request.match_info["region"], key, offset, size)
        return web.Response(status=200)

    async def _shm_unregister(self, request: web.Request) -> web.Response:
        await read_json(request, allow_empty=True)
        self._shm.unregister(request.match_info.get("region", ""))
        return web.Response(status=200)

    async def _cuda_shm_status(self, request: web.Request) -> web.Response:
        names = {r.name for r in self._shm.status()}
        return web.json_response(kserve_codec.cuda_shm_status(names, request.match_info.get("region", "")))

    async def _cuda_shm_register(self, request: web.Request) -> web.Response:
        await read_json(request, allow_empty=True)
        raise kserve_codec.cuda_shm_register(request.match_info["region"])

    async def _cuda_shm_unregister(self, request: web.Request) -> web.Response:
        await read_json(request, allow_empty=True)
        return web.Response(status=200)  # none is registered: nothing to do, as in Triton

    async def _trace(self, request: web.Request) -> web.Response:
        """Triton's REST form: values are a string or a list of strings (null clears one); answers give
        each setting as a string, trace_level as a list."""
        body = await read_json(request, allow_empty=True) if request.method == "POST" else {}
        model = request.match_info.get("model", "")
        settings = kserve_codec.trace_settings(self._tracer, self._dataplane, model, body)
        return web.json_response({k: v if k == "trace_level" else v[0] for k, v in settings.items()})

    async def _logging(self, request: web.Request) -> web.Response:
        changes = await read_json(request, allow_empty=True) if request.method == "POST" else {}
        return web.json_response(logsettings.apply(changes) if changes else logsettings.current())

    # -- inference -------------------------------------------------------------------------------------
    async def _infer(self, request: web.Request) -> web.Response:
        model, version = _names(request)
        body = await request.read()
        header, binary = split_body(request, body)
        if not isinstance(header, dict):
            raise InvalidArgument("the inference request must be a JSON object")
        inputs = decode_inputs(header.get("inputs"), binary, self._shm, self._max_tensor_bytes)
        params = header.get("parameters") or {}
        if not isinstance(params, dict):
            raise InvalidArgument("parameters must be a JSON object")
        options = kserve_codec.infer_options(params)
        outputs, binary_out, into_shm = requested_outputs(header.get("outputs"), params)
        request_id = header.get("id", "")
        if not isinstance(request_id, str):
            raise InvalidArgument("id must be a string")
        kserve_codec.check_request_id(request_id)
        caller = tracing.extract_headers(request.headers) if self._tracing else None
        call = kserve_codec.Request(model, version, request_id, inputs, options, tuple(outputs))
        result = await kserve_codec.infer(self._dataplane, self._tracer, call, caller=caller)
        return encode_result(result, request_id, outputs, binary_out, into_shm=into_shm, shm=self._shm)


def _names(request: web.Request) -> tuple[str, str]:
    return request.match_info.get("model", ""), request.match_info.get("version", "")
