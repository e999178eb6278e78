"""The tick schedule ([Note: ticks] in comm/tick_plan.py): pure, so checked here on topologies of
every shape the project runs: which hop of which chunk runs in which tick, and that every
transfer a rank posts has its match at its peer in the same tick."""

import pytest

from zeropp_hier.comm import tick_plan
from zeropp_hier.comm.tick_plan import EXCHANGE, GATHER, Slot
from zeropp_hier.core.config import parse_section
from zeropp_hier.core.plan import make_plan
from zeropp_hier.core.topology import Topology


def test_tick_t_carries_hop_h_of_chunk_t_minus_h():
    got = tick_plan.ticks([3, 3, 3, 3])  # four chunks over node, gpu, gcd
    assert len(got) == 4 + 3 - 1  # fill and drain
    assert got[0] == [Slot(0, 0)]
    assert got[2] == [Slot(0, 2), Slot(1, 1), Slot(2, 0)]  # three tiers at once, chunk order
    assert got[5] == [Slot(3, 2)]
    for t, slots in enumerate(got):
        assert all(s.chunk + s.hop == t for s in slots)
    # every hop of every chunk exactly once, each after its previous hop
    seen = [s for slots in got for s in slots]
    assert sorted(seen) == [Slot(c, h) for c in range(4) for h in range(3)]


def test_one_job_of_many_hops_runs_one_hop_per_tick_and_empty_chunks_are_refused():
    assert tick_plan.ticks([5]) == [[Slot(0, h)] for h in range(5)]
    assert tick_plan.ticks([]) == []
    with pytest.raises(ValueError, match="without hops"):
        tick_plan.ticks([2, 0])


@pytest.mark.parametrize("dims", [(2, 2, 2), (2, 4, 2), (3, 2, 2), (1, 2, 2), (2, 1, 2)])
@pytest.mark.parametrize("preset", ["zero3", "zeropp", "frontier"])
@pytest.mark.parametrize("chunks", [1, 4])
def test_every_transfer_is_matched_at_its_peer(dims, preset, chunks):
    nodes, gpus, gcds = dims
    topo = Topology.for_world(nodes * gpus * gcds, gpus, gcds)
    plan = make_plan(preset, parse_section({"enabled": True, "preset": preset}).compression, topo)
    pieces = {"forward": [h.axes for h in plan.forward], "reduce": [h.axes for h in plan.reduce]}
    for name, hops in pieces.items():
        kind = EXCHANGE if name == "reduce" else GATHER
        seqs = {r: tick_plan.rank_sequence(topo, r, hops, kind, chunks) for r in range(topo.world_size)}
        assert tick_plan.unmatched(seqs) == []
        for r, seq in seqs.items():
            # one transfer per peer of each hop group per chunk: the collective's own fan-out
            want = chunks * sum(topo.axes_size(axes) - 1 for axes in hops)
            assert len(seq) == want, (name, r)
            # within a tick, at most one transfer per peer: no two messages to match in order
            per_tick = [(x.tick, x.peer) for x in seq]
            assert len(per_tick) == len(set(per_tick)), (name, r)


def test_a_broken_sequence_is_reported():
    topo = Topology.for_world(8, 2, 2)
    seqs = {r: tick_plan.rank_sequence(topo, r, [("node",), ("gpu",)], GATHER, 2) for r in range(8)}
    x = seqs[3].pop()  # rank 3 forgets its last transfer
    bad = tick_plan.unmatched(seqs)
    assert bad and any(f"rank {x.peer} tick {x.tick} peer 3" in b for b in bad)
