"""The metrics, protocol and errors pages of ``tools/gen_docs.py``: the surface clients and operators see.

- metrics: every ``mcpcore.metrics.Metrics`` subclass, built on a fresh registry while the definitions are
  recorded (a name defined in more than one module is listed apart);
- protocol: the services, methods and wire enums of the generated descriptors in ``libs/contracts``;
- errors: every ``MCPError`` class with its ``Code`` (``mcpcore.errors``), the gRPC status
  (``mcpcore.transport.grpc_status``) and the HTTP status (``mcpcore.transport.http_status``) it goes out as.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from typing import Any

from gen_docs_common import HEADER, PACKAGES, import_all, table

# --- metrics ---------------------------------------------------------------------------------------------


def collect_metrics() -> dict[str, list[dict[str, str]]]:
    """Every metric definition by name: kind, labels, help, the service class exporting it and the module
    that defines it (``mcpcore.metrics.STANDARD`` for the standard names)."""
    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    from mcpcore import metrics as m  # noqa: PLC0415

    for package in PACKAGES:
        import_all(package)
    found: dict[str, list[dict[str, str]]] = {}
    helpers = {"standard", "counter", "gauge", "histogram", "_make"}
    original = m.Metrics._make

    def leaves(cls: type) -> Iterator[type]:
        subs = cls.__subclasses__()
        if not subs:
            yield cls
        for sub in subs:
            yield from leaves(sub)

    for cls in sorted(set(leaves(m.Metrics)), key=lambda c: (c.__module__, c.__name__)):

        def record(
            self: Any,
            kind: type,
            name: str,
            doc: str,
            labels: tuple[str, ...],
            *,
            _cls: type = cls,
            **kw: Any,
        ) -> Any:
            frame = inspect.currentframe().f_back  # type: ignore[union-attr]
            standard = False
            while (
                frame is not None
                and frame.f_code.co_name in helpers
                and frame.f_globals["__name__"] == m.__name__
            ):
                standard = standard or frame.f_code.co_name == "standard"
                frame = frame.f_back
            where = f"{m.__name__}.STANDARD" if standard else (frame.f_globals["__name__"] if frame else "?")
            entry = {"kind": kind.__name__.lower(), "labels": ", ".join(labels), "doc": doc,
                     "owner": _cls.__name__, "where": where}  # fmt: skip
            found.setdefault(name, []).append(entry)
            return original(self, kind, name, doc, labels, **kw)

        m.Metrics._make = record  # type: ignore[method-assign]
        try:
            try:
                cls(CollectorRegistry())
            except TypeError:
                cls()
        finally:
            m.Metrics._make = original  # type: ignore[method-assign]
    return found


def page_metrics() -> str:
    found = collect_metrics()
    out = [HEADER.format(src="the services' Metrics classes"), "# Metrics\n\n"]
    out.append(
        "Every service serves Prometheus metrics on its `metrics_port` at `/metrics` (each on a registry of "
        "its own). Names follow `mcp_<what>_<unit>`: counters end in `_total`, durations in `_seconds`. The "
        "standard names (DESIGN.md section 10) are defined once in `mcpcore.metrics.STANDARD`; a service "
        "takes them from there.\n\n"
    )
    rows = []
    twice = []
    for name in sorted(found):
        defs = found[name]
        owners = sorted({d["owner"].rsplit(".", 1)[-1] for d in defs})
        shapes = {(d["kind"], d["labels"], d["doc"], d["where"]) for d in defs}
        first = defs[0]
        rows.append((f"`{name}`", first["kind"], first["labels"] or "—", first["doc"], ", ".join(owners)))
        if len(shapes) > 1:
            twice.append((name, sorted(shapes)))
    out.append(table(("metric", "type", "labels", "what", "exported by"), rows) + "\n")
    out.append("## Defined in more than one place\n\n")
    if not twice:
        out.append("None: every name has one definition.\n")
    for name, shapes in twice:
        out.append(f"- `{name}`:\n")
        out += [f"    - {kind} `{{{labels}}}` in `{where}`: {doc}\n" for kind, labels, doc, where in shapes]
    return "".join(out).rstrip() + "\n"


# --- protocol --------------------------------------------------------------------------------------------


def _pb2_modules() -> list[Any]:
    mods = []
    for package in ("mcpapi.v1", "mcpapi.v2", "mcpapi.kserve"):
        pkg = importlib.import_module(package)
        for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
            if info.name.endswith("_pb2"):
                mods.append(importlib.import_module(f"{package}.{info.name}"))
    return mods


def page_protocol() -> str:
    out = [HEADER.format(src="the generated descriptors in libs/contracts"), "# Protocol\n\n"]
    out.append(
        "The gRPC services of `protos/` (`mcpapi.v1`, `mcpapi.v2` and KServe V2's `inference`) as "
        "`make proto` generates them into `libs/contracts`. v1 is frozen (additive changes only); v2 is "
        "its superset; `inference` is KServe V2 / Triton's. Which port serves which service: "
        "[Ports](ports.md).\n\n"
    )
    for mod in _pb2_modules():
        fd = mod.DESCRIPTOR
        for svc in fd.services_by_name.values():
            out.append(f"## `{svc.full_name}`\n\nFrom `{fd.name}`.\n\n")
            rows = []
            for meth in svc.methods:
                stream = [
                    w
                    for w, on in (("client", meth.client_streaming), ("server", meth.server_streaming))
                    if on
                ]
                kind = " and ".join(stream) + " stream" if stream else "unary"
                types = (f"`{meth.input_type.full_name}`", f"`{meth.output_type.full_name}`")
                rows.append((f"`{meth.name}`", *types, kind))
            out.append(table(("method", "request", "response", "kind"), rows) + "\n")
    out.append("## Enums of the mesh's own contracts\n\n")
    for mod in _pb2_modules():
        fd = mod.DESCRIPTOR
        if not fd.package.startswith("mcpapi."):
            continue
        for enum in fd.enum_types_by_name.values():
            values = ", ".join(f"`{v.name}` = {v.number}" for v in enum.values)
            out.append(f"- `{enum.full_name}` (`{fd.name}`): {values}\n")
    return "".join(out).rstrip() + "\n"


# --- errors ----------------------------------------------------------------------------------------------


def page_errors() -> str:
    from mcpcore import errors  # noqa: PLC0415
    from mcpcore.transport.grpc_status import to_grpc  # noqa: PLC0415
    from mcpcore.transport.http_status import http_status  # noqa: PLC0415

    def family(cls: type) -> Iterator[type]:
        yield cls
        for sub in sorted(cls.__subclasses__(), key=lambda c: c.__name__):
            if sub.__module__ == errors.__name__:
                yield from family(sub)

    rows = []
    for cls in family(errors.MCPError):
        code = cls.code
        doc = (inspect.getdoc(cls) or "").split("\n\n")[0] if cls.__doc__ else ""
        rows.append((
            f"`{cls.__name__}`", f"`{code.name}` = {int(code)}", f"`{to_grpc(code).name}`",
            http_status(code), errors.error_class(cls("x")), "yes" if cls.retryable else "no", doc or "—",
        ))  # fmt: skip
    classed = {cls.code for cls in family(errors.MCPError)}
    others = [
        (f"`{code.name}` = {int(code)}", f"`{to_grpc(code).name}`", http_status(code))
        for code in errors.Code
        if code not in classed
    ]
    out = [HEADER.format(src="mcpcore.errors and mcpcore.transport"), "# Errors\n\n"]
    out.append(
        "Every error a client or an operator can act on is one `MCPError` class in `mcpcore.errors`, bound "
        "to one `Code`: the mesh's own enum with gRPC's canonical names and numbers, so one value names the "
        "error in a gRPC status, a ZeroMQ reply header (its number), an etcd document and a metric label "
        "(its name) ([Errors without transport](../design/errors-without-transport.md)). The transports map "
        "it: `mcpcore.transport.grpc_status` to the gRPC status (and back, the client table), "
        '`mcpcore.transport.http_status` to what the REST front door answers (`{"error": message}`, '
        "Triton's codes). The breaker class is what the breakers count it under (client errors never raise "
        "a breaker); only retryable errors are retried, and only for idempotent calls. A REST body over "
        "`rest_max_body_bytes` is 413 before it is parsed. A gRPC error whose request provably did not "
        "start carries the trailing metadata `mcp-not-started: true`.\n\n"
    )
    head = ("class", "code", "gRPC status", "HTTP", "breaker class", "retryable", "meaning")
    out.append(table(head, rows) + "\n")
    out.append("## Codes with no error class\n\nA peer may still answer them; they map so.\n\n")
    out.append(table(("code", "gRPC status", "HTTP"), others))
    return "".join(out).rstrip() + "\n"
