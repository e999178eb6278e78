"""The paired test's analysis, pure: from the recorded runs to per-arm intervals and the decision
the protocol fixed in advance, and the table that reports them.

The rule (PROTOCOL.md): per seed d_s = (L_arm - L_stock) / L_stock with L the held-out loss
averaged over the protocol's last evaluations; the 95% t-interval of the mean of d_s over seeds;
equivalent when it lies inside +-margin. The A/A control validates the run: its interval must
lie inside +-control_margin (else the arms differ in something besides the numerics, and no
verdict stands), and its half-width is the measured noise floor.
"""

from __future__ import annotations

from typing import Any

from . import stats


def metric(record: dict, name: str, train_last: int) -> float:
    """One run's figure: ``held_out`` = mean of its held-out losses (the protocol's last
    evaluations); ``train`` = mean training loss over its last ``train_last`` steps."""
    if name == "held_out":
        values = list(record["held_out"].values())
        if not values:
            raise ValueError(f"{record['arm']} seed {record['seed']}: no held-out evaluation recorded")
        return sum(values) / len(values)
    tail = record["losses"][-train_last:]
    return sum(tail) / len(tail)


def pairing_problems(runs: dict[str, dict[str, dict]]) -> list[str]:
    """Every arm of one seed must start from the same weights and see the same samples; different
    seeds must differ. ``runs``: seed -> arm -> record."""
    problems = []
    firsts: dict[str, str] = {}
    for seed, arms in runs.items():
        inits = {r["init_sha256"] for r in arms.values()}
        orders = {r["order_sha256"] for r in arms.values()}
        if len(inits) > 1:
            problems.append(f"seed {seed}: the arms start from different weights ({sorted(arms)})")
        if len(orders) > 1:
            problems.append(f"seed {seed}: the arms see different samples ({sorted(arms)})")
        for digest in inits:
            if digest in firsts:
                problems.append(f"seeds {firsts[digest]} and {seed} start from the same weights")
            firsts[digest] = seed
    return problems


def paired(runs: dict[str, dict[str, dict]], arm: str, ref: str, name: str, train_last: int) -> dict[str, float]:
    """seed -> d_s for the seeds that ran both ``arm`` and ``ref``."""
    seeds = [s for s in runs if arm in runs[s] and ref in runs[s]]
    a = [metric(runs[s][arm], name, train_last) for s in seeds]
    r = [metric(runs[s][ref], name, train_last) for s in seeds]
    return dict(zip(seeds, stats.paired_relative_differences(a, r)))


def bit_identical(runs: dict[str, dict[str, dict]], arm: str, ref: str) -> bool:
    """Whether ``arm`` reproduced ``ref``'s loss curve exactly at every seed (an A/A control that
    does would measure no noise at all)."""
    both = [s for s in runs if arm in runs[s] and ref in runs[s]]
    return bool(both) and all(runs[s][arm]["losses"] == runs[s][ref]["losses"] for s in both)


def reproduction(runs: dict[str, dict[str, dict]], earlier: dict[str, dict[str, dict]], arm: str) -> dict[str, Any]:
    """How ``arm``'s runs compare with the same seeds' runs in an ``earlier`` result file: per
    seed whether the training losses and held-out losses are bit-identical, and the largest
    relative held-out difference. A reproducibility check, reported and not required."""
    seeds = [s for s in runs if arm in runs[s] and arm in earlier.get(s, {})]
    per: dict[str, dict[str, Any]] = {}
    for s in seeds:
        now, then = runs[s][arm], earlier[s][arm]
        a, b = metric(now, "held_out", 1), metric(then, "held_out", 1)
        per[s] = {
            "losses_identical": now["losses"] == then["losses"],
            "held_out_identical": now["held_out"] == then["held_out"],
            "held_out_rel_diff": (a - b) / b,
        }
    return {
        "arm": arm,
        "seeds": seeds,
        "per_seed": per,
        "all_identical": bool(per) and all(v["losses_identical"] and v["held_out_identical"] for v in per.values()),
        "max_abs_rel_diff": max((abs(v["held_out_rel_diff"]) for v in per.values()), default=None),
    }


def incomplete(protocol: dict, runs: dict[str, dict[str, dict]]) -> str | None:
    """What a stopped run lacks of the protocol's seeds x arms ("4 of 6 seeds"), or None when
    it holds them all (or the protocol names no seeds, as a unit test's may not)."""
    seeds = [str(s) for s in protocol.get("seeds", [])]
    done = [s for s in seeds if all(a in runs.get(s, {}) for a in protocol["arms"])]
    return f"{len(done)} of {len(seeds)} seeds" if len(done) < len(seeds) else None


def analyze(protocol: dict, runs: dict[str, dict[str, dict]], pilot: bool) -> dict[str, Any]:
    """Intervals and decisions for every arm against the reference and for every contrast."""
    margin, level, ref, control = protocol["margin"], protocol["level"], protocol["reference"], protocol["control"]
    train_last = protocol["run"]["train_last"]
    out: dict[str, Any] = {"pilot": pilot, "margin": margin, "level": level, "problems": pairing_problems(runs)}
    rows = []
    pairs = [(a, ref) for a in protocol["arms"] if a != ref] + [tuple(c) for c in protocol.get("contrasts", [])]
    for arm, base in pairs:
        row: dict[str, Any] = {"arm": arm, "against": base}
        for name in ("held_out", "train"):
            d = paired(runs, arm, base, name, train_last)
            row[f"{name}_d"] = d
            if len(d) >= 2:
                iv = stats.t_interval(list(d.values()), level)
                row[name] = {**iv.__dict__, "half_width": iv.half_width, "decision": stats.equivalence(iv, margin)}
        rows.append(row)
    out["rows"] = rows
    ctl = next((r for r in rows if r["arm"] == control and r["against"] == ref), None)
    primary = protocol["metric"]
    bound = protocol["control_margin"]
    civ = ctl.get(primary) if ctl is not None else None
    valid = civ is not None and -bound < civ["low"] and civ["high"] < bound
    out["control_within"] = valid
    out["control_contains_zero"] = civ is not None and civ["low"] <= 0 <= civ["high"]
    out["control_bit_identical"] = bit_identical(runs, control, ref)
    out["noise_floor_half_width"] = civ["half_width"] if civ is not None else None
    if pilot:
        out["verdict"] = "pilot: sizing only, no decision is drawn from a pilot"
    elif out["problems"]:
        out["verdict"] = "invalid: the pairing failed (see problems)"
    elif not valid:
        out["verdict"] = (
            f"invalid: the A/A interval is not inside +-{100 * bound:.2f}%, so stock and its harmless "
            "change differ by more than rounding"
        )
    else:
        out["verdict"] = "valid: decisions stand as tabled"
    missing = incomplete(protocol, runs)
    if missing and not pilot:
        # a stopped run (whole pairs kept): its intervals are reported, its decisions are not final
        out["verdict"] = f"PARTIAL ({missing}): decisions are provisional; " + out["verdict"]
    return out


def table(result: dict) -> str:
    """Markdown table of the analysis (percentages of the reference's loss)."""
    pct = lambda x: f"{100 * x:+.3f}%"  # noqa: E731
    lines = [
        f"margin +-{100 * result['margin']:.2f}%, {100 * result['level']:.0f}% t-intervals; "
        f"verdict: {result['verdict']}",
        "",
        "| arm | against | seeds | held-out mean d | sd | 95% interval | decision | train mean d | train interval |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        h, t = r.get("held_out"), r.get("train")
        n = len(r["held_out_d"])
        if h is None:
            only = ", ".join(pct(v) for v in r["held_out_d"].values()) or "-"
            lines.append(f"| {r['arm']} | {r['against']} | {n} | {only} | - | - | (needs 2 seeds) | - | - |")
            continue
        decision = "(pilot)" if result["pilot"] else h["decision"]
        lines.append(
            f"| {r['arm']} | {r['against']} | {n} | {pct(h['mean'])} | {100 * h['sd']:.3f}% | "
            f"[{pct(h['low'])}, {pct(h['high'])}] | {decision} | {pct(t['mean'])} | "
            f"[{pct(t['low'])}, {pct(t['high'])}] |"
        )
    if result["noise_floor_half_width"] is not None:
        lines.append(f"\nA/A noise floor (half-width of its interval): {100 * result['noise_floor_half_width']:.3f}%")
    if result["control_bit_identical"]:
        lines.append("WARNING: the A/A control reproduced stock bit for bit: it measured no noise")
    rep = result.get("reproduction")
    if rep is not None and rep["seeds"]:
        same = sum(v["losses_identical"] and v["held_out_identical"] for v in rep["per_seed"].values())
        lines.append(
            f"{rep['arm']} against the earlier file ({rep.get('file', '?')}): bit-identical at {same} of "
            f"{len(rep['seeds'])} seeds; largest |held-out difference| {100 * rep['max_abs_rel_diff']:.2e}%"
        )
    for p in result["problems"]:
        lines.append(f"PAIRING PROBLEM: {p}")
    return "\n".join(lines)
