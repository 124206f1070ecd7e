"""The C tests of libs/native, through ``build.sh test``: once under ASan + UBSan, once under valgrind.

build.sh prints the test binary's "N passed, 0 failed" line after each section header, and "valgrind:
SKIPPED" instead of running valgrind when it is not installed.
"""

from __future__ import annotations

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
