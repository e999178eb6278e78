"""Plain-text tables for people: the plan, the topology and the end-of-run bytes, shared by the
main job (``zeropp-hier train``) and ``zeropp-hier plan`` so both print them the same way.
Pure functions of pure data (``CommPlan``, ``Topology``, dicts): no torch, no process groups."""

from __future__ import annotations

from typing import Mapping, Sequence

from ..core.plan import CommPlan, Hop
from ..core.topology import Topology
from ..core.vocab import TIERS

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
