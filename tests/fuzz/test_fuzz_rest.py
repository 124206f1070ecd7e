"""Fuzzing the router's REST port (KServe V2 / Triton HTTP) on a real mesh: paths, bodies, headers.

Contract (``mcp_router.frontends.kserve_rest``): a client's garbage gets a 4xx (or 503) whose body is Triton's
``{"error": "..."}`` with a clear message, never a 500; health and readiness endpoints answer 200/400
without a body, as Triton's do; the router serves a valid inference after each; and none of it counts
as the real model's server-side error, nor as an error of the router's loops.

Hostile: paths (``..%2f..%2fetc``, dot segments, unicode, NUL, very long), JSON bodies (wrong types,
deep nesting, huge numbers, NaN, shapes that do not match the data, datatype garbage) and the binary
extension's ``Inference-Header-Content-Length`` (negative, past the body, not a number).
"""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest
from fuzzing import HOSTILE_NAMES, assert_clear, fuzz_settings, hostile_json, hostile_text, model_health
from harness import mlp_reference
from hypothesis import given
from hypothesis import strategies as st

MODEL = "demo-mlp"
HEADER_LENGTH = "Inference-Header-Content-Length"
_MAX_LINE = 8190 - len("POST  HTTP/1.1")  # aiohttp's request line limit
X = np.random.default_rng(5).random((2, 64), dtype=np.float32)


@pytest.fixture(scope="module")
def rest(mesh) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    host, port = mesh.router.endpoints["rest"].rsplit(":", 1)
    return host, int(port)


@pytest.fixture(scope="module")
def expected(repo) -> np.ndarray:  # type: ignore[no-untyped-def]
    return mlp_reference(repo, MODEL, "1", X)


def send(rest: tuple[str, int], method: str, path: str, body: bytes = b"", headers: Any = None) -> Any:
    """One request on a fresh connection: (status, content type, body)."""
    conn = http.client.HTTPConnection(*rest, timeout=15)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for key, value in (headers or {}).items():
            conn.putheader(key, value)  # bytes values go as they are: any header a peer could send
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read()
    finally:
        conn.close()


def probe(rest: tuple[str, int], expected: np.ndarray) -> None:
    doc = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": list(X.shape), "data": X.ravel().tolist()}]
    }
    status, _, body = send(rest, "POST", f"/v2/models/{MODEL}/versions/1/infer", json.dumps(doc).encode())
    assert status == 200, body[:500]
    out = json.loads(body)["outputs"][0]
    np.testing.assert_allclose(
        np.array(out["data"], np.float32).reshape(out["shape"]), expected, rtol=1e-4, atol=1e-5
    )


def check_answer(path: str, status: int, content_type: str, body: bytes) -> None:
    assert status != 500 and status < 600, f"{status} for {path[:200]}: {body[:500]!r}"
    assert status < 500 or status == 503, f"{status} for {path[:200]}: {body[:500]!r}"
    if status < 400:
        return
    if len(path) > _MAX_LINE and status == 400:  # aiohttp's parser refuses the line; the app never sees it
        return
    if not body and (path.endswith("/ready") or path.startswith("/v2/health/")):
        assert status == 400  # Triton's "not ready" (or not live): no body
        return
    assert content_type.startswith("application/json"), (
        f"{status} {content_type} for {path[:200]}: {body[:300]!r}"
    )
    doc = json.loads(body)
    assert isinstance(doc, dict) and isinstance(doc.get("error"), str), doc
    assert_clear(doc["error"], f"({status} for {path[:100]})")


# --- strategies ------------------------------------------------------------------------------------------

_segment = st.one_of(
    st.just(MODEL),
    st.sampled_from(HOSTILE_NAMES).map(lambda s: quote(s, safe="")),
    st.sampled_from(["..", ".", "..%2f..%2fetc", "%2e%2e", "%00", "%ff", "%", "%zz", "~", "x" * 3000]),
    hostile_text(30).map(lambda s: quote(s, safe="")),
)
_tails = ("infer", "ready", "config", "stats", "", "infer/", "infer/x")


@st.composite
def paths(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["model", "version", "repository", "raw"]))
    model, tail = draw(_segment), draw(st.sampled_from(_tails))
    if kind == "model":
        return f"/v2/models/{model}/{tail}".rstrip("/") if tail else f"/v2/models/{model}"
    if kind == "version":
        return f"/v2/models/{model}/versions/{draw(_segment)}/{tail}".rstrip("/")
    if kind == "repository":
        return f"/v2/repository/models/{model}/{draw(st.sampled_from(['load', 'unload', 'x']))}"
    return "/" + "/".join(draw(st.lists(_segment, max_size=4)))


_json = hostile_json(max_size=4, max_leaves=10)
_datatypes = st.one_of(
    st.sampled_from(["FP32", "FP16", "BF16", "INT64", "INT8", "UINT8", "BOOL", "BYTES", "FP64"]), _json
)


@st.composite
def infer_docs(draw: st.DrawFn) -> dict[str, Any]:
    """An inference request, well formed for the demo MLP but for what is drawn hostile."""
    rows = draw(st.integers(0, 3))
    tensor: dict[str, Any] = {
        "name": draw(st.one_of(st.just("INPUT0"), _json)),
        "datatype": draw(st.one_of(st.just("FP32"), _datatypes)),
        "shape": draw(
            st.one_of(
                st.just([rows, 64]),
                st.lists(st.one_of(st.integers(-2, 70), st.integers(-(1 << 70), 1 << 70)), max_size=4),
                st.lists(st.integers(0, 2), min_size=60, max_size=100),  # past numpy's 64 dimensions
                st.tuples(st.just(0), st.integers(1 << 20, 1 << 62), st.integers(1 << 20, 1 << 62)).map(list),
                _json,
            )
        ),
        "data": draw(
            st.one_of(
                st.just(np.ones(rows * 64).tolist()),
                st.just(np.ones((rows, 64)).tolist()),
                st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=70),
                st.lists(st.sampled_from([1e39, -1e39, 3.4e38, 1e308]), max_size=70),  # past FP32's range
                st.lists(st.integers(-(1 << 70), 1 << 70), max_size=70),
                _json,
            )
        ),
    }
    for key in draw(st.lists(st.sampled_from(["data", "shape", "datatype", "name"]), max_size=1)):
        del tensor[key]
    if draw(st.booleans()):
        tensor["parameters"] = draw(
            st.one_of(
                st.fixed_dictionaries({"binary_data_size": _json}),
                st.fixed_dictionaries({"shared_memory_region": _json, "shared_memory_byte_size": _json}),
                _json,
            )
        )
    doc: dict[str, Any] = {"inputs": draw(st.one_of(st.just([tensor]), st.just([tensor, tensor]), _json))}
    if draw(st.booleans()):
        doc["parameters"] = draw(
            st.one_of(
                st.dictionaries(
                    st.sampled_from(
                        ["priority", "routing_key", "sequence_id", "sequence_start", "binary_data_output"]
                    ),
                    _json,
                    max_size=3,
                ),
                _json,
            )
        )
    if draw(st.booleans()):
        doc["outputs"] = draw(
            st.one_of(st.just([{"name": "OUTPUT0", "parameters": {"binary_data": True}}]), _json)
        )
    if draw(st.booleans()):
        doc["id"] = draw(_json)
    return doc


_header_lengths = st.one_of(
    st.sampled_from(["-1", "-0", "abc", "", " 5", "1e3", "0x10", "9" * 30, "1" * 5000, "3.5", "+4"]),
    st.integers(-100, 10_000).map(str),
    # any bytes HTTP allows in a field value (a control character is aiohttp's parser's plain 400)
    st.binary(max_size=8).filter(lambda b: all(c >= 0x20 and c != 0x7F for c in b)),
)


# --- the tests ---------------------------------------------------------------------------------------------


@fuzz_settings(50)
@given(
    method=st.sampled_from(["POST", "POST", "GET", "PUT", "DELETE"]),
    path=paths(),
    body=st.one_of(
        infer_docs().map(lambda d: json.dumps(d).encode()),
        _json.map(lambda d: json.dumps(d).encode()),
        st.binary(max_size=200),
    ),
)
def test_hostile_paths_and_bodies(mesh, rest, expected, method: str, path: str, body: bytes) -> None:  # type: ignore[no-untyped-def]
    before = model_health(mesh.router, MODEL)
    check_answer(path, *send(rest, method, path, body))
    probe(rest, expected)
    assert model_health(mesh.router, MODEL) == before, "client garbage counted as the model's error"


@fuzz_settings(40)
@given(doc=infer_docs(), binary=st.binary(max_size=600), length=st.one_of(st.none(), _header_lengths))
def test_hostile_bodies_and_binary_extension(mesh, rest, expected, doc, binary: bytes, length) -> None:  # type: ignore[no-untyped-def]
    head = json.dumps(doc).encode()
    headers = {} if length is None else {HEADER_LENGTH: length if isinstance(length, bytes) else str(length)}
    before = model_health(mesh.router, MODEL)
    path = f"/v2/models/{MODEL}/infer"
    check_answer(path, *send(rest, "POST", path, head + binary, headers))
    probe(rest, expected)
    assert model_health(mesh.router, MODEL) == before


def _doc(datatype: bytes, data: bytes) -> bytes:
    return (
        b'{"inputs": [{"name": "INPUT0", "datatype": '
        + datatype
        + b', "shape": [1, 64], "data": '
        + data
        + b"}]}"
    )


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"[" * 100_000, id="deep-list"),
        pytest.param(b'{"a":' * 50_000 + b"1" + b"}" * 50_000, id="deep-object"),
        pytest.param(_doc(b'"INT64"', b"[" + b"9" * 5000 + b"]"), id="5000-digit-int"),
        pytest.param(_doc(b'"FP32"', b"[" * 5000 + b"1" + b"]" * 5000), id="deep-data"),
        pytest.param(b"\xff\xfe\x00", id="not-utf8"),
        pytest.param(_doc(b'"FP32"', b"[1e400]"), id="number-past-float64"),
        # a 10 kB name quoted twice once made a 20 kB message (found by make chaos's fuzz run)
        pytest.param(
            b'{"inputs": [{"name": "' + b"x" * 10_000 + b'", "datatype": "' + b"x" * 10_000 + b'", '
            b'"shape": [0, 64], "data": []}]}',
            id="10k-name-and-datatype",
        ),
    ],
)  # fmt: skip
def test_known_hostile_bodies(mesh, rest, expected, body: bytes) -> None:  # type: ignore[no-untyped-def]
    path = f"/v2/models/{MODEL}/infer"
    status, content_type, answer = send(rest, "POST", path, body)
    assert status == 400
    check_answer(path, status, content_type, answer)
    probe(rest, expected)


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(b"POST /v2/models/\xc3\xa9/infer HTTP/1.1", id="raw-utf8-path"),
        pytest.param(b"POST /v2/models/" + b"x" * 20_000 + b"/infer HTTP/1.1", id="20k-path"),
        pytest.param(b"POST /v2/models/demo-mlp/infer HTTP/9.9", id="bad-version"),
        pytest.param(b"\x00\x01\x02", id="binary-line"),
    ],
)
def test_hostile_request_lines(mesh, rest, expected, line: bytes) -> None:  # type: ignore[no-untyped-def]
    """What http.client would not send: the router answers (aiohttp's own 400 for a line it cannot
    parse, in plain text: the app never sees it) and keeps serving."""
    with socket.create_connection(rest, timeout=15) as sock:
        sock.sendall(line + b"\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        answer = sock.recv(4096)
    status = int(answer.split(b" ", 2)[1])
    assert 400 <= status < 500, answer[:300]
    probe(rest, expected)
