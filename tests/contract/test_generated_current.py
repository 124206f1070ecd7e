"""The committed code in libs/contracts/ is what protos/ generates, and the checker notices when it is not."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GEN = ROOT / "tools" / "gen_protos.py"
CONTRACTS = ROOT / "libs" / "contracts"


def _gen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GEN), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_committed_code_is_current() -> None:
    proc = _gen("--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _copy_contracts(dest: Path) -> Path:
    shutil.copytree(CONTRACTS, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_check_lists_every_drift(tmp_path: Path) -> None:
    out = _copy_contracts(tmp_path / "contracts")
    with (out / "mcpapi/v1/control_pb2.py").open("a") as f:
        f.write("# edited by hand\n")
    (out / "mcpapi/v2/model_pb2.pyi").unlink()
    (out / "mcpapi/v2/stale_pb2.py").write_text("")

    proc = _gen("--check", "--out", str(out))

    assert proc.returncode == 1
    assert "differs: mcpapi/v1/control_pb2.py" in proc.stderr
    assert "missing: mcpapi/v2/model_pb2.pyi" in proc.stderr
    assert "extra:   mcpapi/v2/stale_pb2.py" in proc.stderr
    assert "run `make proto` and commit" in proc.stderr


def test_generate_repairs_drift_and_keeps_package_docstrings(tmp_path: Path) -> None:
    out = _copy_contracts(tmp_path / "contracts")
    (out / "mcpapi/v2/control_pb2_grpc.py").write_text("broken")
    (out / "mcpapi/v1/inference_pb2.py").unlink()
    (out / "mcpapi/v1/old_pb2.py").write_text("")
    docstring = (out / "mcpapi/__init__.py").read_text()

    assert _gen("--out", str(out)).returncode == 0

    proc = _gen("--check", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert not (out / "mcpapi/v1/old_pb2.py").exists()
    assert (out / "mcpapi/__init__.py").read_text() == docstring


def test_generation_into_an_empty_tree_is_complete(tmp_path: Path) -> None:
    out = tmp_path / "fresh"
    assert _gen("--out", str(out)).returncode == 0
    for package in ("mcpapi", "mcpapi/v1", "mcpapi/v2", "mcpapi/kserve"):
        assert (out / package / "__init__.py").is_file()
    # The committed tree has a docstring in mcpapi/__init__.py; everything else must be identical.
    assert _gen("--check", "--out", str(out)).returncode == 0
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == sorted(
        p.relative_to(CONTRACTS) for p in CONTRACTS.rglob("*") if "__pycache__" not in p.parts
    )
