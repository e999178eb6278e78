"""docs/benchmarks.md's paired convergence table (issue 60): benchmarks/results/paired.json
analysed by the harness's own rule (benchmarks/cpu/paired/analyze.py: the protocol committed
before the run, recorded in the file), so the table and the decision cannot drift apart."""

from __future__ import annotations

from benchmarks.cpu.paired import analyze

from . import sources

PATH = f"{sources.RESULTS}/paired.json"


def render() -> str:
    record = sources.load(PATH)
    result = analyze.analyze({**record["protocol"], "run": record["run"]}, record["runs"], record["pilot"])
    return analyze.table(result) + "\n\n" + sources.cite([PATH]) + "\n"
