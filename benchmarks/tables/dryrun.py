"""docs/usage.md's dry-run table: rank 0 of the same job at 48 and at 9,408 nodes x 4 x 2, for each
preset, from the dry run's own reports (``zeropp-hier train ... dryrun.nodes=N dryrun.out=FILE``): memory, host
seconds per step, collectives per step and the files touched at save and load."""

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
                str(last["collective_calls"]),
                f"{last['largest_payload_bytes'] / 1e6:.2f} MB",
                str(objects),
                _files(ph["save"]),
                _files(ph["load"]),
            ]
        )
    return fmt.table(header, body) + "\n" + sources.cite(FILES) + "\n"
