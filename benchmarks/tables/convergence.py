"""docs/benchmarks.md's unpaired convergence table: seed 0's configurations (convergence.json; the
paired test's table is paired.py). Final loss = mean of the last 20 steps; held-out = the
final weights on held-out text; "vs stock" = over stock ZeRO-3's of the same seed."""

from __future__ import annotations

from . import fmt, sources

SEEDS = [f"{sources.RESULTS}/convergence.json"] + [f"{sources.RESULTS}/convergence_seed{n}.json" for n in range(1, 5)]
STOCK = "stock ZeRO-3"
# the rows of seed 0 in the order shown, each with what it ran (gradients gcd / gpu / node hop)
LABELS = {
    STOCK: "stock DeepSpeed ZeRO-3",
    "frontier": "`frontier` of that run (int8 node weights; int8 / int4 / int8, no feedback)",
    "frontier, exact gcd gradients": "`frontier`, exact gcd gradients (int4 / int8)",
    "frontier, int4 node gradients": "`frontier`, int4 node gradients (exact / int4 / int4, feedback on node)",
    "frontier, int4 node gradients, no error feedback": "… error feedback off",
    "frontier, int4 node block 64": '… `"block_size": {"node": 64}`',
    "frontier, int4 node gradients, exact weights": "… exact weights",
    "frontier, int8 gpu gradients": "`frontier`, exact / int8 / int4",
    "zeropp": "`zeropp` (int8 weights; int4 / int4, no feedback)",
    "frontier, int8 gradients": "`frontier`, exact / int8 / int8",
    "frontier, exact gradients": "`frontier`, exact gradients (int8 node weights only)",
}


def _rows(path: str) -> dict[str, dict]:
    return {r["name"]: r for r in sources.load(path)["results"]}


def _vs(rows: dict, name: str, key: str) -> float:
    return rows[name][key] / rows[STOCK][key] - 1


def seed0() -> str:
    rows = _rows(SEEDS[0])
    header = [
        "configuration (gradients gcd / gpu / node hop)",
        "final loss",
        "vs stock",
        "held-out loss",
        "vs stock",
        "node KB sent/step/rank",
        "node gradient rel. error",
    ]
    body = []
    for name, label in LABELS.items():
        r = rows[name]
        stock = name == STOCK
        err = r.get("grad_node_rel_error")
        body.append(
            [
                label,
                f"{r['final_loss']:.4f}",
                "—" if stock else fmt.signed_pct(_vs(rows, name, "final_loss")),
                f"{r['held_out_loss']:.4f}",
                "—" if stock else fmt.signed_pct(_vs(rows, name, "held_out_loss")),
                "(not counted)" if stock else fmt.kb(r["node_bytes_per_step"]),
                "—" if err is None else f"{err:.3f}",
            ]
        )
    return fmt.table(header, body) + "\n" + sources.cite([SEEDS[0]]) + "\n"
