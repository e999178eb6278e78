"""Every table the package prints for people, in one place: the plan, the topology and the
end-of-run bytes (aligned columns, ``table``), shared by the main job (``zeropp-hier train``) and
``zeropp-hier plan`` so both print them the same way; and the planner's ranking, its reasons and
a budgeted candidate's kept levels (Markdown, ``markdown``), which ``zeropp-hier plan`` prints.
Pure functions of pure data (``CommPlan``, ``Topology``, predictions, dicts): no torch, no
process groups."""

from __future__ import annotations

from typing import Mapping, Sequence

from ..core import levels
from ..core.plan import CommPlan, Hop
from ..core.topology import Topology
from ..core.vocab import TIERS
from .clusters import GB, ClusterModel
from .memory_per_gcd import fit_advice
from .ranking import Prediction

NUMERIC = set("0123456789.+-eE ")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "  ") -> list[str]:
    """Aligned columns: text left, numbers right, a rule under the header."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def is_num(s: str) -> bool:
        return bool(s) and set(s.split(" ")[0]) <= NUMERIC and any(ch.isdigit() for ch in s)

    # a column of numbers is right-aligned, its header too
    right = [any(is_num(r[i]) for r in cells[1:]) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return indent + "  ".join(c.rjust(w) if rt else c.ljust(w) for c, w, rt in zip(r, widths, right)).rstrip()

    return [line(cells[0]), indent + "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]]


def markdown(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """A Markdown table: a header row, a rule, one row per entry; cells as given."""
    return [_md_row(headers), "|" + "---|" * len(headers), *(_md_row(r) for r in rows)]


def _md_row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _hop_cells(hop: Hop, topo: Topology | None) -> list[object]:
    ranks = topo.axes_size(hop.axes) if topo is not None else ""
    block = hop.block_size if hop.scheme in ("int8", "int4") else ""
    return ["+".join(hop.axes), hop.tier, ranks, hop.scheme, block, "on" if hop.error_feedback else ""]


def plan_lines(plan: CommPlan, topo: Topology | None = None) -> list[str]:
    """One row per hop, in the order they run: forward gather, backward gather, gradient stages."""
    rows: list[list[object]] = []
    for phase, hops in (
        ("forward gather", plan.forward),
        ("backward gather", plan.backward),
        ("grad reduce", plan.reduce),
    ):
        if not hops:
            rows.append([phase, "(none)", "", "", "", "", ""])
        for i, hop in enumerate(hops):
            rows.append([phase if i == 0 else "", *_hop_cells(hop, topo)])
    kept = "none" if plan.kept_axes is None else "+".join(plan.kept_axes)
    head = f"plan: preset {plan.preset}; kept shard spans {kept}"
    return [head, *table(["phase", "hop axes", "tier", "ranks", "scheme", "block", "feedback"], rows)]


def topology_lines(topo: Topology, mode: str = "manual") -> list[str]:
    how = "auto-detected" if mode == "auto" else "declared"
    rm = "identity" if topo.is_identity_map else " ".join(str(r) for r in topo.rank_map or ())
    rows = [
        [tier, n, what]
        for tier, n, what in (
            ("node", topo.num_nodes, "nodes"),
            ("gpu", topo.gpus_per_node, "GPU packages per node"),
            ("gcd", topo.gcds_per_gpu, "GCDs per package"),
        )
    ]
    head = (
        f"topology ({how}): {topo.num_nodes} nodes x {topo.gpus_per_node} GPUs x {topo.gcds_per_gpu} GCDs"
        f" = {topo.world_size} ranks, rank_map {rm}"
    )
    return [head, *table(["tier", "size", "of"], rows)]


def fmt_bytes(x: float) -> str:
    """Bytes in decimal units, three significant digits: '4 MB', '46.1 KB', '1.44 TB'."""
    for unit, div in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.3g} {unit}"
    return f"{x:.0f} B"


def bytes_lines(per_phase: Mapping[str, Mapping[str, float]], title: str) -> list[str]:
    """Bytes per phase (rows) and tier (columns, slowest first), with a total row."""
    tiers = list(reversed(TIERS))
    rows = [[phase, *(fmt_bytes(per[t]) for t in tiers)] for phase, per in per_phase.items()]
    rows.append(["total", *(fmt_bytes(sum(per[t] for per in per_phase.values())) for t in tiers)])
    return [title, *table(["phase", *tiers], rows)]


def prediction_table(preds: Sequence[Prediction]) -> list[str]:
    """The ranked candidates, one row each: step, compute and each phase's seconds, node and gpu
    bytes per step, the dominant tier and memory per GCD."""
    headers = [
        "rank",
        "configuration",
        "step s",
        "compute s",
        "fwd s",
        "bwd s",
        "grad s",
        "node bytes/step",
        "gpu bytes/step",
        "dominant tier",
        "memory/GCD",
        "fits",
    ]
    rows = []
    for i, p in enumerate(preds, 1):
        ph = p.phase_s
        rows.append(
            [
                i,
                p.candidate.name,
                f"{p.step_s:.3g}",
                f"{p.compute_s:.3g}",
                f"{ph['forward_gather']:.3g}",
                f"{ph['backward_gather']:.3g}",
                f"{ph['grad_reduce']:.3g}",
                fmt_bytes(p.tier_bytes["node"]),
                fmt_bytes(p.tier_bytes["gpu"]),
                p.dominant_tier,
                f"{p.memory.total / GB:.1f} GB",
                "yes" if p.memory.fits else "NO",
            ]
        )
    return markdown(headers, rows)


def explain(preds: Sequence[Prediction], cluster: ClusterModel) -> list[str]:
    """Plain-language reasons: the choice, the tier that dominates it, what does not fit."""
    lines = []
    fitting = [p for p in preds if p.memory.fits]
    if not fitting:
        lines.append(
            f"nothing fits in {cluster.memory_per_gcd / GB:.0f} GB per GCD: add nodes (primary, "
            "optimizer and gradient partitions shrink with the world) or reduce activations"
        )
    else:
        best = fitting[0]
        comm_share = best.comm_s / best.step_s
        lines.append(
            f"best: {best.candidate.name} at {best.step_s:.3g} s/step ({comm_share:.0%} communication; "
            f"the {best.dominant_tier} tier takes {best.tier_s[best.dominant_tier]:.3g} s of it)"
        )
        if best.candidate.caveat:
            lines.append(f"  but {best.candidate.name} costs {best.candidate.caveat}")
        for p in fitting[1:3]:
            lines.append(
                f"  {p.candidate.name}: {p.step_s / best.step_s:.2f}x slower; its {p.dominant_tier} "
                f"tier takes {p.tier_s[p.dominant_tier]:.3g} s, node bytes/step "
                f"{fmt_bytes(p.tier_bytes['node'])} vs {fmt_bytes(best.tier_bytes['node'])}"
            )
        if comm_share < 0.2:
            lines.append(
                "  compute dominates: layouts differ little here; hierarchy pays off with fewer "
                "tokens per GCD or slower links (the 'no speedup from ZeRO++' case)"
            )
    for p in preds:
        if not p.memory.fits:
            big = max(p.memory.parts, key=lambda part: p.memory.parts[part])
            lines.append(
                f"does not fit: {p.candidate.name} needs {p.memory.total / GB:.1f} GB per GCD of "
                f"{cluster.memory_per_gcd / GB:.0f} GB; largest part: {big} "
                f"{p.memory.parts[big] / GB:.1f} GB. " + fit_advice(p.candidate.preset)
            )
    return lines


def level_lines(p: Prediction) -> list[str]:
    """A budgeted candidate's kept level per layer and its memory per GCD by part."""
    lp = p.kept_levels
    if lp is None:
        return []
    assert lp.budget_bytes is not None  # level_plan always gives assign a budget
    budget = "what the rest leaves" if p.candidate.fit else f"{p.candidate.kept_gb:g} GB"
    lines = [
        f"{p.candidate.name}: kept copies within {budget} per GCD ({lp.budget_bytes / GB:.1f} GB), "
        f"{lp.kept_bytes / GB:.1f} GB used; {p.candidate.note}".rstrip("; "),
        "",
    ]
    over = {
        "package": "gcd (in the package)",
        "node": "gpu, gcd (in the node)",
        "none": "node, gpu, gcd (the network)",
    }
    runs = [[run, lvl, over[lvl]] for run, lvl in levels.summarize(lp, list(lp.levels))]
    lines += markdown(["layers", "kept level", "backward gathers over"], runs)
    parts = [[k, f"{v / GB:.2f}"] for k, v in p.memory.parts.items()]
    parts.append(["total", f"{p.memory.total / GB:.2f} ({'fits' if p.memory.fits else 'does not fit'})"])
    return [*lines, "", *markdown(["memory part", "GB per GCD"], parts)]


def tick_lines(preds: Sequence[Prediction], cluster: ClusterModel) -> list[str]:
    """Each candidate in the tick mode, hop by hop ([Note: grouped-call rounds] in
    tick_latency.py): how the hop runs (direct or log steps), the peers and ops of its busiest
    sub-hop, its latency per chunk (alphas of its rounds, all sub-hops), the chunks chosen; and
    the distinct peers a rank talks to over its hops."""
    from ..comm.tick import plan as tick_plan
    from .tick_latency import sub_hops

    topo = cluster.topology
    rows, peers = [], {}
    for p in preds:
        if p.mode != "ticks":
            continue
        seen: set[int] = set()
        for c in p.costs:
            kind = tick_plan.GATHER if c.coll.op == "all_gather" else tick_plan.EXCHANGE
            n = topo.axes_size(c.coll.axes)
            subs = sub_hops(n, kind, cluster.library, cluster.hop_steps)
            alpha = cluster.tiers[c.coll.axes[0]].latency
            rows.append(
                [
                    p.candidate.name,
                    c.coll.phase,
                    "+".join(c.coll.axes),
                    n,
                    tick_plan.step_mode(n, cluster.hop_steps, kind),
                    len(subs),
                    max((s.peers for s in subs), default=0),
                    min(max((s.ops for s in subs), default=0), tick_plan.MAX_OPS_PER_CALL),
                    f"{sum(s.alphas for s in subs) * alpha * 1e6:.3g}",
                    p.chunks,
                ]
            )
            for sub in tick_plan.hop_transfers(topo, 0, c.coll.axes, kind, cluster.hop_steps):
                seen |= {q for q, _, _ in sub}
        peers[p.candidate.name] = len(seen)
    if not rows:
        return []
    headers = [
        "configuration",
        "phase",
        "hop",
        "members",
        "steps",
        "ticks",
        "peers",
        "ops/call",
        "latency us",
        "chunks",
    ]
    per = ", ".join(f"{name} {n}" for name, n in peers.items())
    return [
        "TICKS (per hop, one chunk; latency: the tier's alpha per grouped-call round, modelled)",
        *markdown(headers, rows),
        f"distinct peers per rank (rank 0): {per}",
    ]
