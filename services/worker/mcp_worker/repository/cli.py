"""``python -m mcp_worker.repository``: publish, check or list a model repository."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mcp_worker.repository.manifest import check, publish
from mcp_worker.repository.model_repository import ModelRepository
from mcpcore.errors import MCPError

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mcp_worker.repository",
        description="Publish, check or list a model repository (README: remote model repositories).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("publish", help="write manifest.json for every version of a folder, then index.json")
    p.add_argument("dir", type=Path)
    c = sub.add_parser("check", help="say which files of a folder no longer match its manifests and index")
    c.add_argument("dir", type=Path)
    ls = sub.add_parser("list", help="the models and versions of a repository (folder or URL)")
    ls.add_argument("location")
    args = parser.parse_args(argv)
    try:
        if args.command == "publish":
            models = publish(args.dir)
            count = sum(len(v) for v in models.values())
            print(f"published {count} versions of {len(models)} models in {args.dir}")
            return 0
        if args.command == "check":
            problems = check(args.dir)
            for problem in problems:
                print(problem)
            print(f"{len(problems)} problems" if problems else f"{args.dir}: every file matches")
            return 1 if problems else 0
        for model, versions in ModelRepository(args.location).index().items():
            print(f"{model}: {' '.join(versions)}")
        return 0
    except MCPError as err:
        print(f"{parser.prog}: {err.message}", file=sys.stderr)
        return 1
