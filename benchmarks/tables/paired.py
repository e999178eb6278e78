"""docs/benchmarks.md's paired convergence table (issue 60): the analysis that
``python -m benchmarks.cpu.paired.run`` stored beside its runs in benchmarks/results/paired.json
(by the rule of the protocol committed before the run; tests/unit/test_paired.py re-derives it
from the runs, so the table cannot drift from them)."""

from __future__ import annotations

from . import fmt, sources

PATH = f"{sources.RESULTS}/paired.json"


def _pct(x: float) -> str:
    return f"{100 * x:+.3f}%"


def render() -> str:
    a = sources.load(PATH)["analysis"]
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
    return fmt.table(header, body) + "\n" + notes + "\n" + sources.cite([PATH]) + "\n"
