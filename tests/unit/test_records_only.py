"""No etcd value is decoded or encoded outside ``mcpcore.records`` (DESIGN.md section 4: one typed
definition per document, read and written only through it).

What this looks for, precisely: product modules (``libs/``, ``services/``, ``clients/``, ``tools/``, outside
``libs/core/mcpcore/records/``) that can see etcd values, meaning they import ``mcpcore.keys``,
``mcpcore.store``, ``mcpcore.mirror`` or ``mcpcore.etcd_store``; in them, every call of a JSON decoder
(``json.loads``/``json.load``, ``orjson.loads``, ``msgspec``, ``json.JSONDecoder``) or encoder
(``json.dumps``/``json.dump``, ``orjson.dumps``) is a finding, unless its enclosing function is in
``NOT_ETCD`` with the reason what it reads or writes is not an etcd value. The check is syntactic
(``ast``), so it is cheap and exact about what it counts; a module that handles etcd bytes without
importing any of those modules is outside its sight.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("libs", "services", "clients", "tools")
RECORDS = ROOT / "libs" / "core" / "mcpcore" / "records"
ETCD_MODULES = {"mcpcore.keys", "mcpcore.store", "mcpcore.mirror", "mcpcore.etcd_store"}
DECODERS = {("json", "loads"), ("json", "load"), ("orjson", "loads"), ("json", "JSONDecoder")}
ENCODERS = {("json", "dumps"), ("json", "dump"), ("orjson", "dumps")}

#: (path relative to the root, enclosing function) -> why what it decodes or encodes is not an etcd value
NOT_ETCD = {
    ("clients/mcpclient/debug_cmds.py", "_snapshot"): "a router's /debug/snapshot HTTP body",
    ("clients/mcpclient/debug_cmds.py", "dump_cmd"): "mcpctl's output on stdout",
    ("clients/mcpclient/cluster_cmds.py", "_watch"): "mcpctl's output on stdout",
    ("clients/mcpclient/ctlkit.py", "emit"): "mcpctl's output on stdout",
    ("libs/core/mcpcore/keyring.py", "write_keyring"): "the keyring file",
    ("services/worker/mcp_worker/models.py", "_write_checkpoint"): "the worker's checkpoint file",
    ("services/worker/mcp_worker/repository/manifest.py", "_dump"): "a model repository's manifest file",
    ("libs/core/mcpcore/keyring.py", "_parse_keyring"): "the keyring file (keys are never in etcd)",
    ("services/worker/mcp_worker/repository/manifest.py", "_json"): "a model repository's manifest file",
}


def _imports_etcd(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ETCD_MODULES:
            return True
        if isinstance(node, ast.Import) and any(a.name in ETCD_MODULES for a in node.names):
            return True
    return False


def _decoder(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        base = func.value
        name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
        if (name, func.attr) in DECODERS | ENCODERS or "msgspec" in ast.unparse(base):
            return ast.unparse(func)
    return None


def findings(path: Path) -> list[str]:
    """``path:line: call`` for each decode or encode of a possible etcd value in one module."""
    tree = ast.parse(path.read_text(), str(path))
    if not _imports_etcd(tree):
        return []
    rel = path.relative_to(ROOT).as_posix()
    out = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else where
            if isinstance(child, ast.Call) and (call := _decoder(child)) and (rel, where) not in NOT_ETCD:
                out.append(f"{rel}:{child.lineno}: {call}(...) in {where or 'module level'}")
            visit(child, inner)

    visit(tree, "")
    return out


def product_modules() -> list[Path]:
    files = [p for top in PRODUCT for p in (ROOT / top).rglob("*.py") if (ROOT / top).is_dir()]
    return sorted(p for p in files if RECORDS not in p.parents and "/tests/" not in p.as_posix())


def test_no_etcd_value_is_decoded_or_encoded_outside_records():
    found = [line for path in product_modules() for line in findings(path)]
    assert not found, "read and write etcd values through mcpcore.records:\n" + "\n".join(found)


def test_the_check_finds_a_decode_in_a_module_that_reads_etcd(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    bad = tmp_path / "services" / "x.py"
    bad.parent.mkdir()
    bad.write_text(
        "import json\nfrom mcpcore.mirror import PrefixMirror\n\n"
        "def read(mirror: PrefixMirror, key: str):\n    return json.loads(mirror.values[key])\n"
    )
    assert findings(bad) == ["services/x.py:5: json.loads(...) in read"]
    bad.write_text(
        "import json\nfrom mcpcore.store import Store\n\n"
        "async def write(store: Store, key: str, doc: dict):\n"
        "    await store.put(key, json.dumps(doc).encode())\n"
    )
    assert findings(bad) == ["services/x.py:5: json.dumps(...) in write"]
    bad.write_text("import json\n\ndef read(text):\n    return json.loads(text)\n")  # no etcd in sight
    assert findings(bad) == []


def test_the_allowance_names_functions_that_exist():
    for rel, function in NOT_ETCD:
        tree = ast.parse((ROOT / rel).read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        assert function in names, f"{rel}: {function} is gone; drop it from NOT_ETCD"
