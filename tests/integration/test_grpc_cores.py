"""The router process holds two gRPC cores, and they never meet.

Debian's grpc++ 1.51 serves the native front door (``mcp_native._frontdoor`` and the libgrpc* it links);
the grpcio wheel's core (``grpc._cython.cygrpc``, linked statically) runs grpc.aio servers and every
client. Each must bind only to its own symbols: if one core's code resolved a symbol of the other
(exported by the wrong library, or imported from it), two versions of grpc's internals would mix in one
process. The symbol tests read the ELF dynamic tables (``nm -D``); the load test runs both servers in one
process under mutual TLS, with concurrent clients (grpcio) of both and calls that cross from one core to
the other, and checks every answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import grpc
import grpc.aio
from grpc._cython import cygrpc

from mcp_devcluster.certs import make_certs
from mcp_native import _frontdoor
from mcp_native.grpc_server import NativeServer
from mcpcore.serving import GrpcService
from mcpcore.tls import TLSConfig
from mcpcore.transport.aio_server import AioServer

SERVICE = "t.Cores"
FRONTDOOR = Path(_frontdoor.__file__)
CYGRPC = Path(cygrpc.__file__)
#: The C and C++ runtimes both cores may share (one libc, one libstdc++ per process is the rule, not a clash).
RUNTIME = re.compile(r"/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*)\.so")


def _symbols(path: Path, which: str) -> set[str]:
    """``path``'s dynamic symbols, ``which`` "defined" or "undefined" (names without their versions)."""
    nm = shutil.which("nm")
    assert nm is not None, "nm (binutils) is needed to read the modules' symbol tables"
    out = subprocess.run(
        [nm, "-D", f"--{which}-only", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def _grpc_libraries(path: Path) -> list[Path]:
    """The shared libraries ``path`` loads (by ``ldd``), less the C and C++ runtimes."""
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=True).stdout
    found = [Path(m.group(1)) for m in re.finditer(r"=> (/\S+)", out)]
    return [lib for lib in found if not RUNTIME.search(str(lib))]


def test_the_two_modules_define_no_symbol_in_common():
    native, wheel = _symbols(FRONTDOOR, "defined"), _symbols(CYGRPC, "defined")
    assert "PyInit_cygrpc" in wheel
    assert native == {"PyInit__frontdoor"}  # hidden visibility and a version script (build.sh): nothing else
    assert native & wheel == set()


def test_grpcio_imports_nothing_the_native_grpc_libraries_define():
    libraries = _grpc_libraries(FRONTDOOR)
    assert any("libgrpc" in lib.name for lib in libraries), libraries  # the native core is there to check
    native_core: set[str] = set()
    for lib in libraries:
        native_core |= _symbols(lib, "defined")
    imported = _symbols(CYGRPC, "undefined")
    assert "PyBytes_FromStringAndSize" in imported  # the table was read
    assert imported & native_core == set()
    # and the native module takes nothing from the wheel's core
    assert _symbols(FRONTDOOR, "undefined") & _symbols(CYGRPC, "defined") == set()


def _certs(tmp_path: Path) -> Path:
    return make_certs(tmp_path / "certs", workers=[])


def _answer(request: bytes) -> bytes:
    return hashlib.sha256(request).digest() + request[::-1]


async def test_both_cores_serve_concurrent_tls_clients_in_one_process(tmp_path):
    certs = _certs(tmp_path)
    server_tls = TLSConfig(
        str(certs / "ca.pem"), str(certs / "mcp-router.pem"), str(certs / "mcp-router.key")
    )
    client_tls = TLSConfig(str(certs / "ca.pem"), str(certs / "admin.pem"), str(certs / "admin.key"))
    options = [("grpc.ssl_target_name_override", "localhost"), ("grpc.max_receive_message_length", 8 << 20)]

    async def answer(request: bytes, context) -> bytes:
        return _answer(request)

    services: dict[str, GrpcService] = {}
    ports: dict[str, int] = {}
    relay_to: list[grpc.aio.Channel] = []

    async def relay(request: bytes, context) -> bytes:
        """A call on one core that makes a call on the other (as the router's handlers call out)."""
        return await relay_to[0].unary_unary(f"/{SERVICE}/Answer")(request, timeout=30)

    for name, factory in (("native", NativeServer), ("aio", AioServer)):
        service = GrpcService(
            [SERVICE],
            server_factory=factory,
            tls=server_tls,
            options=[("grpc.max_send_message_length", 8 << 20)],
        )
        service.server.add_registered_method_handlers(
            SERVICE,
            {
                "Answer": grpc.unary_unary_rpc_method_handler(answer),
                "Relay": grpc.unary_unary_rpc_method_handler(relay),
            },
        )
        ports[name] = await service.start("127.0.0.1", 0)
        services[name] = service
    relay_to.append(
        grpc.aio.secure_channel(f"localhost:{ports['aio']}", client_tls.channel_credentials(), options)
    )

    calls = 0

    async def client(name: str, seed: int) -> None:
        nonlocal calls
        async with grpc.aio.secure_channel(
            f"localhost:{ports[name]}", client_tls.channel_credentials(), options
        ) as ch:
            for i in range(40):
                size = (seed * 7919 + i * 104729) % (200 << 10)  # 0 .. 200 KiB: small and zero-copy replies
                request = bytes([(seed + i) % 256]) * size
                method = "Relay" if name == "native" and i % 4 == 0 else "Answer"
                got = await ch.unary_unary(f"/{SERVICE}/{method}")(request, timeout=30)
                assert got == _answer(request), (name, seed, i)
                calls += 1

    try:
        # 8 clients of each server at once, each with its own connection
        await asyncio.wait_for(
            asyncio.gather(*(client(name, seed) for name in ("native", "aio") for seed in range(8))), 120
        )
    finally:
        await relay_to[0].close()
        for service in services.values():
            await service.stop(0.5)
    assert calls == 2 * 8 * 40
