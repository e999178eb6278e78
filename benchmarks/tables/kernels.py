"""docs/benchmarks.md's CPU kernels: each op's speed over the PyTorch reference and its rate as a
share of a copy of the fp32 input, int8 and int4, at every size kernels.json holds (they vary
several-fold between sizes on a loaded machine, so no one size stands for the others)."""

from __future__ import annotations

from . import fmt, sources

FILE = f"{sources.RESULTS}/kernels.json"


def render() -> str:
    doc = sources.load(FILE)
    sizes = sorted({r["numel"] for r in doc["rows"]})
    at = {(r["op"], r["bits"], r["numel"]): r for r in doc["rows"]}
    ops = list(dict.fromkeys(r["op"] for r in doc["rows"]))
    header = ["op", "bits"] + [f"{n / 2**20:.0f}M: × reference / % of copy" for n in sizes]
    body = [
        [op, f"int{b}"] + [f"{at[op, b, n]['speedup_vs_ref']:.1f} / {at[op, b, n]['pct_of_copy']:.0f}" for n in sizes]
        for op in ops
        for b in (8, 4)
    ]
    m = doc["machine"]
    cond = (
        f"Block {doc['config']['block_size']}, {m['torch_threads']} threads, {m['cpu_isa']}, "
        f"load {m['load_average_1min'][0]:.0f}–{m['load_average_1min'][-1]:.0f} on {m['cores']} cores."
    )
    return fmt.table(header, body) + "\n" + cond + " " + sources.cite([FILE]) + "\n"
