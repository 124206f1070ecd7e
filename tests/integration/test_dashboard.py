"""The Grafana dashboard (deploy/grafana/mcpmesh.json): well formed, and every metric and label its panels
query is exported by a real mesh (etcd, a worker, a scheduler, a router and a health service) scraped over
HTTP after requests went through the router.

No Grafana runs here: the JSON model and these checks are what is tested. A metric counts as exported when
some service's ``/metrics`` has its ``# TYPE`` line (a labelled metric with no samples yet still has one);
``_bucket``/``_sum``/``_count`` belong to their histogram, which itself has no series of its own name.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml
from harness import ROOT, HealthProcess, metric, small_mesh, wait_for

from mcpapi.v2 import inference_pb2, inference_pb2_grpc
from mcpcore import dtypes
from mcpcore.metrics import STANDARD

DASHBOARD = ROOT / "deploy" / "grafana" / "mcpmesh.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
MODEL = "demo-mlp"
X = np.random.default_rng(3).random((2, 64), dtype=np.float32)

#: PromQL words that look like identifiers but name no metric (functions are told by their "(").
PROMQL_WORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or", "unless"}
    | {"inf", "nan"}
)
#: Labels Prometheus adds (job, instance) or that every histogram bucket has (le).
SCRAPE_LABELS = frozenset({"job", "instance", "le", "__name__"})
_SERIES_OF = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("", "_sum", "_count")}

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_VARIABLE = re.compile(r"\$\{?\w+\}?")
_MATCHERS = re.compile(r"\{([^{}]*)\}")
_MATCHER_LABEL = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")
_CLAUSE = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_IDENT = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?")
_LABEL_VALUES = re.compile(r"label_values\(\s*(?:(.*),)?\s*(\w+)\s*\)")
_TYPE = re.compile(r"^# TYPE (\S+) (\S+)$", re.MULTILINE)
_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s", re.MULTILINE)
_SAMPLE_LABEL = re.compile(r'(\w+)="(?:[^"\\]|\\.)*"')


# -- parsing PromQL and the exposition format ------------------------------------------------------------
def _bare(expr: str) -> str:
    """``expr`` with its strings emptied and Grafana's variables gone (``$model``, ``$__rate_interval``)."""
    return _VARIABLE.sub(" ", _STRING.sub('""', expr))


def queried_metrics(expr: str) -> set[str]:
    """The series names a PromQL expression selects: identifiers that are no function, keyword or label."""
    rest = _RANGE.sub(" ", _CLAUSE.sub(" ", _MATCHERS.sub(" ", _bare(expr))))
    return {m[1] for m in _IDENT.finditer(rest) if not m[2] and m[1].lower() not in PROMQL_WORDS}


def used_labels(expr: str) -> set[str]:
    """The label names an expression filters on (``{label=...}``) or groups and matches by."""
    bare = _bare(expr)
    labels = {m[1] for inner in _MATCHERS.findall(bare) for m in _MATCHER_LABEL.finditer(inner)}
    labels |= {name.strip() for inner in _CLAUSE.findall(bare) for name in inner.split(",")}
    return labels - {""}


def exported_types(text: str) -> dict[str, str]:
    """Metric family -> type, from the ``# TYPE`` lines of a Prometheus text exposition."""
    return {m[1]: m[2] for m in _TYPE.finditer(text)}


def family_of(series: str, types: dict[str, str]) -> str | None:
    """The exported family a series name belongs to (``x_bucket`` -> histogram ``x``), or None."""
    for family, kind in types.items():
        if series.startswith(family) and series.removeprefix(family) in _SERIES_OF.get(kind, ("",)):
            return family
    return None


def unexported(names: set[str], types: dict[str, str]) -> set[str]:
    return {name for name in names if family_of(name, types) is None}


def sample_labels(text: str, types: dict[str, str]) -> dict[str, set[str]]:
    """Family -> the label names its samples carry (families with no samples are absent)."""
    labels: dict[str, set[str]] = {}
    for m in _SAMPLE.finditer(text):
        family = family_of(m[1], types)
        if family is not None:
            labels.setdefault(family, set()).update(_SAMPLE_LABEL.findall(m[2] or ""))
    return labels


# -- the dashboard ---------------------------------------------------------------------------------------
def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def queries(dashboard: dict) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable's metric."""
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            match = _LABEL_VALUES.fullmatch(var["query"]["query"])
            assert match and match[1], f"variable {var['name']}: want label_values(<metric>, <label>)"
            yield f"variable {var['name']!r}", f"{match[1]}{{{match[2]}!=''}}"


def test_dashboard_is_well_formed() -> None:
    dashboard = load_dashboard()
    assert dashboard["schemaVersion"] >= 39 and dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    model = variables["model"]
    assert model["type"] == "query" and model["datasource"] == DATASOURCE
    assert re.fullmatch(r"label_values\(\w+, model\)", model["query"]["query"]), model["query"]
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {sorted(ids)}"
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        title = panel.get("title", "")
        assert title, f"panel {panel['id']} has no title"
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, f"{title!r} is wider than the dashboard"
        for cell in ((x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                     for y in range(grid["y"], grid["y"] + grid["h"])):  # fmt: skip
            assert cell not in cells, f"{title!r} overlaps {cells[cell]!r}"
            cells[cell] = title
        if panel["type"] == "row":
            assert not panel.get("targets"), f"row {title!r} has queries"
            continue
        assert len(panel.get("description", "")) > 40, f"{title!r}: say what to do when it looks wrong"
        assert panel["datasource"] == DATASOURCE, title
        targets = panel.get("targets", [])
        assert targets, f"{title!r} has no query"
        assert len({t["refId"] for t in targets}) == len(targets), f"{title!r}: refIds repeat"
        for target in targets:
            assert target.get("datasource", DATASOURCE) == DATASOURCE, title
            assert queried_metrics(target.get("expr", "")), f"{title!r} {target['refId']}: no metric"
            used = {v.strip("${}") for v in _VARIABLE.findall(target["expr"])}
            assert {v for v in used if not v.startswith("__")} <= set(variables), f"{title!r}: {used}"


def test_the_checker_reports_a_made_up_metric() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (model, le) (rate(mcp_made_up_seconds_bucket{model=~"$model", '
        'class!="client"}[$__rate_interval]))) / on (model) group_left max(mcp_real_ratio offset 5m) '
        "> bool 1e3"
    )
    assert queried_metrics(expr) == {"mcp_made_up_seconds_bucket", "mcp_real_ratio"}
    assert used_labels(expr) == {"model", "le", "class"}
    types = exported_types(
        "# TYPE mcp_real_ratio gauge\n# TYPE mcp_x_seconds histogram\n# TYPE mcp_y_total counter\n"
    )
    assert unexported(queried_metrics(expr), types) == {"mcp_made_up_seconds_bucket"}
    assert unexported({"mcp_x_seconds_bucket", "mcp_x_seconds_count", "mcp_y_total"}, types) == set()
    assert unexported({"mcp_x_seconds", "mcp_y"}, types) == {"mcp_x_seconds", "mcp_y"}  # no such series


def test_every_expr_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query (as a recording rule, Grafana's variables filled in)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed: make setup installs it")
    fill = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
    rules = []
    for i, (_, expr) in enumerate(queries(load_dashboard())):
        filled = expr
        for var, value in fill.items():
            filled = filled.replace(var, value)
        rules.append({"record": f"dashboard:query_{i}", "expr": _VARIABLE.sub(".*", filled)})
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", "rules.yml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


# -- against a real mesh ---------------------------------------------------------------------------------
def _request(x: np.ndarray) -> inference_pb2.InferRequest:
    dtype = dtypes.wire_value(dtypes.from_numpy(x.dtype))
    tensor = inference_pb2.Tensor(name="INPUT0", dtype=dtype, shape=x.shape, data=x.tobytes())
    return inference_pb2.InferRequest(model=MODEL, inputs=[tensor])


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory: pytest.TempPathFactory, etcd_endpoint: str, repo: Path) -> dict[str, str]:
    """Every service's /metrics, after good requests and a client error went through the router."""
    tmp = tmp_path_factory.mktemp("dashboard")
    with small_mesh(tmp, etcd_endpoint, repo, MODEL, ["1"]) as mesh:
        health = HealthProcess(tmp, etcd_endpoint, prefix=mesh.worker.prefix).start()
        try:
            stub = inference_pb2_grpc.InferenceStub(mesh.router.channel())
            for _ in range(5):
                stub.Infer(_request(X), timeout=10)
            with pytest.raises(grpc.RpcError) as info:  # a client error: labels an error class
                stub.Infer(_request(X.astype(np.float64)), timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            wait_for(
                lambda: "mcp_heartbeat_age_seconds{" in health.metrics_text(),
                what="the health service to report the worker's heartbeat age",
            )
            procs = {"router": mesh.router, "scheduler": mesh.scheduler, "worker": mesh.worker}
            texts = {name: proc.metrics_text() for name, proc in {**procs, "health": health}.items()}
        finally:
            health.stop()
    assert metric(texts["router"], "mcp_requests_total", model=MODEL, outcome="OK") == 5
    assert metric(texts["router"], "mcp_request_errors_total", model=MODEL, **{"class": "client"}) == 1
    return texts


def test_every_queried_metric_is_exported(scrapes: dict[str, str]) -> None:
    types: dict[str, str] = {}
    for name, text in scrapes.items():
        assert "# TYPE mcp_event_loop_lag_seconds histogram" in text, f"{name}: not a mcpmesh /metrics"
        types.update(exported_types(text))
    assert unexported({"mcp_dashboard_made_up_total"}, types) == {"mcp_dashboard_made_up_total"}
    missing = [
        f"{where}: {name}"
        for where, expr in queries(load_dashboard())
        for name in sorted(unexported(queried_metrics(expr), types))
    ]
    assert not missing, "metrics no service exports:\n" + "\n".join(missing)


def test_every_label_the_panels_use_exists(scrapes: dict[str, str]) -> None:
    """Each label a query filters or groups by is one of its metrics' labels: the defined ones
    (``mcpcore.metrics.STANDARD``) or those on scraped samples. A metric with neither (a labelled
    service-specific metric with no samples yet) cannot be checked, and is skipped."""
    types = {f: k for text in scrapes.values() for f, k in exported_types(text).items()}
    known: dict[str, set[str]] = {name: set(spec.labels) for name, spec in STANDARD.items()}
    for text in scrapes.values():
        for family, labels in sample_labels(text, types).items():
            known.setdefault(family, set()).update(labels)
    wrong = []
    for where, expr in queries(load_dashboard()):
        families = {family_of(name, types) for name in queried_metrics(expr)}
        have = set().union(*(known.get(f, set()) for f in families))
        if all(f in known for f in families):
            wrong += [f"{where}: {label}" for label in sorted(used_labels(expr) - SCRAPE_LABELS - have)]
    assert not wrong, "labels none of the queried metrics has:\n" + "\n".join(wrong)
