"""docs/usage.md's dry-run table: rank 0 of the same job at 48 and at 9,408 nodes x 4 x 2, for each
preset, from the dry run's own reports (``zeropp-hier train ... dryrun.nodes=N dryrun.out=FILE``, run by
benchmarks/cpu/dryrun_presets.py): memory, host seconds per step (wall; the process's CPU seconds beside
them, and the mirror's share), the CPU seconds of the engine's build, the save and the load, collectives
per step and the files touched at save and load."""

from __future__ import annotations

from . import fmt, sources

PRESETS = ("frontier", "zeropp", "zero3")
FILES = [f"{sources.RESULTS}/dryrun_{preset}_{nodes}.json" for preset in PRESETS for nodes in (48, 9408)]


def _load(path: str) -> str:
    """The machine's 1-minute load when the run was recorded: host seconds taken beside other work
    are wall times under that load, not comparable with a quiet run's."""
    load = sources.meta(path).get("conditions", {}).get("load_1min")
    return "quiet" if load is None else f"{load:.0f}"


def _files(phase: dict) -> str:
    return f"{phase['files_opened']} / {phase['files_listed']} / {phase['files_stated']}"


def render() -> str:
    header = [
        "preset",
        "nodes (ranks)",
        "load (2 cores)",
        "peak RSS",
        "tracemalloc peak",
        "host s per step",
        "CPU s per step",
        "of it the mirror",
        "CPU s: engine build / save / load",
        "collectives per step",
        "largest payload",
        "object collectives in a step",
        "files at save (opened / listed / stat'ed)",
        "at load",
    ]
    body = []
    for path in FILES:
        r = sources.load(path)
        w, mem, ph = r["world"], r["memory"], r["phases"]
        steps = [v for k, v in ph.items() if k.startswith("step")]
        last = steps[-1]
        objects = sum(sum(s["object_collectives"].values()) for s in steps)
        body.append(
            [
                f"`{r['preset']}`",
                f"{w['nodes']:,} ({w['ranks']:,})",
                _load(path),
                f"{mem['peak_rss_bytes'] / 2**20:,.0f} MiB",
                f"{mem['tracemalloc_peak_bytes'] / 2**20:,.0f} MiB",
                f"{r['per_step']['host_seconds']:.2f}",
                f"{r['per_step']['cpu_seconds']:.2f}",
                f"{r['per_step']['mirror_seconds']:.2f}",
                " / ".join(f"{ph[k]['cpu_seconds']:.2f}" for k in ("engine", "save", "load")),
                str(last["collective_calls"]),
                f"{last['largest_payload_bytes'] / 1e6:.2f} MB",
                str(objects),
                _files(ph["save"]),
                _files(ph["load"]),
            ]
        )
    return fmt.table(header, body) + "\n" + sources.cite(FILES) + "\n"


# docs/usage.md's 20B table: the GPT-NeoX-20B recipe's dry run (benchmarks/cpu/dryrun_20b.py,
# shortened as its meta says) beside the planner's memory table for the same job, and the
# planner's for the recipe unshortened
FILES_20B = [f"{sources.RESULTS}/dryrun_neox20b_48.json", f"{sources.RESULTS}/dryrun_neox20b_9408.json"]
KEPT = ("tertiary (package copy)", "secondary (node copy)", "kept copies (per-layer levels)")
# the planner's parts, and the engine's name for the same bytes (None: not counted by the engine)
PARTS_20B = [
    ("primary", "primary"),
    ("optimizer", "optimizer"),
    ("gradients", "gradients"),
    ("kept copies", "kept copies (peak)"),
    ("error-feedback residuals", "error-feedback residuals"),
    ("gradient bucket (DeepSpeed)", "gradient bucket (DeepSpeed)"),
    ("gradient staging", None),
    ("gathered layers", "gathered parameters (peak)"),
    ("pipeline staging", None),
    ("activations", None),
]


def _planned(table: dict, part: str) -> float | None:
    (row,) = table.values()  # a fixed preset: one layout
    if part == "kept copies":
        return next((row[k] for k in KEPT if k in row), None)
    return row.get(part)


def _gb(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e9:.3g}"


def neox20b() -> str:
    runs = [sources.load(p) for p in FILES_20B]
    header = ["part (GB per rank)"]
    for r in runs:
        n = f"{r['world']['nodes']:,}"
        header += [f"{n}: dry run, engine holds", f"{n}: planner, same job", f"{n}: planner, recipe unshortened"]
    body = []
    for part, held in PARTS_20B:
        row = [part]
        for r in runs:
            mem = r["memory"]
            engine = mem["engine_memory"].get(held) if held else None
            row += [
                _gb(engine) if held else "not counted (in RSS)",
                _gb(_planned(mem["planner_memory"], part)),
                _gb(_planned(r["planner_recipe"]["table"], part)),
            ]
        body.append(row)
    total = ["total"]
    rss = ["host: peak RSS / tracemalloc peak"]
    for r in runs:
        mem = r["memory"]
        total += [
            f"{sum(mem['engine_memory'].values()) / 1e9:.3g} (counted parts)",
            _gb(_planned(mem["planner_memory"], "total")),
            _gb(_planned(r["planner_recipe"]["table"], "total")),
        ]
        rss += [f"{mem['peak_rss_bytes'] / 1e9:.3g} / {mem['tracemalloc_peak_bytes'] / 1e9:.3g}", "", ""]
    body += [total, rss]
    cond = runs[0]["meta"]["conditions"]
    note = (
        f"Dry run: rank 0, {runs[0]['result']['params'] / 1e6:.1f}M parameters (the recipe's: 20.6B); shortened: "
        + ", ".join(f"`{s}`" for s in cond["shortened"])
        + " (9,408 nodes also `global_batch=null`: 1536 sequences do not split over 75,264 ranks); "
        "`memory_gb=64`.\n"
    )
    return fmt.table(header, body) + "\n" + note + sources.cite(FILES_20B) + "\n"


BOUND = 1.5  # issue 59's bound on a step and on peak memory, 9,408 nodes against 48


def _pairs(small: dict, large: dict, key: str) -> list[float]:
    """Each back-to-back pair's ratio (run i at 9,408 nodes over run i at 48), in the order run."""
    return [b[key] / a[key] for a, b in zip(small.get("repeats", []), large.get("repeats", []))]


def ratios() -> str:
    """docs/usage.md's ratios, 9,408 nodes against 48, from the same files as the table: the
    median runs', and each pair of runs' (the sizes alternate, so run i of each saw the same
    stretch of the machine)."""
    every = f"within {BOUND}x in every pair"
    header = ["preset", "runs", "CPU s per step", "each pair", "peak RSS", "each pair", every]
    body = []
    for preset, small_path, large_path in zip(PRESETS, FILES[::2], FILES[1::2]):  # FILES: 48, then 9,408
        small, large = sources.load(small_path), sources.load(large_path)
        steps, rss = _pairs(small, large, "cpu_seconds"), _pairs(small, large, "peak_rss_bytes")
        step = large["per_step"]["cpu_seconds"] / small["per_step"]["cpu_seconds"]
        mem = large["memory"]["peak_rss_bytes"] / small["memory"]["peak_rss_bytes"]
        body.append(
            [
                f"`{preset}`",
                str(len(steps)),
                f"{step:.2f}x",
                ", ".join(f"{x:.2f}x" for x in steps),
                f"{mem:.2f}x",
                ", ".join(f"{x:.2f}x" for x in rss),
                "yes" if steps and max(steps + rss) <= BOUND else "no",
            ]
        )
    return fmt.table(header, body) + "\n" + sources.cite(FILES) + "\n"
