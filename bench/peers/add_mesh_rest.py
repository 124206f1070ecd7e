"""Give the ``../shared/peers`` harness's ``mesh`` peer a REST target: ``add_mesh_rest.py PEERS_COPY``.

The harness is shared and read-only; run this on a copy of it (its README: ``cp -r ../shared/peers ...``).
It adds to the mesh peer, beside its KServe gRPC target, an ``http`` target: ``POST
/v2/models/mlp/infer`` on the router's REST port (8000) with the KServe V2 JSON body (the one row as a
JSON list, as ``curl`` users send it), checked against the harness's own answer like every other target.
The edit is idempotent and refuses to guess: if the harness's mesh entry is not the one this script
knows, it stops and says so.
"""

from __future__ import annotations

import sys
from pathlib import Path

MARK = "# mcpmesh bench/peers/add_mesh_rest.py"
_GRPC = " " * 23 + '"/inference.GRPCInferenceService/ModelInfer", triton_request(), triton_decode)'
_END = " " * 12 + "stop_sig=signal.SIGTERM, post_stop=None, startup_timeout=240, version=None)"
KNOWN = f"{_GRPC}],\n{_END}"
ADDED = (
    f"{_GRPC},\n"
    f'                     T("http", "http", "127.0.0.1:8000", "/v2/models/mlp/infer",  {MARK}\n'
    "                       kserve_json_request(), kserve_json_decode)],\n"
    f"{_END}"
)
CODECS = f"""

def kserve_json_request() -> bytes:  {MARK}
    return json.dumps({{"inputs": [{{"name": "INPUT", "shape": [1, 64], "datatype": "FP32",
                                   "data": [float(v) for v in X.reshape(-1)]}}]}}).encode()


def kserve_json_decode(buf: bytes) -> np.ndarray:  {MARK}
    return np.asarray(json.loads(buf)["outputs"][0]["data"], dtype=np.float32)
"""
ANCHOR = "\n\n# ----------------------------------------------------------------------------- targets"


def patch(bench_py: Path) -> bool:
    """Patch the harness's common/bench.py; False if it already was."""
    text = bench_py.read_text()
    if MARK in text:
        return False
    if KNOWN not in text or ANCHOR not in text:
        raise SystemExit(f"{bench_py}: the mesh peer's entry is not the one this adapter knows; update it")
    text = text.replace(KNOWN, ADDED, 1).replace(ANCHOR, CODECS + ANCHOR, 1)
    bench_py.write_text(text)
    return True


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    target = Path(sys.argv[1]) / "common" / "bench.py"
    print(f"{target}: {'patched' if patch(target) else 'already patched'}")
