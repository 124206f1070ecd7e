"""Packaging: ranges in pyproject.toml (the client installs beside other packages), exact versions in
constraints.txt (what ``make setup`` installs), and the two agree."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
EXACT_ON_PURPOSE = {"ruff"}  # a linter's rules change between releases


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirements() -> list[Requirement]:
    project = _project()
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra]
    return reqs


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[re.sub(r"[-_.]+", "-", name.lower())] = Version(version)
    return pins


def test_project_dependencies_are_ranges_not_pins() -> None:
    pinned = [
        str(r)
        for r in _requirements()
        if r.name not in EXACT_ON_PURPOSE and any(s.operator in ("==", "===") for s in r.specifier)
    ]
    assert pinned == [], f"pin these in constraints.txt, give pyproject.toml a range: {pinned}"


def test_every_dependency_has_an_exact_pin_inside_its_range() -> None:
    pins = _pins()
    for req in _requirements():
        name = re.sub(r"[-_.]+", "-", req.name.lower())
        assert name in pins, f"{req.name} has no exact version in constraints.txt (make constraints)"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {req.name}=={pins[name]}, outside pyproject's {req.specifier}"
        )


def test_make_setup_installs_with_the_constraints() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "-c constraints.txt" in makefile


def test_every_import_package_folder_is_in_the_wheel() -> None:
    """setuptools ships only the packages pyproject lists: a new subpackage left out works in the editable
    venv and is missing from the wheel (and so from the compose image)."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(tool["packages"])
    found = set()
    for top, folder in tool["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base).parts
            found.add(".".join((top, *rel)))
    assert found - listed == set(), f"add these to [tool.setuptools] packages: {sorted(found - listed)}"
    assert listed - found == set(), f"listed but not a package folder: {sorted(listed - found)}"
