"""docs/benchmarks.md's paired convergence tables (issue 60): the analysis that
``python -m benchmarks.cpu.paired.run`` stored beside its runs in benchmarks/results/paired.json
(protocol version 1) and paired_v2.json (version 2), by the rule of the protocol committed before
each run; tests/unit/test_paired.py re-derives both from the runs, so the tables cannot drift
from them."""

from __future__ import annotations

from . import fmt, sources

PATH = f"{sources.RESULTS}/paired.json"
PATH_V2 = f"{sources.RESULTS}/paired_v2.json"


def _pct(x: float) -> str:
    return f"{100 * x:+.3f}%"


def render() -> str:
    """Version 1: frontier and int4 on the network hop against stock."""
    return _render(PATH)


def render_v2() -> str:
    """Version 2: frontier with int8 gradients on the gpu hop, and with uncompressed weights,
    against stock; with the reproducibility check of stock against version 1."""
    return _render(PATH_V2)


def _reproduction(a: dict) -> str:
    rep = a.get("reproduction")
    if not rep or not rep["seeds"]:
        return ""
    same = sum(v["losses_identical"] and v["held_out_identical"] for v in rep["per_seed"].values())
    return (
        f" Reproducibility ({rep['arm']} against `{rep['file'].rsplit('/', 1)[-1]}`, reported, not required): "
        f"bit-identical losses at {same} of {len(rep['seeds'])} seeds, largest held-out difference "
        f"{100 * rep['max_abs_rel_diff']:.1e}%."
    )


def _render(path: str) -> str:
    a = sources.load(path)["analysis"]
    header = ["arm", "against", "seeds", "held-out mean d", "sd", "95% interval", "decision", "train mean d"]
    body = []
    for r in a["rows"]:
        h, t = r["held_out"], r["train"]
        body.append(
            [
                r["arm"],
                r["against"],
                str(h["n"]),
                _pct(h["mean"]),
                f"{100 * h['sd']:.3f}%",
                f"[{_pct(h['low'])}, {_pct(h['high'])}]",
                h["decision"],
                _pct(t["mean"]),
            ]
        )
    notes = f"Margin ±{100 * a['margin']:.2f}%, {100 * a['level']:.0f}% t-intervals; verdict: {a['verdict']}."
    return fmt.table(header, body) + "\n" + notes + _reproduction(a) + "\n" + sources.cite([path]) + "\n"
