"""One comparison table for a Hydra sweep of ``zeropp_hier.app.train``.

    python -m zeropp_hier.tools.sweep_report multirun/2026-11-22/01-02-03 [--sort final_loss]

Reads every job directory's ``summary.json`` (written by rank 0 of each run) and its Hydra
overrides, prints a markdown table, and writes ``sweep_report.md`` and ``sweep_report.csv``
into the sweep directory. Bytes are what one rank sent per step over each tier, all phases.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path

from ..core.vocab import TIERS
from ..files import write_atomic

COLUMNS = (
    "job",
    "overrides",
    "preset",
    "compression",
    "world",
    "topology",
    "steps",
    "first_loss",
    "final_loss",
    "tokens_per_s",
    "node_bytes_per_step",
    "gpu_bytes_per_step",
    "gcd_bytes_per_step",
    "backward_node_bytes_per_step",
)


class ReportError(ValueError):
    pass


def row_from_summary(job: str, summary: dict) -> dict:
    """One table row from a run's summary.json (pure)."""
    spec = summary["spec"]
    bps = summary.get("bytes_per_step")  # absent for the stock preset: no per-tier counters
    overrides = summary.get("spec", {}).get("label", {}).get("overrides", [])
    comp = spec["compression"]
    row = {
        "job": job,
        "overrides": " ".join(overrides),
        "preset": spec["preset"],
        "compression": "preset default"
        if comp is None
        else (comp if isinstance(comp, str) else json.dumps(comp, sort_keys=True)),
        "world": summary["world"],
        "topology": "x".join(map(str, summary["topology"]["dims"])) if "topology" in summary else "",
        "steps": spec["steps"],
        "first_loss": summary["first_loss"],
        "final_loss": summary["final_loss"],
        "tokens_per_s": summary["tokens_per_s"],
    }
    for tier in reversed(TIERS):
        row[f"{tier}_bytes_per_step"] = None if bps is None else sum(per[tier] for per in bps.values())
    row["backward_node_bytes_per_step"] = None if bps is None else bps["backward_gather"]["node"]
    return row


def collect(sweep_dir: Path) -> list[dict]:
    """Rows for every job of a sweep directory, in job order."""
    if not sweep_dir.is_dir():
        raise ReportError(
            f"sweep directory {sweep_dir} does not exist; pass the directory Hydra printed "
            "for the multirun (multirun/<date>/<time>)"
        )
    jobs = sorted(
        (p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")),
        key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name),
    )
    rows, missing = [], []
    for job in jobs:
        f = job / "summary.json"
        if not f.exists():
            missing.append(job.name)
            continue
        rows.append(row_from_summary(job.name, json.loads(f.read_text())))
    if not rows:
        raise ReportError(
            f"no summary.json under {sweep_dir} (job directories: {[j.name for j in jobs]}); did the runs finish?"
        )
    if missing:
        print(f"sweep_report: jobs without summary.json (failed or running): {missing}", file=sys.stderr)
    return rows


def _fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)


def to_markdown(rows: list[dict]) -> str:
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    return head + "".join("| " + " | ".join(_fmt(r[c]) for c in COLUMNS) + " |\n" for r in rows)


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: ("" if r[c] is None else r[c]) for c in COLUMNS})
    return buf.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="zeropp-hier report", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_dir", type=Path)
    ap.add_argument("--sort", choices=COLUMNS, default=None, help="sort rows by this column")
    args = ap.parse_args(argv)
    try:
        rows = collect(args.sweep_dir)
    except ReportError as e:
        print(f"sweep_report: {e}", file=sys.stderr)
        return 2
    if args.sort:
        rows.sort(key=lambda r: (r[args.sort] is None, r[args.sort]))
    md = to_markdown(rows)
    write_atomic(args.sweep_dir / "sweep_report.md", md)
    write_atomic(args.sweep_dir / "sweep_report.csv", to_csv(rows))
    print(md, end="")
    print(f"\nwrote {args.sweep_dir / 'sweep_report.md'} and {args.sweep_dir / 'sweep_report.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
