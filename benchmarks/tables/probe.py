"""docs/benchmarks.md's emulated-cluster note on gloo's rate: each tier's rate as the link probe
measured it (an all-gather's bandwidth-bound slope, detect/links.py) beside the rate its links
were shaped to, in the cross-shape runs (each run file's ``probe`` and the shaped rates its first
note records)."""

from __future__ import annotations

import ast
import re

from . import emulated, fmt, sources

FILES = [f"{sources.RESULTS}/compare_shapes_rerun_2x4x2.json", f"{sources.RESULTS}/compare_shapes_rerun_8x1x2.json"]
SHAPED = re.compile(r"per-GCD Mbit/s (\{[^}]*\})")


def shaped_mbit(run: dict) -> dict[str, float]:
    """The tbf rates per GCD the run shaped its links to, from the note the run writes first."""
    m = SHAPED.search(run["notes"][0])
    if not m:
        raise sources.SourceError("the run's first note does not record its shaped per-GCD rates")
    return ast.literal_eval(m.group(1))


def render() -> str:
    header = ["shape", "tier", "shaped Mbit/s per GCD", "probed Mbit/s", "probed / shaped"]
    body = []
    for path in FILES:
        run = sources.load(path)
        shaped = shaped_mbit(run)
        for tier, p in run["probe"]["tiers"].items():
            probed = p["bandwidth"] * 8 / 1e6
            body.append(
                [emulated.shape_label(run), tier, f"{shaped[tier]:g}", f"{probed:.3f}", fmt.pct(probed / shaped[tier])]
            )
    return fmt.table(header, body) + "\n" + sources.cite(FILES) + "\n"
