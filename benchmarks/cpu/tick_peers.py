"""The tick mode's peers and ops per grouped call for one rank on all of Frontier (9,408 nodes x 4
packages x 2 GCDs = 75,264 ranks), by the pure schedule (comm/tick/plan.py) of every piece
(forward, backward, reduce) at the default chunks, for a rank at each end and one in the middle:
the figures docs/design.md's scale table quotes. ``python -m benchmarks.cpu.tick_peers`` writes
``benchmarks/results/tick_peers.json``; tests/unit/test_tick_plan.py asserts the bounds (40
peers, 64 ops per call) at the same ranks. Pure arithmetic: nothing is sent."""

from __future__ import annotations

import argparse
import sys

from benchmarks.tables.provenance import run_meta
from zeropp_hier.comm import gather
from zeropp_hier.comm.issue import DEFAULT_TICK_CHUNKS
from zeropp_hier.comm.tick import plan_pieces
from zeropp_hier.comm.tick.plan import EXCHANGE, GATHER, rank_sequence
from zeropp_hier.core.config import parse_section
from zeropp_hier.core.plan import make_plan
from zeropp_hier.core.topology import Topology
from zeropp_hier.files import write_json_atomic

FRONTIER = (9408, 4, 2)
PRESETS = ("frontier", "zeropp", "zero3")


def rank_counts(preset: str, topo: Topology, rank: int, chunks: int) -> tuple[int, int]:
    """(distinct peers, most ops in one grouped call) of ``rank``'s tick transfers in every piece."""
    plan = make_plan(preset, parse_section({"enabled": True, "preset": preset}).compression, topo)
    peers: set[int] = set()
    most = 0
    for name, hops in plan_pieces(plan, gather.backward_hops(plan, all_levels=False)).items():
        seq = rank_sequence(topo, rank, hops, EXCHANGE if name == "reduce" else GATHER, chunks)
        peers |= {x.peer for x in seq}
        ops: dict[tuple[int, int], int] = {}
        for x in seq:
            ops[x.tick, x.call] = ops.get((x.tick, x.call), 0) + (x.send > 0) + (x.recv > 0)
        most = max(most, *ops.values())
    return len(peers - {rank}), most


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results/tick_peers.json")
    args = ap.parse_args(argv)
    topo = Topology(*FRONTIER)
    ranks = (0, topo.world_size // 2 + 3, topo.world_size - 1)
    rows = {}
    for preset in PRESETS:
        counts = {r: rank_counts(preset, topo, r, DEFAULT_TICK_CHUNKS) for r in ranks}
        rows[preset] = {str(r): {"peers": p, "max_ops_per_call": o} for r, (p, o) in counts.items()}
        print(f"{preset}: " + ", ".join(f"rank {r}: {p} peers, <= {o} ops per call" for r, (p, o) in counts.items()))
    conditions = {"nodes": FRONTIER[0], "packages_per_node": FRONTIER[1], "gcds_per_package": FRONTIER[2]}
    conditions |= {"ranks": topo.world_size, "chunks": DEFAULT_TICK_CHUNKS, "pure": True}
    write_json_atomic(args.out, {"meta": run_meta(conditions), "ranks": list(ranks), "presets": rows}, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
