"""Our presets at two node shapes of 16 ranks, links binding and unshaped, planner beside each.

    sudo python -m benchmarks.compare.cross_shapes                    # both shapes (~1 hour on 2 cores)
    sudo python -m benchmarks.compare.cross_shapes --shapes 8x1x2     # one
    python -m benchmarks.compare.cross_shapes --table-only            # the tables from the recorded files
    sudo python -m benchmarks.compare.cross_shapes --unshaped-only --configs zeropp,frontier,auto --rounds 2
                                                                      # links unshaped only (auto's host term)

For each shape (``8x1x2``: 8 nodes x 1 package x 2 GCDs, a node group of 8; ``2x4x2``: Frontier's
node shape at 2 nodes) one ``benchmarks.compare`` run: the fair fight's settings (bf16, micro-batch
1, prefetch of about one layer), the GPU issue mode at defaults, the link-bound regime (rates from
an unshaped calibration, ``--link-share``), one round of ``zeropp``, ``frontier``, ``frontier`` with
every tick hop in log steps (``frontier/log``; ``frontier``'s default at both shapes is direct,
[Note: log-step hops] in comm/tick/plan.py) and ``auto``, then one unshaped pass of the same. Each
run's own file is ``compare_shapes_<shape>.json`` (benchmarks.compare's format); this module adds
the cross-shape summary ``compare_shapes.json`` and ``compare_shapes.md``: per configuration the
step shaped and unshaped, the ratio to ``zeropp``, the busiest link's utilisation (its bytes per
step over its shaped capacity times the step), the planner's scheduled step beside the measured
one (the planner re-run now over the run's recorded inputs: [Note: predictions re-run]), what
``auto`` chose with the links binding and unshaped, the machine's load at each run, and
the bytes per phase, tier and link (``comm_stats``' payload and link views against the interface
counters). ``rows``, ``byte_rows`` and ``markdown`` are pure (tests/unit/test_compare_shapes.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from zeropp_hier.core.vocab import TIERS
from zeropp_hier.files import write_json_atomic

RESULTS = "benchmarks/results"
SHAPES = {"8x1x2": (8, 1), "2x4x2": (2, 4)}  # name -> (nodes, packages per node); 2 GCDs each
CONFIGS = ("zeropp", "frontier", "frontier/log", "auto")
BASE = "zeropp"  # the ratios' reference
# the fair fight's GPU-mode settings (docs/benchmarks.md, "In the GPU issue mode")
COMMON = [
    "--fair",
    "--regime",
    "link-bound",
    "--micro-batch",
    "1",
    "--prefetch-bucket",
    "2359296",
    "--reduce-bucket",
    "786432",
    "--rounds",
    "1",
]
PHASES = ("forward_gather", "backward_gather", "grad_reduce")


def compare_argv(
    shape: str,
    link_share: float,
    out_dir: str = RESULTS,
    configs: tuple[str, ...] = CONFIGS,
    unshaped_rounds: int | None = None,
    name: str = "compare_shapes",
    prefix: str = "zms",
) -> list[str]:
    """benchmarks.compare's command line for one shape; ``unshaped_rounds``: only the unshaped
    pass, that many rounds (``--unshaped-only``), written as ``<name>_<shape>.json``; ``prefix``:
    the emulated cluster's namespaces (another run on the machine may hold ``zms``)."""
    nodes, gpus = SHAPES[shape]
    base = os.path.join(out_dir, f"{name}_{shape}")
    common = list(COMMON)
    if unshaped_rounds is not None:
        common[common.index("--rounds") + 1] = str(unshaped_rounds)
        common += ["--unshaped-only"]
    return [
        *common,
        "--nodes",
        str(nodes),
        "--gpus-per-node",
        str(gpus),
        "--link-share",
        f"{link_share:g}",
        "--configs",
        ",".join(configs),
        "--prefix",
        prefix,
        "--out",
        base + ".json",
        "--png",
        base + ".png",
    ]


def _busiest(d: dict) -> float | None:
    """The busiest shaped link's utilisation: its bytes per step over capacity x median step."""
    use = d.get("link_use")
    return None if use is None else use["links_s"] / d["median_step_s"]


def _load(rec: dict, phase: str, name: str) -> list[float] | None:
    """The 1-minute load average at the run's first and last measured step (None if unrecorded)."""
    marks = rec.get("regime", {}).get("loadavg", {}).get(f"{phase}/0/{name}")
    if not marks:
        return None
    return [round(marks[w][0], 2) for w in ("begin", "end") if w in marks]


def _auto(d: dict | None) -> dict | None:
    """What ``auto`` chose in a run and what it predicted for each candidate it ranked."""
    if not d or not d.get("auto"):
        return None
    a = d["auto"][0]
    return {
        "chosen": a["chosen"],
        "ranks": a.get("ranks"),
        "chunks": a.get("chunks"),
        "predicted_s": {c["name"]: c.get("predicted_pipelined_s") for c in a.get("ranking", [])},
    }


def rows(rec: dict, pred: dict | None = None) -> dict:
    """One shape's run (a ``benchmarks.compare`` record): per configuration the measured and the
    planner's step, ratios to ``BASE`` (measured and predicted), busiest link utilisation, the
    unshaped step and auto's choices. ``auto``'s prediction is that of the preset it chose.
    ``pred``: the planner's predictions to show (``benchmarks.compare.planner.predictions``'
    rows); by default those the run recorded."""
    shaped, unshaped = rec["summary"]["shaped"], rec["summary"].get("unshaped", {})
    pred = rec.get("predictions", {}) if pred is None else pred
    out: dict = {}
    auto_shaped = _auto(shaped.get("auto"))
    for name, d in shaped.items():
        as_ = auto_shaped["chosen"] if name == "auto" and auto_shaped else name
        p = pred.get(as_)
        row = {
            "step_s": d["median_step_s"],
            "busiest_link_util": _busiest(d),
            "bound_by": (d.get("link_use") or {}).get("bound_by"),
            "links_s": (d.get("link_use") or {}).get("links_s"),
            "predicted_s": None if p is None else p["scheduled_s"],
            "unshaped_s": unshaped.get(name, {}).get("median_step_s"),
            "load_1min": _load(rec, "shaped", name),
            "unshaped_load_1min": _load(rec, "unshaped", name),
            "mode": None if p is None else p["mode"],
        }
        row["error"] = None if row["predicted_s"] is None else row["predicted_s"] / row["step_s"] - 1
        out[name] = row
    base = out.get(BASE)
    for row in out.values():
        row["vs_base"] = None if base is None else base["step_s"] / row["step_s"]
        row["vs_base_predicted"] = (
            None
            if base is None or base["predicted_s"] is None or row["predicted_s"] is None
            else base["predicted_s"] / row["predicted_s"]
        )
        row["vs_base_unshaped"] = (
            None
            if base is None or not base["unshaped_s"] or not row["unshaped_s"]
            else base["unshaped_s"] / row["unshaped_s"]
        )
    return {
        "rows": out,
        "auto": {"shaped": auto_shaped, "unshaped": _auto(unshaped.get("auto"))},
        "node_mbit": rec["plan"]["node_mbit"],
        "faster": {
            "shaped": _faster(shaped, ("zeropp", "frontier")),
            "unshaped": _faster(unshaped, ("zeropp", "frontier")),
        },
        "steps": {
            "shaped": {n: d["median_step_s"] for n, d in shaped.items()},
            "unshaped": {n: d["median_step_s"] for n, d in unshaped.items()},
        },
    }


def _faster(phase: dict, names) -> str | None:
    have = [n for n in names if n in phase]
    return min(have, key=lambda n: phase[n]["median_step_s"]) if have else None


def byte_rows(rec: dict, phase: str = "unshaped") -> dict:
    """Bytes per step, all ranks, for each of our configurations in ``phase`` of a run: per
    phase and tier ``comm_stats``' payload view and link view, and per link class the link view
    beside the interface counters (which include TCP/IP framing and DeepSpeed's own small
    collectives). The unshaped pass by default: the same bytes, and no tbf drops to retransmit."""
    out = {}
    for name, d in rec["summary"].get(phase, {}).items():
        if "phase_link_stats_per_step" not in d or name == "auto":  # auto: its choice's bytes
            continue
        out[name] = {
            "payload": {p: d["phase_stats_per_step"][p] for p in PHASES},
            "link": {p: d["phase_link_stats_per_step"][p] for p in PHASES},
            "link_total": d["link_stats_per_step"],
            "wire": d["wire_per_step"],
            "link_over_wire": {
                t: (d["link_stats_per_step"][t] / d["wire_per_step"][t] if d["wire_per_step"][t] else None)
                for t in TIERS
            },
        }
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _num(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


# [Note: predictions re-run]
# The "predicted" columns of compare_shapes.md are the current planner re-run over each run's
# recorded inputs (its plan, probe, unshaped steps and quantization rates:
# ``planner.recorded_predictions``), not the predictions the run recorded when it ran; the
# measurements are the run's. So a planner change shows in the table by ``--table-only`` alone,
# and the table says which it is.
PREDICTED_LABEL = "planner re-run now over the run's recorded inputs"


def markdown(summary: dict) -> list[str]:
    """The tables of ``compare_shapes.md`` from ``summary`` (shape -> ``rows`` and ``byte_rows``)."""
    lines = [
        f"Predicted columns: {PREDICTED_LABEL} ([Note: predictions re-run]); measured columns as recorded.",
        "",
        "| shape | configuration | issue mode | step s | vs `zeropp` | predicted s (error) | predicted vs "
        "`zeropp` | busiest link util | unshaped step s | unshaped vs `zeropp` | load (1 min) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for shape, s in summary.items():
        for name, r in s["rows"].items():
            mode = (r["mode"] or "-").replace("_", " ")
            if name == "auto" and s["auto"]["shaped"]:
                mode = f"chose `{s['auto']['shaped']['chosen']}`: {mode}"
            err = "-" if r["error"] is None else f"{r['predicted_s']:.1f} ({r['error']:+.1%})"
            load = "/".join(f"{x:g}" for x in r["load_1min"] or [])
            lines.append(
                f"| {shape} | `{name}` | {mode} | {r['step_s']:.2f} | {_num(r['vs_base'])}× | {err} | "
                f"{_num(r['vs_base_predicted'])}× | {_pct(r['busiest_link_util'])} | {_num(r['unshaped_s'])} | "
                f"{_num(r['vs_base_unshaped'])}× | {load or '-'} |"
            )
    lines += [
        "",
        "| shape | links | `zeropp` s | `frontier` s | `auto` chose | `auto` s | `auto` / best fixed |",
        "|---|---|---|---|---|---|---|",
    ]
    for shape, s in summary.items():
        binding = f"binding (node {s['node_mbit']:g} Mbit/s per GCD)"
        for phase, label in (("shaped", binding), ("unshaped", "unshaped")):
            a, steps = s["auto"][phase], s["steps"][phase]
            chosen = f"`{a['chosen']}`" + (f", {a['chunks']} chunks" if a and a.get("chunks") else "") if a else "-"
            fixed = [steps[n] for n in ("zeropp", "frontier") if n in steps]
            ratio = steps["auto"] / min(fixed) if "auto" in steps and fixed else None
            lines.append(
                f"| {shape} | {label} | {_num(steps.get('zeropp'))} | {_num(steps.get('frontier'))} | {chosen} | "
                f"{_num(steps.get('auto'))} | {_num(ratio, '.3f')} |"
            )
    lines += [
        "",
        "| shape | configuration | phase | payload view MB node / gpu / gcd | link view MB node / gpu / gcd |",
        "|---|---|---|---|---|",
    ]
    mb = lambda v: " / ".join(f"{v[t] / 1e6:.2f}" for t in reversed(TIERS))  # noqa: E731
    for shape, s in summary.items():
        for name, b in s["bytes"].items():
            for p in PHASES:
                lines.append(f"| {shape} | `{name}` | {p} | {mb(b['payload'][p])} | {mb(b['link'][p])} |")
            total = f"{mb(b['wire'])} | {mb(b['link_total'])}"
            lines.append(f"| {shape} | `{name}` | **wire** (counters) / link view total | {total} |")
    return lines


def summarize_files(paths: dict[str, str]) -> dict:
    """shape -> ``rows`` (the planner re-run now: [Note: predictions re-run]) and ``byte_rows``
    of each recorded run file."""
    from benchmarks.compare.planner import recorded_predictions

    out = {}
    for shape, path in paths.items():
        with open(path) as f:
            rec = json.load(f)
        out[shape] = {
            **rows(rec, recorded_predictions(rec)),
            "predicted": PREDICTED_LABEL,
            "bytes": byte_rows(rec),
            "file": os.path.basename(path),
            "notes": rec["notes"],
            "meta": rec.get("meta"),  # the run's commit, defaults and conditions (None before runs recorded them)
        }
    return out


def unshaped_rows(rec: dict) -> dict:
    """An ``--unshaped-only`` run of one shape: per configuration its step times and median, the
    machine's load; what ``auto`` chose and, per candidate it ranked, its predicted link and
    host seconds and their combination ([Note: host term] in zeropp_hier/planner/host.py)."""
    un = rec["summary"].get("unshaped", {})
    steps = {n: d["median_step_s"] for n, d in un.items()}
    fixed = {n: t for n, t in steps.items() if n != "auto"}
    autos = [
        {
            "chosen": a["chosen"],
            "chunks": a.get("chunks"),
            "host": a.get("host"),
            "ranks": a.get("ranks"),
            "ranking": a.get("ranking", []),
        }
        for a in un.get("auto", {}).get("auto", [])
    ]
    return {
        "steps": steps,
        "step_times": {n: d["step_times"] for n, d in un.items()},
        "load_1min": {n: _load(rec, "unshaped", n) for n in un},
        "faster_fixed": min(fixed, key=lambda n: fixed[n]) if fixed else None,
        "auto": autos,
        "auto_over_best_fixed": steps["auto"] / min(fixed.values()) if "auto" in steps and fixed else None,
    }


def unshaped_markdown(summary: dict) -> list[str]:
    """The tables of an ``--unshaped-only`` run: measured steps and auto's choice per shape, then
    per shape and round what auto predicted for each candidate."""
    lines = [
        "| shape | configuration | steps s (median) | load (1 min) |",
        "|---|---|---|---|",
    ]
    for shape, s in summary.items():
        for n, t in s["steps"].items():
            times = ", ".join(f"{x:.2f}" for x in s["step_times"][n])
            load = "/".join(f"{x:g}" for x in s["load_1min"][n] or [])
            lines.append(f"| {shape} | `{n}` | {times} (**{t:.2f}**) | {load or '-'} |")
    lines += [
        "",
        "| shape | faster fixed | `auto` chose | `auto` / best fixed |",
        "|---|---|---|---|",
    ]
    for shape, s in summary.items():
        chose = ", ".join(f"`{a['chosen']}` ({a['chunks']} chunks)" for a in s["auto"]) or "-"
        lines.append(f"| {shape} | `{s['faster_fixed']}` | {chose} | {_num(s['auto_over_best_fixed'], '.3f')} |")
    lines += [
        "",
        "| shape | round | candidate | issue mode | chunks | links s | host s | combined | predicted s |"
        " collectives / p2p ops / ticks |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for shape, s in summary.items():
        for i, a in enumerate(s["auto"]):
            for c in a["ranking"]:
                w = c.get("host_work") or {}
                work = f"{w.get('collectives', '-')} / {w.get('p2p_ops', '-')} / {w.get('ticks', '-')}"
                lines.append(
                    f"| {shape} | {i} | `{c['name']}` | {c.get('issue_mode', '-')} | {c.get('chunks', '-')} | "
                    f"{_num(c.get('predicted_link_s'), '.3f')} | {_num(c.get('predicted_host_s'), '.3f')} | "
                    f"{c.get('combine') or '-'} | {_num(c.get('predicted_s'), '.3f')} | {work} |"
                )
    hosts = [(shape, i, a["host"]) for shape, s in summary.items() for i, a in enumerate(s["auto"]) if a["host"]]
    if hosts:
        lines += [
            "",
            "| shape | round | us per collective | us per p2p op | ns per tick element | quantization M elem/s "
            "| host probe s |",
        ]
        lines += ["|---|---|---|---|---|---|---|"]
        for shape, i, h in hosts:
            elem = h.get("tick_elem_s")  # records before the tick mode's per-element work: none
            lines.append(
                f"| {shape} | {i} | {h['collective_s'] * 1e6:.0f} | {h['p2p_op_s'] * 1e6:.0f} | "
                f"{_num(None if elem is None else elem * 1e9, '.2f')} | {h['quant_rate'] / 1e6:.1f} | "
                f"{h['seconds']:.2f} |"
            )
    return lines


def run_unshaped(args, shapes: list[str]) -> int:
    """``--unshaped-only``: one ``benchmarks.compare`` run per shape of the unshaped pass alone,
    then ``<name>.json`` and ``<name>.md`` from their files."""
    configs = tuple(args.configs.split(","))
    if not args.table_only:
        from benchmarks.compare import run as compare

        for shape in shapes:
            argv = compare_argv(shape, args.link_share, args.out_dir, configs, args.rounds, args.name, args.prefix)
            rc = compare.main(argv)
            if rc:
                return rc
    summary = {}
    for shape in shapes:
        path = os.path.join(args.out_dir, f"{args.name}_{shape}.json")
        if os.path.exists(path):
            with open(path) as f:
                rec = json.load(f)
            summary[shape] = {**unshaped_rows(rec), "file": os.path.basename(path), "meta": rec.get("meta")}
    text = "\n".join(unshaped_markdown(summary))
    print(text)
    write_json_atomic(os.path.join(args.out_dir, f"{args.name}.json"), summary, indent=1)
    with open(os.path.join(args.out_dir, f"{args.name}.md"), "w") as f:
        f.write(text + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, from {list(SHAPES)}")
    ap.add_argument("--link-share", type=float, default=0.15, help="benchmarks.compare --link-share")
    ap.add_argument("--table-only", action="store_true", help="only rebuild the tables from the recorded files")
    ap.add_argument("--out-dir", default=RESULTS)
    ap.add_argument(
        "--unshaped-only",
        action="store_true",
        help="only the unshaped pass of --configs, --rounds rounds, into <--name>_<shape>.json and <--name>.json/.md",
    )
    ap.add_argument("--configs", default=",".join(CONFIGS), help="with --unshaped-only: comma-separated")
    ap.add_argument("--rounds", type=int, default=1, help="with --unshaped-only: rounds of the unshaped pass")
    ap.add_argument("--name", default="compare_auto_unshaped", help="with --unshaped-only: the files' base name")
    ap.add_argument("--prefix", default="zmu", help="with --unshaped-only: the emulated cluster's namespace prefix")
    args = ap.parse_args(argv)
    shapes = args.shapes.split(",")
    bad = [s for s in shapes if s not in SHAPES]
    if bad:
        ap.error(f"--shapes {','.join(bad)}: use names from {list(SHAPES)}")
    if args.unshaped_only:
        return run_unshaped(args, shapes)
    if not args.table_only:
        from benchmarks.compare import run as compare

        for shape in shapes:
            rc = compare.main(compare_argv(shape, args.link_share, args.out_dir))
            if rc:
                return rc
    paths = {s: os.path.join(args.out_dir, f"compare_shapes_{s}.json") for s in shapes}
    summary = summarize_files({s: p for s, p in paths.items() if os.path.exists(p)})
    text = "\n".join(markdown(summary))
    print(text)
    write_json_atomic(os.path.join(args.out_dir, "compare_shapes.json"), summary, indent=1)
    with open(os.path.join(args.out_dir, "compare_shapes.md"), "w") as f:
        f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
