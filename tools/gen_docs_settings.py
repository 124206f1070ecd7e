"""The settings and ports pages of ``tools/gen_docs.py``, read from the services' config classes.

Every setting comes from ``mcpcore.config.describe``: the names operators type (YAML key, flag, env
variables) are the ones ``load_config`` reads, so the page cannot name a setting the loader does not know.
Help is the declaring class's ``#:`` comment for the field (the attribute doc-comment Sphinx reads).

Invariant: the page does not depend on the machine that builds it. A default chosen by the core count
(``Tuning.for_cores``) is shown for one core and for two or more, never for the builder's.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from typing import Any

from gen_docs_common import HEADER, SERVICES, table


def _shares(comment: str, first: str, name: str) -> bool:
    """Whether a field right below ``first`` (no blank line, no comment of its own) is documented by
    ``first``'s comment too: ``rest_host`` / ``rest_port``, or a comment that names it."""
    word = name.split("_", maxsplit=1)[0]
    words = set(re.findall(r"\w+", comment.lower()))
    return word == first.split("_", maxsplit=1)[0] or name in words or word in words


def doc_comments(cls: type) -> dict[str, str]:
    """``#:`` comment blocks by field: a block documents the field right below it, and the fields in the
    same run that it names (see ``_shares``)."""
    out: dict[str, str] = {}
    try:
        lines = inspect.getsource(cls).splitlines()[1:]
    except (OSError, TypeError):
        return out
    names = {f.name for f in dataclasses.fields(cls)}
    block: list[str] = []
    current, first = "", ""
    for line in lines:
        text = line.strip()
        if text.startswith("#:"):
            block = [*block, text[2:].strip()] if not current else [text[2:].strip()]
            current = ""
            continue
        match = re.match(r"\s{4}(\w+)\s*:", line)
        if match and match.group(1) in names:
            name = match.group(1)
            if block:
                current, first, block = " ".join(block), name, []
            elif current and not _shares(current, first, name):
                current = ""
            out[name] = current
            continue
        block, current = [], ""
    return out


def _fmt_default(value: Any) -> str:
    if isinstance(value, tuple):
        return ", ".join(str(v) for v in value) or '""'
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1 << 20 and value % (1 << 20) == 0:
        mib = value >> 20
        return f"{value} ({mib >> 10} GiB)" if mib % 1024 == 0 else f"{value} ({mib} MiB)"
    return repr(value)


def _default(owner: type, field: str, default: Any) -> str:
    if default is dataclasses.MISSING:
        return "required"
    for_cores = getattr(owner, "for_cores", None)
    if callable(for_cores):  # a default that follows the core count: both, not the builder's
        one, more = getattr(for_cores(1), field), getattr(for_cores(2), field)
        if one != more:
            return f"1 core: `{_fmt_default(one)}`; 2 or more: `{_fmt_default(more)}`"
        default = one
    return f"`{_fmt_default(default)}`"


def config_class(service: str) -> type:
    module = importlib.import_module(f"mcp_{service}.config")
    named = getattr(module, f"{service.capitalize()}Config", None)
    if named is None:
        raise SystemExit(f"mcp_{service}.config: no {service.capitalize()}Config class")
    return named


def service_settings(service: str) -> list[dict[str, str]]:
    """One row per setting of ``service``: YAML name, flags, env vars, default, declaring class, help."""
    from mcpcore.config import describe  # noqa: PLC0415

    rows = []
    for s in describe(config_class(service), f"MCP_{service.upper()}_"):
        meta = next(f.metadata for f in dataclasses.fields(s.owner) if f.name == s.field)
        flags = [s.flag]
        if isinstance(s.default, bool):  # add_flags gives booleans a BooleanOptionalAction
            flags.append("--no-" + s.flag[2:])
        rows.append({
            "name": s.name,
            "flags": ", ".join(f"`{f}`" for f in flags),
            "env": ", ".join(f"`{e}`" for e in s.env),
            "default": _default(s.owner, s.field, s.default),
            "owner": f"{s.owner.__name__}.{s.field}",
            "help": str(meta.get("help") or doc_comments(s.owner).get(s.field, "")) or "—",
        })  # fmt: skip
    return rows


def page_settings() -> str:
    out = [HEADER.format(src="mcpcore.config.describe over the config classes"), "# Settings\n\n"]
    out.append(
        "Every service builds one frozen config dataclass at start from, field by field, its defaults < "
        "the YAML file given by `--config` < environment variables < flags (`mcpcore.config`). A dotted "
        "YAML key is a nested mapping (`tls.ca_file` is "
        "`tls: {ca_file: ...}`, env `MCP_ROUTER_TLS__CA_FILE`, flag `--tls.ca-file`). The sections every "
        "service shares (`mcpcore.settings`: `EtcdSettings`, `GrpcServing`, `MetricsServing`, `Advertise`, "
        "`ProcessOptions`) keep flat names: `etcd_endpoints` sets `config.etcd.endpoints`. A setting with "
        "several env variables reads the first one set, the service's own first. A float setting whose "
        "name ends in `_s` is a duration and also takes `250ms`, `30s`, `5m`. An unknown YAML key or flag "
        "stops the service; an unknown variable under the service's prefix is ignored with one warning "
        "naming the closest setting. The `tuning` section's defaults follow the cores the process may use "
        "([Process tuning](../design/process-tuning.md)). Logs and tracing: "
        "[Operate](../guides/operate.md#logs-tracing-and-the-dashboard).\n\n"
    )
    for service in SERVICES:
        cls = config_class(service)
        out.append(
            f"## {service}\n\n`{cls.__module__}.{cls.__name__}`, env prefix `MCP_{service.upper()}_`.\n\n"
        )
        rows = [
            (f"`{r['name']}`", r["flags"], r["env"], r["default"], f"`{r['owner']}`", r["help"])
            for r in service_settings(service)
        ]
        out.append(table(("YAML key", "flag", "env", "default", "declared in", "what"), rows) + "\n")
    return "".join(out).rstrip() + "\n"


#: DESIGN.md section 13: (what, service, setting, the value the design names).
PORTS_SPEC = (
    ("router gRPC: mcpapi v1/v2 Route, Infer; KServe V2 `inference.GRPCInferenceService`",
     "router", "grpc_port", "8001"),
    ("router REST: KServe V2 / Open Inference Protocol HTTP (-1: off)", "router", "rest_port", "8000"),
    ("router metrics (`/metrics`, `/debug/snapshot`)", "router", "metrics_port", "9101"),
    ("router Triton metrics (Triton's metric names)", "router", "triton_metrics_port", "8002"),
    ("scheduler gRPC: mcpapi v1/v2 model control", "scheduler", "grpc_port", "50051"),
    ("scheduler metrics", "scheduler", "metrics_port", "9102"),
    ("health gRPC: `mcpapi.v2.Health`", "health", "grpc_port", "50053"),
    ("health metrics", "health", "metrics_port", "9103"),
    ("worker control gRPC: `mcpapi.v2.WorkerControl` (0: a free port, published in its record)",
     "worker", "grpc_port", "—"),
    ("worker tensors: ZeroMQ ROUTER", "worker", "zmq_bind", "—"),
    ("worker metrics (`make up`: 9110, 9111, ...)", "worker", "metrics_port", "9110+"),
    ("etcd client (`make up`; `MCP_ETCD_ENDPOINTS` overrides)", "router", "etcd_endpoints", "127.0.0.1:2379"),
)  # fmt: skip


def page_ports() -> str:
    settings = {s: {r["name"]: r for r in service_settings(s)} for s in SERVICES}
    rows = []
    for what, service, name, spec in PORTS_SPEC:
        row = settings[service].get(name)
        if row is None:  # named by the design, not built yet: the page says so rather than hiding it
            rows.append((what, service, f"`{name}`", "not a setting yet", "—", spec))
        else:
            rows.append((what, service, f"`{row['name']}`", row["default"], row["env"], spec))
    listed = {(s, n) for _, s, n, _ in PORTS_SPEC}
    for service in SERVICES:
        for name, row in sorted(settings[service].items()):
            is_port = name.endswith("_port") and row["default"] not in ("`True`", "`False`")
            if is_port and (service, name) not in listed:
                rows.append((row["help"], service, f"`{name}`", row["default"], row["env"], "—"))
    out = [HEADER.format(src="DESIGN.md section 13 and the config dataclasses"), "# Ports\n\n"]
    out.append(
        "DESIGN.md section 13 names these ports; users, scripts and tests rely on them. The default is read "
        "from the setting that holds it. Every service binds 127.0.0.1 unless told otherwise (`grpc_host`, "
        "`rest_host`, `metrics_host`) and publishes `advertise_host` in place of a wildcard bind. How "
        "`make up`, compose and Kubernetes assign them: [Deploy](../guides/deploy.md#ports).\n\n"
    )
    out.append(table(("what", "service", "setting", "default", "env", "DESIGN §13"), rows))
    return "".join(out).rstrip() + "\n"
