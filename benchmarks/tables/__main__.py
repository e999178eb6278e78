"""``python -m benchmarks.tables [--check]``: re-render every marked table in README.md and
docs/*.md from the committed results; ``--check`` changes nothing and exits 1 naming each table
whose text differs."""

from __future__ import annotations

import argparse
import sys

from . import render


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tables", description=__doc__)
    ap.add_argument("--check", action="store_true", help="report drifted tables, write nothing")
    args = ap.parse_args(argv)
    drift = render.run(write=not args.check)
    for d in drift:
        print(("drifted: " if args.check else "rendered: ") + d)
    return 1 if args.check and drift else 0


if __name__ == "__main__":
    sys.exit(main())
