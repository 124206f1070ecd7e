"""The documentation's rules: the README is a front page, the changelog names the package's version, the
generated reference pages match the code, and every page is reachable from the site's nav.

Reads files only; the generated pages are rebuilt in-process by ``tools/gen_docs.py``'s own functions.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README_MAX_LINES = 300


def _gen_docs() -> Any:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "tools" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def newest_changelog_version(text: str) -> str | None:
    """The first ``## [X.Y.Z]`` heading (Keep a Changelog: newest first), ``Unreleased`` skipped."""
    for match in re.finditer(r"^## \[([^\]]+)\]", text, flags=re.M):
        if match.group(1).lower() != "unreleased":
            return match.group(1)
    return None


def nav_pages(nav: Any) -> set[str]:
    """Every page path in an mkdocs ``nav`` (strings, ``{title: page}`` and nested sections)."""
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return set().union(*(nav_pages(item) for item in nav)) if nav else set()
    if isinstance(nav, dict):
        return set().union(*(nav_pages(value) for value in nav.values())) if nav else set()
    return set()


def test_the_readme_is_a_front_page_of_at_most_300_lines() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move the detail to a page in docs/"
    )


def test_the_newest_changelog_version_is_the_packages_version() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    newest = newest_changelog_version((ROOT / "CHANGELOG.md").read_text(encoding="utf-8"))
    assert newest == project["version"], (
        f"CHANGELOG.md's newest version is {newest}, pyproject.toml says {project['version']}"
    )


def test_the_generated_reference_pages_are_current() -> None:
    gen_docs = _gen_docs()
    stale = gen_docs.stale(DOCS)
    assert stale == [], f"not current with the code: {', '.join(stale)}; {gen_docs.HINT}"


def test_every_page_in_docs_is_in_the_nav_and_every_nav_entry_exists() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["docs_dir"] == "docs"
    in_nav = nav_pages(config["nav"])
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert on_disk - in_nav == set(), f"pages missing from mkdocs.yml's nav: {sorted(on_disk - in_nav)}"
    assert in_nav - on_disk == set(), f"nav entries with no page: {sorted(in_nav - on_disk)}"


def test_the_settings_page_does_not_depend_on_the_cores_of_the_machine_that_builds_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mcpcore import tuning  # noqa: PLC0415

    gen_docs = _gen_docs()
    pages = []
    for cores in (1, 2, 16):
        monkeypatch.setattr(tuning, "available_cores", lambda cores=cores: cores)
        pages.append(gen_docs.PAGES["reference/settings.md"]())
    assert pages[0] == pages[1] == pages[2]


def test_every_setting_says_what_it_does() -> None:
    _gen_docs()  # puts tools/ on the path, where its page modules live
    settings = importlib.import_module("gen_docs_settings")
    bare = [
        f"{service}: {row['name']} ({row['owner']})"
        for service in settings.SERVICES
        for row in settings.service_settings(service)
        if row["help"] == "—"
    ]
    assert bare == [], f"settings with no `#:` comment in their config class: {bare}"
