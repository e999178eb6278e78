"""DeepSpeed's own ZeRO-3 unit tests with our section injected (benchmarks/deepspeed_unit/): the
first run's counts per configuration (deepspeed_unit.json), the same with the re-run of the files
whose failures were fixed (deepspeed_unit_rerun.json: each re-run test's newer outcome replaces
its first), and the sample run in both issue modes (deepspeed_unit_overlap_sample.json). Each
file records DeepSpeed's, torch's and our commit in its own ``meta``."""

from __future__ import annotations

from collections import Counter

from . import fmt, sources

FIRST = f"{sources.RESULTS}/deepspeed_unit.json"
RERUN = f"{sources.RESULTS}/deepspeed_unit_rerun.json"
OVERLAP = f"{sources.RESULTS}/deepspeed_unit_overlap_sample.json"
LABELS = {
    "stock": "stock",
    "frontier-none": "frontier, compression none",
    "frontier-default": "frontier, default compression of the run (`gcd` gradients exact; int8 since, not re-run)",
    "zeropp-none": "zeropp, compression none",
    "zeropp-default": "zeropp, default compression",
    "frontier-none-gpu": 'frontier, compression none, `"overlap": "gpu"` (ticks)',
    "zeropp-none-gpu": 'zeropp, compression none, `"overlap": "gpu"` (one lane)',
}
ROWS = {
    "frontier, compression none": ("frontier-none",),
    "frontier, default compression of the run (`gcd` gradients exact; int8 there since)": ("frontier-default",),
    "zeropp, none / default": ("zeropp-none", "zeropp-default"),
}
MODE = {"frontier-none": ", default mode (lanes)", "zeropp-none": ", default mode (lanes)"}


def _ran(c: dict) -> str:
    return f"{c['tests']} / {c['planned']}" + ("" if c["complete"] else " (partial)")


def _other(c: dict, key: str) -> str:
    n = c["counts"].get(key, 0)
    return "–" if "stage3_passed" in c and key in ("refused-by-design", "tolerance-under-compression") else str(n)


def first_run() -> str:
    configs = sources.load(FIRST)["configs"]
    header = [
        "configuration",
        "ran / planned",
        "passed",
        "failed",
        "hang",
        "skipped",
        "refused by design",
        "tolerance under compression",
    ]
    body = []
    for name, c in configs.items():
        n = c["counts"]
        skipped = str(n.get("skipped", 0)) + (f" (+{n['xfailed']} xfailed)" if n.get("xfailed") else "")
        body.append(
            [LABELS[name], _ran(c), n.get("passed", 0), n.get("failed", 0), n.get("hang", 0), skipped]
            + [_other(c, "refused-by-design"), _other(c, "tolerance-under-compression")]
        )
    return fmt.table(header, body) + "\n" + sources.cite([FIRST]) + "\n"


def overlap_sample() -> str:
    configs = sources.load(OVERLAP)["configs"]
    header = ["configuration", "ran / planned", "passed", "failed", "skipped", "refused by design"]
    body = []
    for name, c in configs.items():
        n = c["counts"]
        skipped = str(n.get("skipped", 0)) + (f" (+{n['xfailed']} xfailed)" if n.get("xfailed") else "")
        label = LABELS[name] + MODE.get(name, "")
        body.append([label, _ran(c), n.get("passed", 0), n.get("failed", 0), skipped, _other(c, "refused-by-design")])
    return fmt.table(header, body) + "\n" + sources.cite([OVERLAP]) + "\n"


def _outcomes(c: dict) -> dict[str, str]:
    return {test: outcome for outcome, tests in c["ids"].items() for test in tests}


def with_rerun() -> str:
    """Ours after the fixes: the first run's outcomes with the re-run's replacing those it re-ran."""
    first, rerun = sources.load(FIRST)["configs"], sources.load(RERUN)["configs"]
    header = ["configuration", "ran", "passed", "refused by design", "tolerance (compression)", "failed"]
    body = []
    for label, names in ROWS.items():
        cells: list[list[str]] = [[] for _ in header[1:]]
        for name in names:
            got = Counter({**_outcomes(first[name]), **_outcomes(rerun[name])}.values())
            partial = "" if first[name]["complete"] else f" of {first[name]['planned']} (partial)"
            row = [f"{sum(got.values())}{partial}", got["passed"], got["refused-by-design"]]
            row += [got["tolerance-under-compression"], got["failed"] + got["hang"]]
            for cell, value in zip(cells, row):
                cell.append(str(value))
        # configurations of one preset share a row: a figure they share once, else each in the label's order
        merged = [c[0] if len(set(c)) == 1 else " / ".join(c) for c in cells]
        body.append([label, *merged])
    return fmt.table(header, body) + "\n" + sources.cite([FIRST, RERUN]) + "\n"
