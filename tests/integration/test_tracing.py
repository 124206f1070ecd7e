"""OpenTelemetry tracing end to end, through real processes: a client's W3C traceparent (KServe gRPC
metadata, REST header) → the router's server span → ``mcp.traceparent`` in the ZeroMQ header → the
worker's queue, batch and compute spans, all exported over OTLP/gRPC to a receiver in this process; and
a router with no endpoint exports nothing and sends no trace context on.

The receiver is a real ``TraceService`` on a free port; tests wait on it (a condition variable the
Export handler signals), never sleep.
"""

from __future__ import annotations

import json
import secrets
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pytest
from harness import RouterProcess, TensorClient, WorkerProcess, load_and_run, small_mesh, wait_for
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

from mcpapi.kserve import grpc_service_pb2 as kserve_pb
from mcpapi.kserve import grpc_service_pb2_grpc as kserve_grpc
from mcpapi.v2 import inference_pb2 as v2
from mcpapi.v2 import inference_pb2_grpc as v2_grpc
from mcpcore import dtypes, tracing, wire

X = np.random.default_rng(11).standard_normal((1, 64), dtype=np.float32)
MODEL = "demo-mlp"
SERVER = trace_pb2.Span.SpanKind.SPAN_KIND_SERVER
_OTEL_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


@dataclass(frozen=True)
class Got:
    """One exported span and the resource it came with."""

    service: str
    resource: dict[str, Any]
    span: trace_pb2.Span

    def attr(self, key: str) -> Any:
        return _attributes(self.span.attributes).get(key)


def _value(v: Any) -> Any:
    return getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP trace receiver: keeps every span it is sent, and wakes whoever waits for some."""

    def __init__(self) -> None:
        self.spans: list[Got] = []
        self._changed = threading.Condition()
        self.endpoint = ""

    def Export(self, request, context):  # type: ignore[no-untyped-def]
        with self._changed:
            for rs in request.resource_spans:
                resource = _attributes(rs.resource.attributes)
                for ss in rs.scope_spans:
                    self.spans += [Got(resource.get("service.name", ""), resource, s) for s in ss.spans]
            self._changed.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()

    def all(self) -> list[Got]:
        with self._changed:
            return list(self.spans)

    def of_trace(self, trace_id: int) -> list[Got]:
        want = trace_id.to_bytes(16, "big")
        with self._changed:
            return [g for g in self.spans if g.span.trace_id == want]

    def wait(self, trace_id: int, names: set[str], timeout_s: float = 30.0) -> dict[str, Got]:
        """The spans of ``trace_id`` by name, once every one of ``names`` has come."""

        def named() -> dict[str, Got]:
            return {g.span.name: g for g in self.of_trace(trace_id)}

        with self._changed:
            if not self._changed.wait_for(lambda: names <= named().keys(), timeout_s):
                raise AssertionError(f"spans {sorted(names)} of trace {trace_id:032x}: got {sorted(named())}")
        return named()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    server = grpc.server(futures.ThreadPoolExecutor(4))
    recv = Receiver()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(recv, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    recv.endpoint = f"http://127.0.0.1:{port}"
    yield recv
    server.stop(0)


@pytest.fixture(scope="module")
def traced(tmp_path_factory, etcd_endpoint, repo, receiver) -> Iterator[Any]:
    """A worker, scheduler and router that all export to the receiver (spans sent every 50 ms)."""
    with pytest.MonkeyPatch.context() as env:  # the processes take the standard variables
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        with small_mesh(tmp_path_factory.mktemp("traced"), etcd_endpoint, repo, MODEL, ["1"]) as mesh:
            yield mesh


def _ids() -> tuple[int, int, str]:
    trace_id, span_id = secrets.randbits(128) | 1, secrets.randbits(64) | 1
    return trace_id, span_id, f"00-{trace_id:032x}-{span_id:016x}-01"


def _kserve_request(request_id: str, version: str = "") -> kserve_pb.ModelInferRequest:
    return kserve_pb.ModelInferRequest(
        model_name=MODEL,
        model_version=version,
        id=request_id,
        inputs=[kserve_pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP32", shape=[1, 64])],
        raw_input_contents=[X.tobytes()],
    )


def _rest_infer(url: str, headers: dict[str, str], version: str = "") -> dict[str, Any]:
    body = {"id": "rest-1", "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64],
                                        "data": X.reshape(-1).tolist()}]}  # fmt: skip
    path = f"/v2/models/{MODEL}/versions/{version}/infer" if version else f"/v2/models/{MODEL}/infer"
    request = urllib.request.Request(
        f"http://{url}{path}", data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", **headers},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _check_request_spans(spans: dict[str, Got], trace_id: int, worker_id: str) -> Got:
    """The router's span and the worker's three under it; returns the router's."""
    router, queue, batch, compute = (spans[n] for n in ("router.infer", "queue", "batch", "compute"))
    assert router.service == "mcp-router" and router.span.kind == SERVER
    assert router.attr("mcp.model") == MODEL and router.attr("mcp.version") == "1"
    assert router.attr("mcp.worker") == worker_id and router.attr("mcp.status") == "OK"
    for got in (queue, batch, compute):
        assert got.service == "mcp-worker" and got.resource["mcp.worker"] == worker_id
        assert got.span.trace_id == trace_id.to_bytes(16, "big")
    router_id = router.span.span_id
    assert queue.span.parent_span_id == router_id and batch.span.parent_span_id == router_id
    assert compute.span.parent_span_id == batch.span.span_id
    assert router_id in [link.span_id for link in batch.span.links]  # the batch names each request's span
    assert batch.span.span_id in [link.span_id for link in queue.span.links]  # and each request its batch
    assert batch.attr("mcp.batch.size") >= 1 and batch.attr("mcp.model") == MODEL
    assert (
        queue.span.start_time_unix_nano
        <= batch.span.start_time_unix_nano
        <= compute.span.start_time_unix_nano
    )
    assert compute.span.end_time_unix_nano <= batch.span.end_time_unix_nano <= router.span.end_time_unix_nano
    return router


def test_kserve_traceparent_carries_into_the_worker(traced, receiver):
    trace_id, client_span, traceparent = _ids()
    stub = kserve_grpc.GRPCInferenceServiceStub(traced.router.channel())
    metadata = (("traceparent", traceparent), ("tracestate", "vendor=abc"))
    reply = stub.ModelInfer(_kserve_request("k-1"), metadata=metadata, timeout=30)
    assert reply.id == "k-1" and reply.model_version == "1"
    spans = receiver.wait(trace_id, {"router.infer", "queue", "batch", "compute"})
    router = _check_request_spans(spans, trace_id, traced.worker.worker_id)
    assert router.span.parent_span_id == client_span.to_bytes(8, "big")  # the client's span is its parent
    assert router.span.trace_state == "vendor=abc"
    assert {g.service for g in receiver.of_trace(trace_id)} == {"mcp-router", "mcp-worker"}


def test_rest_traceparent_carries_into_the_worker(traced, receiver):
    trace_id, client_span, traceparent = _ids()
    reply = _rest_infer(traced.router.endpoints["rest"], {"traceparent": traceparent})
    assert reply["id"] == "rest-1"
    spans = receiver.wait(trace_id, {"router.infer", "queue", "batch", "compute"})
    router = _check_request_spans(spans, trace_id, traced.worker.worker_id)
    assert router.span.parent_span_id == client_span.to_bytes(8, "big")


def test_v2_infer_and_kserve_streams_carry_the_callers_context(traced, receiver):
    trace_id, client_span, traceparent = _ids()
    stub = v2_grpc.InferenceStub(traced.router.channel())
    tensor = v2.Tensor(name="INPUT0", dtype=dtypes.wire_value("FP32"), shape=[1, 64], data=X.tobytes())
    stub.Infer(
        v2.InferRequest(model=MODEL, request_id="v2-1", inputs=[tensor]),
        metadata=(("traceparent", traceparent),),
        timeout=30,
    )
    spans = receiver.wait(trace_id, {"router.infer", "queue", "batch", "compute"})
    router = _check_request_spans(spans, trace_id, traced.worker.worker_id)
    assert router.span.parent_span_id == client_span.to_bytes(8, "big")

    trace_id, client_span, traceparent = _ids()  # a stream: each of its requests is a child of its caller
    kserve = kserve_grpc.GRPCInferenceServiceStub(traced.router.channel())
    answers = list(
        kserve.ModelStreamInfer(
            iter([_kserve_request("s-1"), _kserve_request("s-2")]),
            metadata=(("traceparent", traceparent),),
            timeout=30,
        )
    )
    assert sorted(a.infer_response.id for a in answers) == ["s-1", "s-2"] and not any(
        a.error_message for a in answers
    )

    def two() -> list[Got]:
        got = [g for g in receiver.of_trace(trace_id) if g.span.name == "router.infer"]
        return got if len(got) == 2 else []

    routers = wait_for(two, timeout_s=30, what="the stream's two router spans")
    assert {g.span.parent_span_id for g in routers} == {client_span.to_bytes(8, "big")}


def test_a_failed_request_is_a_span_with_its_status_and_no_worker_spans(traced, receiver):
    trace_id, client_span, traceparent = _ids()
    stub = kserve_grpc.GRPCInferenceServiceStub(traced.router.channel())
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(_kserve_request("bad", "9"), metadata=(("traceparent", traceparent),), timeout=30)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    router = receiver.wait(trace_id, {"router.infer"})["router.infer"]
    assert router.attr("mcp.status") == "NOT_FOUND" and router.attr("mcp.worker") is None
    assert router.span.status.code == trace_pb2.Status.STATUS_CODE_UNSET  # the client's mistake, no fault
    assert router.span.parent_span_id == client_span.to_bytes(8, "big")


def test_a_request_without_traceparent_starts_a_trace(traced, receiver):
    stub = kserve_grpc.GRPCInferenceServiceStub(traced.router.channel())
    request_id = f"fresh-{uuid.uuid4().hex[:8]}"
    stub.ModelInfer(_kserve_request(request_id), timeout=30)

    def mine() -> Got | None:
        return next((g for g in receiver.all() if g.attr("mcp.client_request_id") == request_id), None)

    got = wait_for(mine, timeout_s=30, what="the request's router span")
    assert got.span.name == "router.infer" and not got.span.parent_span_id  # a root: a new trace
    trace_id = int.from_bytes(got.span.trace_id, "big")
    spans = receiver.wait(trace_id, {"router.infer", "queue", "batch", "compute"})
    _check_request_spans(spans, trace_id, traced.worker.worker_id)
    assert spans["queue"].attr("mcp.request_id") == got.attr("mcp.request_id")  # the wire id, both sides


def test_traced_processes_say_so_in_json_lines(traced):
    for proc in (traced.router, traced.worker):
        lines = [json.loads(line) for line in proc.log.read_text().splitlines()]
        assert any(line["msg"].startswith("tracing on: OTLP spans to") for line in lines)


@contextmanager
def _untraced_mesh(tmp, etcd_endpoint, repo, receiver) -> Iterator[tuple[RouterProcess, WorkerProcess]]:
    """A worker serving the model (no scheduler: requests name the version) and a router to it."""
    prefix = f"/t{uuid.uuid4().hex[:8]}/mcp"
    # the worker exports to the receiver, and rarely (10 min): only its stop flushes its spans
    worker = WorkerProcess(tmp, etcd_endpoint, repo, prefix=prefix, otlp_endpoint=receiver.endpoint)
    worker.env["OTEL_BSP_SCHEDULE_DELAY"] = "600000"
    router = RouterProcess(tmp, etcd_endpoint, prefix=prefix, scheduler="")
    for name in _OTEL_ENV:  # the router has no endpoint at all
        router.env.pop(name, None)
    router.env["OTEL_BSP_SCHEDULE_DELAY"] = "50"  # were it tracing, its spans would go at once
    worker.start()
    try:
        load_and_run(worker.control(), MODEL)
        router.start()
        yield router, worker
    finally:
        router.stop()
        worker.stop()


def test_without_an_endpoint_the_router_exports_nothing_and_sends_no_context(
    tmp_path, etcd_endpoint, repo, receiver
):
    """The router has no endpoint; its worker has one (this receiver), so were the router tracing, the
    trace context it put in the ZeroMQ header would make the worker record spans of the client's trace.
    A request sent straight to the worker with a traceparent shows that the worker does export them (its
    spans are flushed when it stops): once both processes have exited, every span they would have sent
    has been sent."""
    trace_id, _, traceparent = _ids()
    direct_trace, _, direct_parent = _ids()
    with _untraced_mesh(tmp_path, etcd_endpoint, repo, receiver) as (router, worker):
        stub = kserve_grpc.GRPCInferenceServiceStub(router.channel())
        wait_for(
            lambda: stub.ModelReady(kserve_pb.ModelReadyRequest(name=MODEL, version="1"), timeout=5).ready,
            timeout_s=30,
            what="the model routed",
        )
        stub.ModelInfer(_kserve_request("u-1", "1"), metadata=(("traceparent", traceparent),), timeout=30)
        _rest_infer(router.endpoints["rest"], {"traceparent": traceparent}, "1")
        with TensorClient(worker.endpoints["zmq"]) as client:
            client.infer(MODEL, {"INPUT0": X}, parameters={wire.PARAM_TRACEPARENT: direct_parent})
    # both processes have stopped: the worker's spans were flushed on its way out
    assert {g.span.name for g in receiver.of_trace(direct_trace)} == {"queue", "batch", "compute"}
    assert receiver.of_trace(trace_id) == []
    lines = [json.loads(line) for line in router.log.read_text().splitlines()]
    assert not any(line["msg"].startswith("tracing on") for line in lines)


def test_traceparent_helpers():  # the endpoint and the ratio are settings: tests/unit/test_config.py
    trace_id, span_id, traceparent = _ids()
    parent = tracing.from_traceparent(traceparent)
    token = tracing.attach(parent)
    try:
        sc = tracing.sampled_parent()
        assert sc is not None and (sc.trace_id, sc.span_id) == (trace_id, span_id)
    finally:
        tracing.detach(token)
    assert tracing.sampled_parent() is None  # none outside
    token = tracing.attach(
        tracing.from_traceparent(traceparent[:-2] + "00")
    )  # not sampled: no spans under it
    try:
        assert tracing.sampled_parent() is None
    finally:
        tracing.detach(token)
    assert not tracing.enabled() and tracing.tracer("x") is None  # this process set up nothing
