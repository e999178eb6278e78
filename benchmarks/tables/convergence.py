"""docs/benchmarks.md's convergence tables: seed 0's configurations (convergence.json) and every
seed's default, exact-gcd and int4-node rows against stock (convergence.json and
convergence_seed<N>.json), with the means. Final loss = mean of the last 20 steps; held-out = the
final weights on held-out text; "vs stock" = over stock ZeRO-3's of the same seed."""

from __future__ import annotations

import statistics

from . import fmt, sources

SEEDS = [f"{sources.RESULTS}/convergence.json"] + [f"{sources.RESULTS}/convergence_seed{n}.json" for n in range(1, 5)]
STOCK = "stock ZeRO-3"
# the rows of seed 0 in the order shown, each with what it ran (gradients gcd / gpu / node hop)
LABELS = {
    STOCK: "stock DeepSpeed ZeRO-3",
    "frontier": "**`frontier`** (default: int8 node weights; int8 / int4 / int8, no feedback)",
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
PER_SEED = ("frontier", "frontier, exact gcd gradients", "frontier, int4 node gradients")


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


def per_seed() -> str:
    header = ["seed", "stock final loss"]
    header += [f"{c} vs stock" for c in ("`frontier`", "exact gcd", "int4 node")]
    header += ["stock held-out"] + [f"{c} held-out vs stock" for c in ("`frontier`", "exact gcd", "int4 node")]
    body, diffs = [], {(n, k): [] for n in PER_SEED for k in ("final_loss", "held_out_loss")}
    for path in SEEDS:
        rows = _rows(path)
        cells = [str(sources.load(path)["args"]["seed"]), f"{rows[STOCK]['final_loss']:.4f}"]
        for key in ("final_loss", "held_out_loss"):
            if key == "held_out_loss":
                cells.append(f"{rows[STOCK][key]:.4f}")
            for name in PER_SEED:
                if name in rows:
                    diffs[name, key].append(_vs(rows, name, key))
                    cells.append(fmt.signed_pct(diffs[name, key][-1]))
                else:
                    cells.append("not run")
        body.append(cells)
    mean = ["**mean**", ""]
    for key in ("final_loss", "held_out_loss"):
        if key == "held_out_loss":
            mean.append("")
        for name in PER_SEED:
            d = diffs[name, key]
            mean.append(
                f"**{fmt.signed_pct(statistics.mean(d))}**" + (f" ({len(d)} seeds)" if len(d) < len(SEEDS) else "")
            )
    body.append(mean)
    return fmt.table(header, body) + "\n" + sources.cite(SEEDS) + "\n"
