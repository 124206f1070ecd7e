"""Give the ``../shared/peers`` harness more mcpmesh targets: ``add_mesh_targets.py PEERS_COPY``.

The harness is shared and read-only; run this on a copy of it (its README: ``cp -r ../shared/peers ...``).

- The ``mesh`` peer gains, beside its KServe gRPC target, an ``http`` target: ``POST /v2/models/mlp/infer``
  on the router's REST port (8000) with the KServe V2 JSON body (the one row as a JSON list, as ``curl``
  users send it).
- A new peer ``mesh_direct`` (the same cluster, started the same way) is driven through the SDK's direct
  ZeroMQ path: ``AsyncMeshClient("127.0.0.1:8001").infer("mlp", {"INPUT": row}, direct=True)``. Its load
  generator is the mesh checkout's own Python (``$MESH_DIR/.venv/bin/python``: the SDK and its
  dependencies live there), the same ``common/bench.py`` closed loop; every other peer keeps the
  harness's ``venv-load``.

Every answer is checked against the harness's own like every other target's. The edit is idempotent and
refuses to guess: if the harness's code is not the one this script knows, it stops and says so.
"""

from __future__ import annotations

import sys
from pathlib import Path

MARK = "# mcpmesh bench/peers/add_mesh_targets.py"
_GRPC = " " * 23 + '"/inference.GRPCInferenceService/ModelInfer", triton_request(), triton_decode)'
_END = " " * 12 + "stop_sig=signal.SIGTERM, post_stop=None, startup_timeout=240, version=None)"

# (what the harness has, what it gets), each applied once, in order
BENCH_EDITS = (
    (  # the REST target of the mesh peer
        f"{_GRPC}],\n{_END}",
        f"{_GRPC},\n"
        f'                     T("http", "http", "127.0.0.1:8000", "/v2/models/mlp/infer",  {MARK}\n'
        "                       kserve_json_request(), kserve_json_decode)],\n"
        f"{_END}",
    ),
    (  # the mesh_direct peer: the mesh's cluster, one target driven by the SDK
        '    if peer == "custom":\n',
        f'    if peer == "mesh_direct":  {MARK}\n'
        '        spec = peer_spec("mesh", mode)\n'
        '        spec["targets"] = [T("direct", "mesh_direct", "127.0.0.1:8001", "mlp", X, raw_decode)]\n'
        "        return spec\n"
        '    if peer == "custom":\n',
    ),
    (
        "        self.ch = self.sess = None\n",
        f"        self.ch = self.sess = self.mesh = None  {MARK}\n",
    ),
    (
        "    async def __aenter__(self):\n",
        "    async def __aenter__(self):\n"
        f'        if self.t["kind"] == "mesh_direct":  {MARK}\n'
        "            from mcpclient import AsyncMeshClient\n"
        '            self.mesh = AsyncMeshClient(self.t["addr"], timeout=10)\n'
        "            return self\n",
    ),
    (
        "    async def __aexit__(self, *a):\n",
        "    async def __aexit__(self, *a):\n"
        f"        if self.mesh is not None:  {MARK}\n"
        "            await self.mesh.close()\n",
    ),
    (
        "    async def call(self):\n",
        "    async def call(self):\n"
        f"        if self.mesh is not None:  {MARK}\n"
        '            out = await self.mesh.infer(self.t["path"], {"INPUT": self.t["req"]}, direct=True)\n'
        '            return out["OUTPUT"].tobytes()\n',
    ),
)
CODECS = f"""

def kserve_json_request() -> bytes:  {MARK}
    return json.dumps({{"inputs": [{{"name": "INPUT", "shape": [1, 64], "datatype": "FP32",
                                   "data": [float(v) for v in X.reshape(-1)]}}]}}).encode()


def kserve_json_decode(buf: bytes) -> np.ndarray:  {MARK}
    return np.asarray(json.loads(buf)["outputs"][0]["data"], dtype=np.float32)
"""
ANCHOR = "\n\n# ----------------------------------------------------------------------------- targets"
RUN_ALL_EDITS = (
    (
        "LOADPY=$ROOT/venv-load/bin/python\n",
        "LOADPY=$ROOT/venv-load/bin/python\n"
        f"{MARK}: the SDK peer is loaded by the mesh checkout's Python (the SDK lives there)\n"
        'loadpy_of() { case $1 in mesh_direct) echo "${MESH_DIR:?set MESH_DIR}/.venv/bin/python";; '
        '*) echo "$LOADPY";; esac; }\n',
    ),
    (
        '900 "$LOADPY" "$ROOT/common/bench.py" run --peer "$p"',
        '900 "$(loadpy_of "$p")" "$ROOT/common/bench.py" run --peer "$p"',
    ),
)


def _apply(path: Path, edits: tuple[tuple[str, str], ...], extra: tuple[str, str] | None = None) -> bool:
    text = path.read_text()
    if MARK in text:
        return False
    for known, _ in (*edits, *([extra] if extra else [])):
        if text.count(known) != 1:
            raise SystemExit(f"{path}: the harness's code is not the one this adapter knows; update it")
    for known, new in (*edits, *([extra] if extra else [])):
        text = text.replace(known, new, 1)
    path.write_text(text)
    return True


def patch(copy: Path) -> dict[str, bool]:
    """Patch a harness copy's common/bench.py and run_all.sh; False for a file that already was."""
    return {
        "common/bench.py": _apply(copy / "common" / "bench.py", BENCH_EDITS, (ANCHOR, CODECS + ANCHOR)),
        "run_all.sh": _apply(copy / "run_all.sh", RUN_ALL_EDITS),
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    for name, patched in patch(Path(sys.argv[1])).items():
        print(f"{sys.argv[1]}/{name}: {'patched' if patched else 'already patched'}")
