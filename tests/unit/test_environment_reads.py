"""The process environment is read only by config modules (files named ``config.py``): product code
(``services/``, ``libs/``, ``clients/``) names ``os.environ`` / ``os.getenv`` nowhere else, so every
variable the mesh reads is a setting a config class or config module lists."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("services", "libs", "clients")
ENV_NAMES = frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"})
#: Files that may name the environment besides config modules, each with its reason (none today).
EXCEPTIONS: dict[str, str] = {}


def environment_reads(source: str) -> list[int]:
    """The lines of ``source`` that name the process environment through ``os``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ENV_NAMES:
            named = isinstance(node.value, ast.Name) and node.value.id == "os"
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            named = any(alias.name in ENV_NAMES for alias in node.names)
        else:
            continue
        if named:
            lines.append(node.lineno)
    return sorted(lines)


def test_the_check_finds_every_spelling():
    source = "import os\nfrom os import environ\na = os.environ['X']\nb = os.getenv('Y')\nos.environ.get('Z')"
    assert environment_reads(source) == [2, 3, 4, 5]
    assert environment_reads("import os\nos.path.join('a')\nenviron = {}\n") == []


def test_only_config_modules_read_the_environment():
    found = []
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if path.name == "config.py" or relative in EXCEPTIONS or "/build/" in relative:
                continue
            found += [f"{relative}:{line}" for line in environment_reads(path.read_text(encoding="utf-8"))]
    assert not found, (
        "read the environment through a config module (a field of the service's config class, "
        "or mcpcore.config.environment() from a config.py): " + ", ".join(found)
    )
