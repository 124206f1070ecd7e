"""REST figures for ``make bench``: the router's KServe V2 HTTP front door against a one-hop server built
on the same HTTP library (aiohttp) serving the same model, driven by one closed-loop load generator.

Both sides get the same request: ``POST /v2/models/bench-mlp/infer`` with the binary tensor extension
(``Inference-Header-Content-Length`` bytes of JSON, then the 256 bytes of the FP32 [1, 64] row), asking for
the output in binary (``binary_data_output``), as tritonclient.http sends it by default.

    python bench/rest_bench.py serve            # the one-hop server; prints READY <port>
    python bench/rest_bench.py load HOST:PORT MODEL CONC SECONDS   # prints one JSON line
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
from aiohttp import web
from peer_model import weights

BENCH = Path(__file__).resolve().parent
HEADER = "Inference-Header-Content-Length"
TIMEOUT_S = 10.0


def request_body(model_input: np.ndarray) -> tuple[bytes, dict[str, str]]:
    header = json.dumps({
        "inputs": [{"name": "INPUT", "shape": list(model_input.shape), "datatype": "FP32",
                    "parameters": {"binary_data_size": model_input.nbytes}}],
        "parameters": {"binary_data_output": True},
    }).encode()  # fmt: skip
    return header + model_input.tobytes(), {
        HEADER: str(len(header)),
        "Content-Type": "application/octet-stream",
    }


# -- the one-hop server -----------------------------------------------------------------------------------


def one_hop_app() -> web.Application:
    w = weights()

    async def infer(request: web.Request) -> web.Response:
        body = await request.read()
        size = int(request.headers[HEADER])
        spec = json.loads(body[:size])["inputs"][0]
        x = np.frombuffer(body, np.float32, offset=size).reshape(spec["shape"])
        hidden = np.maximum(x @ w["fc1.weight"] + w["fc1.bias"], 0)
        y = (hidden @ w["fc2.weight"] + w["fc2.bias"]).astype(np.float32)
        out = json.dumps({
            "model_name": request.match_info["model"], "model_version": "1",
            "outputs": [{"name": "OUTPUT", "datatype": "FP32", "shape": list(y.shape),
                         "parameters": {"binary_data_size": y.nbytes}}],
        }).encode()  # fmt: skip
        headers = {HEADER: str(len(out)), "Content-Type": "application/octet-stream"}
        return web.Response(body=out + y.tobytes(), headers=headers)

    app = web.Application()
    app.router.add_post("/v2/models/{model}/infer", infer)
    return app


async def serve() -> None:
    runner = web.AppRunner(one_hop_app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(f"READY {site._server.sockets[0].getsockname()[1]}", flush=True)  # type: ignore[union-attr]
    await asyncio.Event().wait()


# -- the load generator -----------------------------------------------------------------------------------


async def load(target: str, model: str, conc: int, seconds: float) -> dict[str, float]:
    body, headers = request_body(np.random.default_rng(0).random((1, 64), dtype=np.float32))
    url = f"http://{target}/v2/models/{model}/infer"
    ok: list[float] = []
    errors = 0
    measuring = False
    stop_at = time.perf_counter() + 0.5 + seconds
    connector = aiohttp.TCPConnector(limit=conc)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)
    ) as http:

        async def client() -> None:
            nonlocal errors
            while time.perf_counter() < stop_at:
                start = time.perf_counter()
                try:
                    async with http.post(url, data=body, headers=headers) as response:
                        answer = await response.read()
                        good = response.status == 200 and int(response.headers.get(HEADER, "0")) < len(answer)
                except (aiohttp.ClientError, TimeoutError):
                    good = False
                if measuring:
                    if good:
                        ok.append(time.perf_counter() - start)
                    else:
                        errors += 1

        work = [asyncio.create_task(client()) for _ in range(conc)]
        await asyncio.sleep(0.5)  # warm-up
        measuring, started = True, time.perf_counter()
        await asyncio.gather(*work)
        elapsed = time.perf_counter() - started
    latencies = np.array(ok) * 1e3 if ok else np.zeros(1)
    return {"rps": len(ok) / elapsed, "p99_ms": float(np.percentile(latencies, 99)), "errors": errors}


def _load(target: str, model: str, conc: int, seconds: float) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, str(BENCH / "rest_bench.py"), "load", target, model, str(conc), str(seconds)],
        capture_output=True, text=True, check=True, timeout=seconds + 60,
    )  # fmt: skip
    return json.loads(out.stdout)


def bench_rest(router_rest: str, model: str, seconds: float, conc: int = 64) -> dict[str, float]:
    """The REST figures at ``conc`` in flight: the router's front door (``router_rest``: HOST:PORT), then
    the one-hop aiohttp server started here."""
    mesh = _load(router_rest, model, conc, seconds)
    server = subprocess.Popen(
        [sys.executable, str(BENCH / "rest_bench.py"), "serve"], stdout=subprocess.PIPE, text=True
    )
    try:
        line = server.stdout.readline().split()  # type: ignore[union-attr]
        if line[:1] != ["READY"]:
            raise RuntimeError(f"the one-hop REST server did not start (it printed {line!r})")
        base = _load(f"127.0.0.1:{line[1]}", model, conc, seconds)
    finally:
        server.kill()
        server.wait(10)
    ratio = mesh["rps"] / max(base["rps"], 1)
    print(
        f"REST (KServe V2 HTTP, binary tensors) -> router -> worker, c={conc}: {mesh['rps']:,.0f} req/s, "
        f"p99 {mesh['p99_ms']:.1f} ms, {mesh['errors']} errors | one-hop aiohttp + numpy: {base['rps']:,.0f} "
        f"req/s, p99 {base['p99_ms']:.1f} ms -> {ratio:.2f}x (target >= 1.0x)"
    )
    return {
        f"e2e_rest_rps_c{conc}": round(mesh["rps"]),
        f"e2e_rest_p99_ms_c{conc}": round(mesh["p99_ms"], 2),
        f"e2e_rest_errors_c{conc}": mesh["errors"],
        f"rest_one_hop_rps_c{conc}": round(base["rps"]),
        f"e2e_rest_vs_one_hop_c{conc}": round(ratio, 2),
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        asyncio.run(serve())
    elif sys.argv[1:2] == ["load"] and len(sys.argv) == 6:
        print(json.dumps(asyncio.run(load(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])))))
    else:
        raise SystemExit(__doc__)
