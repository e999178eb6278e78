"""docs/benchmarks.md's `auto` tables: its four cases (two shapes, links binding and unshaped)
from the cross-shape run, and the two-round unshaped run with `frontier` in one chunk beside it
(compare_auto_unshaped.json). "Best fixed" is the faster of `zeropp` and `frontier` at their
defaults."""

from __future__ import annotations

from . import emulated, fmt, sources

SHAPES = f"{sources.RESULTS}/compare_shapes_rerun.json"
UNSHAPED = f"{sources.RESULTS}/compare_auto_unshaped.json"


def _choice(run: dict, phase: str) -> str:
    row = emulated.phase(run, phase)["auto"]
    preset, chunks = emulated.auto_choice(row) or ("?", 1)
    return f"`{preset}`" + (f", {chunks} chunks" if preset == "frontier" else "")


def four_cases() -> str:
    header = ["shape", "links", "`zeropp` s", "`frontier` s", "`auto` chose", "`auto` s", "`auto` / best fixed"]
    body, files = [], [SHAPES]
    for key in ("8x1x2", "2x4x2"):
        path = f"{sources.RESULTS}/compare_shapes_rerun_{key}.json"
        files.append(path)
        run = sources.load(path)
        for phase in ("shaped", "unshaped"):
            steps = {n: emulated.phase(run, phase)[n]["median_step_s"] for n in ("zeropp", "frontier", "auto")}
            links = f"binding (node {run['plan']['node_mbit']:g} Mbit/s per GCD)" if phase == "shaped" else "unshaped"
            body.append(
                [
                    emulated.shape_label(run),
                    links,
                    fmt.secs(steps["zeropp"]),
                    fmt.secs(steps["frontier"]),
                    _choice(run, phase),
                    fmt.secs(steps["auto"]),
                    f"{steps['auto'] / min(steps['zeropp'], steps['frontier']):.3f}",
                ]
            )
    return fmt.table(header, body) + "\n" + sources.cite(files) + "\n"


def unshaped_two_rounds() -> str:
    summary = sources.load(UNSHAPED)
    header = [
        "shape",
        "`zeropp` s",
        "`frontier` s (8 chunks)",
        "`frontier`, 1 chunk s",
        "`auto` chose (round 0, 1)",
        "`auto` s",
        "`auto` / best fixed",
    ]
    body, files = [], [UNSHAPED]
    for key in ("2x4x2", "8x1x2"):
        s = summary[key]
        files.append(f"{sources.RESULTS}/{s['file']}")
        run = sources.load(files[-1])
        steps = s["steps"]
        body.append(
            [
                emulated.shape_label(run),
                fmt.secs(steps["zeropp"]),
                fmt.secs(steps["frontier"]),
                fmt.secs(steps["frontier/one-chunk"]),
                ", ".join(f"`{a['chosen']}`" for a in s["auto"]),
                fmt.secs(steps["auto"]),
                f"{s['auto_over_best_fixed']:.2f}",
            ]
        )
    return fmt.table(header, body) + "\n" + sources.cite(files) + "\n"
