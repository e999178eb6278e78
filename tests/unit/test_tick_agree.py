"""The tick schedule's start-up check at Frontier's size ([Note: tick agreement]): what one rank
computes is bounded by its own peers, not by the world, and the digest covers every input."""

import pytest

from zeropp_hier.comm import gather
from zeropp_hier.comm.tick import agree as tick_agree
from zeropp_hier.comm.tick import plan as tick_plan
from zeropp_hier.comm.tick import plan_pieces
from zeropp_hier.core.config import parse_section
from zeropp_hier.core.plan import make_plan
from zeropp_hier.core.topology import Topology

FRONTIER = Topology(9408, 4, 2)  # all of Frontier: 9,408 nodes x 4 MI250X x 2 GCDs


def _pieces(preset, topo):
    plan = make_plan(preset, parse_section({"enabled": True, "preset": preset}).compression, topo)
    return plan_pieces(plan, gather.backward_hops(plan, all_levels=False))


@pytest.mark.parametrize("preset", ["frontier", "zeropp", "zero3"])
@pytest.mark.parametrize("rank", [0, 37_123, 75_263])
def test_one_ranks_check_at_9408_nodes_is_bounded_by_its_peers(preset, rank):
    pieces = _pieces(preset, FRONTIER)
    problems, computed, peers = tick_agree.own_transfers_matched(FRONTIER, rank, pieces, 8, tick_plan.AUTO)
    assert problems == []
    own = {
        name: tick_plan.rank_sequence(
            FRONTIER, rank, hops, tick_plan.EXCHANGE if name == "reduce" else tick_plan.GATHER, 8
        )
        for name, hops in pieces.items()
    }
    # the rank's own sequences and one per actual peer of each piece, nothing for the rest of a group
    bound = sum(len(seq) * (1 + len({x.peer for x in seq})) for seq in own.values())
    assert computed <= bound
    # the peers the connection warm-up opens: those of the own sequences, at most 40 ([Note: log-step hops])
    assert set(peers) == {x.peer for seq in own.values() for x in seq} - {rank} and len(peers) <= 40
    assert computed <= 40_000  # about 17-20 thousand (tuples) at 8 chunks: a few MB, under a second
    # the old check recomputed every member of the rank's hop groups: the node hop alone is 9,408 ranks
    members = {p for hops in pieces.values() for axes in hops for p in FRONTIER.peers(rank, axes)}
    assert len(members) >= 9408 and computed < len(members) * 3


def test_the_digest_covers_every_input():
    topo = Topology(8, 2, 2)
    pieces = _pieces("frontier", topo)
    d = tick_agree.inputs_digest(topo, pieces, 8, "auto")
    assert 0 <= d < 1 << tick_agree.DIGEST_BITS
    assert d == tick_agree.inputs_digest(Topology(8, 2, 2), _pieces("frontier", Topology(8, 2, 2)), 8, "auto")
    others = [
        tick_agree.inputs_digest(topo, pieces, 4, "auto"),
        tick_agree.inputs_digest(topo, pieces, 8, "log"),
        tick_agree.inputs_digest(Topology(8, 2, 2, tuple(reversed(range(32)))), pieces, 8, "auto"),
        tick_agree.inputs_digest(topo, _pieces("zeropp", topo), 8, "auto"),
    ]
    assert d not in others and len(set(others)) == len(others)


@pytest.mark.parametrize("n", range(1, 70))
def test_exchange_block_count_is_the_positions_counted(n):
    for step in range(8):
        assert tick_plan.exchange_block_count(n, step) == len(tick_plan.exchange_blocks(n, step))


@pytest.mark.parametrize("axes", [("node",), ("gpu",), ("gcd",), ("gpu", "gcd"), ("node", "gpu", "gcd")])
def test_hop_group_and_place_equal_the_topologys_peers(axes):
    topo = Topology(3, 2, 2, tuple((5 * r + 1) % 12 for r in range(12)))
    for rank in range(12):
        group = topo.peers(rank, axes)
        assert tick_plan.hop_group(topo, rank, axes) == group
        assert tick_plan.place_in_group(topo, rank, axes) == group.index(rank)
