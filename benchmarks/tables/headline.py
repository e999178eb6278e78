"""The README's headline: `zeropp`, `frontier` and `auto` at their defaults on both emulated node
shapes of 16 ranks, links binding and unshaped, from one run of today's code
(compare_shapes_rerun_<shape>.json). Each row names its shape, ranks, emulated nodes, issue mode,
link rate and the byte bound (the busiest link's bytes over its rate, which no schedule beats)."""

from __future__ import annotations

from . import emulated, fmt, sources

FILES = [f"{sources.RESULTS}/compare_shapes_rerun_2x4x2.json", f"{sources.RESULTS}/compare_shapes_rerun_8x1x2.json"]
CONFIGS = ("zeropp", "frontier", "auto")
HEADER = [
    "shape (nodes × packages × GCDs)",
    "ranks",
    "emulated nodes",
    "links (node Mbit/s per GCD)",
    "configuration",
    "issue mode",
    "step s",
    "vs `zeropp`",
    "byte bound s (busiest link)",
    "busiest link used",
    "node MB/step (all ranks)",
]


def rows(run: dict) -> list[list[str]]:
    nodes = emulated.shape(run)[0]
    out = []
    for ph, links in (("shaped", f"binding ({run['plan']['node_mbit']:g})"), ("unshaped", "unshaped")):
        summary = emulated.phase(run, ph)
        base = summary["zeropp"]["median_step_s"]
        for name in CONFIGS:
            r = summary[name]
            use = r.get("link_use") if ph == "shaped" else None
            out.append(
                [
                    emulated.shape_label(run),
                    str(run["plan"]["world"]),
                    str(nodes),
                    links,
                    emulated.config_label(name, r),
                    emulated.issue_mode(run, name, r),
                    fmt.secs(r["median_step_s"]),
                    fmt.ratio(base / r["median_step_s"]),
                    fmt.secs(use["links_s"]) if use else "—",
                    fmt.pct(max(use["busiest"].values())) if use else "—",
                    fmt.mb(r["link_stats_per_step"]["node"]),
                ]
            )
    return out


def render() -> str:
    body = [row for path in FILES for row in rows(sources.load(path))]
    return fmt.table(HEADER, body) + "\n" + sources.cite(FILES) + "\n"
