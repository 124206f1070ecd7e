#!/usr/bin/env python3
"""Generate the Python contracts (`make proto`) and check that the committed ones are current.

Runs grpc_tools' protoc over every .proto under protos/ (sorted, one invocation) with `-Iprotos`, so the
proto path is the Python import path (`mcpapi/v2/control.proto` -> `mcpapi.v2.control_pb2`) and no
import rewriting is needed. Writes `*_pb2.py`, `*_pb2.pyi` and, for files that define a service,
`*_pb2_grpc.py` into libs/contracts/.

Invariants:
- libs/contracts/ holds generated code only. Generated files are replaced whole, stale ones (their
  .proto is gone) are deleted, and `__init__.py` / `py.typed` are created when missing, never rewritten
  (mcpapi/__init__.py carries a docstring).
- The output is a pure function of protos/ and the pinned grpcio-tools, so `--check` can regenerate into
  a temporary directory and demand byte-for-byte equality; CI runs it.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

try:
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc
except ImportError as exc:  # a bare interpreter: say which one to use
    raise SystemExit(f"{exc}: run `make proto` or .venv/bin/python tools/gen_protos.py") from None

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"
OUT_DIR = ROOT / "libs" / "contracts"

GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
MARKERS = ("__init__.py", "py.typed")
IGNORED_DIRS = frozenset({"__pycache__"})
HINT = "run `make proto` and commit"


def find_protos(proto_dir: Path = PROTO_DIR) -> list[Path]:
    """Every .proto under proto_dir, sorted so the protoc invocation is the same on every machine."""
    return sorted(proto_dir.rglob("*.proto"))


def generate(out_dir: Path, proto_dir: Path = PROTO_DIR) -> None:
    """Generate code for every proto into out_dir (which should be empty), with markers."""
    protos = find_protos(proto_dir)
    if not protos:
        raise SystemExit(f"no .proto files under {proto_dir}")
    well_known = resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory() as scratch:
        descriptor_set = Path(scratch) / "descriptors.pb"
        args = [
            "grpc_tools.protoc",
            f"-I{proto_dir}",
            f"-I{well_known}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            f"--descriptor_set_out={descriptor_set}",
            *(str(p) for p in protos),
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed (see the messages above)")
        _drop_empty_grpc_modules(out_dir, descriptor_set)
    _add_markers(out_dir)


def _drop_empty_grpc_modules(out_dir: Path, descriptor_set: Path) -> None:
    # protoc writes a *_pb2_grpc.py for every file; for a file without services it holds only a
    # version check, so it would be noise in the tree and in reviews.
    files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set.read_bytes())
    for proto in files.file:
        if not proto.service:
            (out_dir / (proto.name.removesuffix(".proto") + "_pb2_grpc.py")).unlink(missing_ok=True)


def _add_markers(out_dir: Path) -> None:
    # Every folder holding generated code is a package; each top-level package is marked typed.
    package_dirs = {p.parent for p in out_dir.rglob("*_pb2.py")}
    for pkg in list(package_dirs):
        package_dirs.update(parent for parent in pkg.parents if out_dir in parent.parents)
    for pkg in sorted(package_dirs):
        (pkg / "__init__.py").touch()
        if pkg.parent == out_dir:
            (pkg / "py.typed").touch()


def _tree(root: Path) -> dict[str, Path]:
    """Relative posix path -> path for every file under root, skipping caches."""
    files = {}
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if path.is_file() and not IGNORED_DIRS.intersection(rel.parts) and path.suffix != ".pyc":
            files[rel.as_posix()] = path
    return files


def _is_marker(rel: str) -> bool:
    return rel.rsplit("/", 1)[-1] in MARKERS


def compare(fresh: Path, committed: Path) -> list[str]:
    """Problems that make `committed` differ from the freshly generated tree, one line each."""
    new, old = _tree(fresh), _tree(committed)
    problems = []
    for rel in sorted(new.keys() | old.keys()):
        if rel not in old:
            problems.append(f"missing: {rel}")
        elif rel not in new:
            problems.append(f"extra:   {rel}")
        elif not _is_marker(rel) and not filecmp.cmp(new[rel], old[rel], shallow=False):
            # Markers only have to exist: __init__.py may carry a docstring.
            problems.append(f"differs: {rel}")
    return problems


def sync(fresh: Path, committed: Path) -> list[str]:
    """Make `committed` match `fresh`: write new and changed files, delete stale generated ones."""
    new, old = _tree(fresh), _tree(committed)
    changes = []
    for rel, src in sorted(new.items()):
        dst = committed / rel
        if rel in old and (_is_marker(rel) or filecmp.cmp(src, dst, shallow=False)):
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        changes.append(f"wrote   {rel}")
    for rel in sorted(old.keys() - new.keys()):
        if rel.endswith(GENERATED_SUFFIXES):
            old[rel].unlink()
            changes.append(f"removed {rel}")
    return changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--check", action="store_true", help="compare with the committed code instead of writing it"
    )
    parser.add_argument(
        "--out", type=Path, default=OUT_DIR, help="generated code root (default: libs/contracts)"
    )
    args = parser.parse_args(argv)
    out_dir: Path = args.out.resolve()

    with tempfile.TemporaryDirectory(prefix="mcp-protos-") as tmp:
        fresh = Path(tmp)
        generate(fresh)
        if args.check:
            problems = compare(fresh, out_dir)
            if problems:
                print(f"generated code in {out_dir} is not current:", file=sys.stderr)
                for line in problems:
                    print(f"  {line}", file=sys.stderr)
                print(HINT, file=sys.stderr)
                return 1
            print(f"generated code in {out_dir} is current")
            return 0
        out_dir.mkdir(parents=True, exist_ok=True)
        changes = sync(fresh, out_dir)
    for line in changes:
        print(line)
    print(f"{len(changes)} file(s) changed in {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
