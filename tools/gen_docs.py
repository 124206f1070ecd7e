#!/usr/bin/env python3
"""Generate the documentation pages that mirror the code, or check that the committed ones are current.

    python tools/gen_docs.py            # write docs/reference/*.md and docs/performance.md
    python tools/gen_docs.py --check    # exit 1 naming every page that differs from what the code gives

Each page is read from the code where the code is the truth, one module per page family:

- ``gen_docs_settings``: settings (``mcpcore.config.describe`` over every service's config class) and
  ports (DESIGN.md section 13's table, each default read from the setting that holds it);
- ``gen_docs_api``: metrics (the services' ``Metrics`` classes), protocol (the generated descriptors in
  ``libs/contracts``) and errors (``mcpcore.errors`` and ``mcpcore.transport``);
- ``gen_docs_perf``: performance, from ``bench/results.json``, each figure beside its baseline.

Invariants: the output is a pure function of the code and bench/results.json (sorted, no clock, no host
name, no core count), so ``--check`` compares text; a page the generator cannot build (a module that does
not import, a port setting that is gone) fails loudly instead of writing a thinner page.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the page modules beside this file

from gen_docs_api import page_errors, page_metrics, page_protocol
from gen_docs_perf import page_performance
from gen_docs_settings import page_ports, page_settings

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
HINT = "run `.venv/bin/python tools/gen_docs.py` and commit the pages"

PAGES: dict[str, Callable[[], str]] = {
    "reference/settings.md": page_settings,
    "reference/metrics.md": page_metrics,
    "reference/protocol.md": page_protocol,
    "reference/errors.md": page_errors,
    "reference/ports.md": page_ports,
    "performance.md": page_performance,
}


def generate() -> dict[str, str]:
    """Every generated page's path (under docs/) to its text."""
    return {path: build() for path, build in PAGES.items()}


def stale(docs: Path = DOCS, pages: dict[str, str] | None = None) -> list[str]:
    """The pages whose committed text differs from what the code generates now."""
    pages = generate() if pages is None else pages
    out = []
    for rel, text in sorted(pages.items()):
        path = docs / rel
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            out.append(rel)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed pages; write none")
    args = parser.parse_args(argv)
    pages = generate()
    if args.check:
        bad = stale(DOCS, pages)
        if bad:
            print("documentation pages are not current with the code:", file=sys.stderr)
            for rel in bad:
                print(f"  docs/{rel}", file=sys.stderr)
            print(HINT, file=sys.stderr)
            return 1
        print(f"{len(pages)} generated pages in docs/ are current")
        return 0
    for rel, text in pages.items():
        path = DOCS / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote docs/{rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
