"""docs/benchmarks.md's two node shapes: every configuration of the cross-shape run (`frontier/log`
included) with the planner's prediction beside it, from compare_shapes_rerun.json (the summary
benchmarks.compare.cross_shapes writes; its predictions are the planner re-run over each run's
recorded inputs) and each shape's run file for the issue mode and shape."""

from __future__ import annotations

from . import emulated, fmt, sources

SUMMARY = f"{sources.RESULTS}/compare_shapes_rerun.json"
HEADER = [
    "shape",
    "configuration",
    "issue mode",
    "step s",
    "vs `zeropp`",
    "predicted s (error)",
    "predicted vs `zeropp`",
    "busiest link used",
    "unshaped step s",
    "unshaped vs `zeropp`",
    "load (1 min) first / last step",
]


def render() -> str:
    summary = sources.load(SUMMARY)
    body, files = [], [SUMMARY]
    for key in ("2x4x2", "8x1x2"):
        s = summary[key]
        path = f"{sources.RESULTS}/{s['file'].replace('compare_shapes_', 'compare_shapes_rerun_')}"
        files.append(path)
        run = sources.load(path)
        for name, r in s["rows"].items():
            shaped = emulated.phase(run, "shaped")[name]
            body.append(
                [
                    emulated.shape_label(run),
                    emulated.config_label(name, shaped),
                    emulated.issue_mode(run, name, shaped),
                    fmt.secs(r["step_s"]),
                    fmt.ratio(r["vs_base"]),
                    f"{r['predicted_s']:.1f} ({fmt.signed_pct(r['error'], 1)})",
                    fmt.ratio(r["vs_base_predicted"]),
                    fmt.pct(r["busiest_link_util"]),
                    fmt.secs(r["unshaped_s"]),
                    fmt.ratio(r["vs_base_unshaped"]),
                    " / ".join(f"{x:g}" for x in r["load_1min"]),
                ]
            )
    return fmt.table(HEADER, body) + "\n" + sources.cite(files) + "\n"
