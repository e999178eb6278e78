"""docs/benchmarks.md's bytes tables: KB per rank and step by phase and tier from bytes_per_tier.json
(the payload view and the link view), and MB per step and phase on the node uplinks of the
cross-shape run at 8 × 1 × 2 (its unshaped pass; the bytes do not depend on the rates)."""

from __future__ import annotations

from . import emulated, fmt, sources

PER_TIER = f"{sources.RESULTS}/bytes_per_tier.json"
PHASES = ("forward_gather", "backward_gather", "grad_reduce")
SHORT = {"forward_gather": "fwd", "backward_gather": "bwd", "grad_reduce": "grad"}
TIERS = ("node", "gpu", "gcd")


def _per_tier(key: str) -> str:
    doc = sources.load(PER_TIER)[key]
    header = ["preset"] + [f"{SHORT[p]} {t}" for p in PHASES for t in TIERS] + ["node total"]
    body = [
        [name] + [fmt.kb(v[p][t]) for p in PHASES for t in TIERS] + [fmt.kb(sum(v[p]["node"] for p in PHASES))]
        for name, v in doc.items()
    ]
    return fmt.table(header, body) + "\n" + sources.cite([PER_TIER]) + "\n"


def payload_view() -> str:
    return _per_tier("bytes_per_step_per_rank")


def link_view() -> str:
    return _per_tier("link_bytes_per_step_per_rank")


def phases_8x1x2() -> str:
    path = f"{sources.RESULTS}/compare_shapes_rerun_8x1x2.json"
    run = sources.load(path)
    header = ["shape", "configuration", "phase", "payload view MB node / gpu / gcd", "link view MB node / gpu / gcd"]
    body = []
    for name in ("zeropp", "frontier"):
        r = emulated.phase(run, "unshaped")[name]
        for p in PHASES:
            pay, link = r["phase_stats_per_step"][p], r["phase_link_stats_per_step"][p]
            body.append(
                [
                    emulated.shape_label(run),
                    f"`{name}`",
                    p,
                    " / ".join(fmt.mb(pay[t]) for t in TIERS),
                    " / ".join(fmt.mb(link[t]) for t in TIERS),
                ]
            )
        wire, total = r["wire_per_step"], r["link_stats_per_step"]
        body.append(
            [
                emulated.shape_label(run),
                f"`{name}`",
                "**wire** (counters) / link view total",
                " / ".join(fmt.mb(wire[t]) for t in TIERS),
                " / ".join(fmt.mb(total[t]) for t in TIERS),
            ]
        )
    return fmt.table(header, body) + "\n" + sources.cite([path]) + "\n"
