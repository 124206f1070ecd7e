"""The C tests of libs/native, through ``build.sh test``: once under ASan + UBSan, once under valgrind.

build.sh prints the test binary's "N passed, 0 failed" line after each section header, and "valgrind:
SKIPPED" instead of running valgrind when it is not installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

BUILD_SH = Path(__file__).resolve().parents[2] / "libs" / "native" / "build.sh"
ASAN_HEADER = "== C tests with AddressSanitizer + UndefinedBehaviorSanitizer"
VALGRIND_HEADER = "== C tests under valgrind"
PASSED = re.compile(r"^(\d+) passed, 0 failed$", re.MULTILINE)


@pytest.fixture(scope="module")
def c_tests() -> tuple[str, str]:
    """(ASan section, valgrind section) of a successful ``build.sh test`` run."""
    run = subprocess.run([str(BUILD_SH), "test"], capture_output=True, text=True, timeout=300, check=False)
    output = run.stdout + run.stderr
    assert run.returncode == 0, f"build.sh test failed ({run.returncode}):\n{output[-4000:]}"
    _, _, after_asan = run.stdout.partition(ASAN_HEADER)
    asan, _, valgrind = after_asan.partition(VALGRIND_HEADER)
    assert asan and valgrind, f"build.sh output lacks its section headers:\n{run.stdout}"
    return asan, valgrind


def test_c_tests_pass_under_asan_and_ubsan(c_tests: tuple[str, str]) -> None:
    asan, _ = c_tests
    match = PASSED.search(asan)
    assert match and int(match.group(1)) > 0, asan
    assert "asan: ok" in asan


def test_c_tests_pass_under_valgrind(c_tests: tuple[str, str]) -> None:
    _, valgrind = c_tests
    if shutil.which("valgrind") is None:
        assert "valgrind: SKIPPED" in valgrind
        pytest.skip("valgrind is not installed: the C tests ran only under ASan/UBSan")
    match = PASSED.search(valgrind)
    assert match and int(match.group(1)) > 0, valgrind
    assert "valgrind: ok" in valgrind


def test_a_build_runs_only_when_a_source_or_the_compiler_command_changed(tmp_path: Path) -> None:
    """``make native`` runs on every ``make up`` and ``make test``: a library that is current is kept (no
    compile), and a newer source or another compiler command builds it again."""
    native = BUILD_SH.parent
    copy = tmp_path / "native"
    for part in ("src", "include"):
        shutil.copytree(native / part, copy / part)
    shutil.copy2(BUILD_SH, copy / "build.sh")
    lib = copy / "build" / "libmcp_mempool.so"

    def build(**env: str) -> str:
        run = subprocess.run(
            [str(copy / "build.sh"), "pool"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, **env},
        )
        assert run.returncode == 0, run.stdout + run.stderr
        return run.stdout

    assert f"built {lib}" in build()
    built_at = lib.stat().st_mtime_ns
    assert f"up to date: {lib}" in build()
    assert lib.stat().st_mtime_ns == built_at

    header = copy / "include" / "mcp_mempool.h"
    earlier = header.stat().st_mtime - 10  # the header edited after the library was built
    os.utime(lib, (earlier, earlier))
    assert f"built {lib}" in build()
    assert f"up to date: {lib}" in build()
    assert f"built {lib}" in build(CC=shutil.which("cc") or "cc")  # another command: built again
