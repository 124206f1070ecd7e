"""``CallContext`` is the whole surface a handler uses, and both transports offer it with grpc.aio's
signatures: grpc.aio's ``ServicerContext`` as it is, the native server's ``Context`` as itself (it is no
grpc.aio class). The conformance suite checks the behaviour behind each method on both servers."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Protocol

import grpc.aio
import pytest

from mcp_native.context import Context
from mcpcore.call_context import CallContext

ROOT = Path(__file__).resolve().parents[2]
METHODS = sorted(
    name for name in vars(CallContext) if not name.startswith("_") and callable(getattr(CallContext, name))
)


def _parameters(function: object) -> list[str]:
    return list(inspect.signature(function).parameters)  # type: ignore[arg-type]


def test_the_interface_names_what_the_services_call_on_a_context():
    called = set()
    for folder in ("services", "libs/core/mcpcore"):
        for path in (ROOT / folder).rglob("*.py"):
            called |= set(re.findall(r"(?<![.\w])context\.([a-z_]+)\(", path.read_text(encoding="utf-8")))
    # ssl.SSLContext's (the REST port's TLS), not a call's
    called -= {"load_cert_chain", "load_verify_locations"}
    assert called <= set(METHODS), f"handlers call {sorted(called - set(METHODS))}: add them to CallContext"
    assert {"invocation_metadata", "set_code", "set_details", "abort"} <= called  # the scan found them


@pytest.mark.parametrize("implementation", [grpc.aio.ServicerContext, Context], ids=["grpc.aio", "native"])
@pytest.mark.parametrize("name", METHODS)
def test_each_transport_offers_each_method_with_its_signature(implementation: type, name: str):
    ours, theirs = getattr(CallContext, name), getattr(implementation, name)
    assert _parameters(theirs) == _parameters(ours)
    assert inspect.iscoroutinefunction(theirs) == inspect.iscoroutinefunction(ours)


def test_the_native_context_is_no_grpc_aio_class():
    assert not issubclass(Context, grpc.aio.ServicerContext)
    assert Protocol not in Context.__mro__
