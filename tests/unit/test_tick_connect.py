"""The connection warm-up's order and bound, pure ([Note: connections before the first step])."""

import itertools
import random

import pytest

from zeropp_hier.comm import gather
from zeropp_hier.comm.tick import agree as tick_agree
from zeropp_hier.comm.tick import connect as tick_connect
from zeropp_hier.comm.tick import plan_pieces
from zeropp_hier.core.config import parse_section
from zeropp_hier.core.plan import make_plan
from zeropp_hier.core.topology import Topology


def test_both_ends_of_a_pair_share_its_key_and_calls_are_bounded():
    world = 64
    rng = random.Random(5)
    peers = {r: set() for r in range(world)}
    for a, b in rng.sample(list(itertools.combinations(range(world), 2)), 400):
        peers[a].add(b)
        peers[b].add(a)
    for r in range(world):
        calls = tick_connect.warmup_calls(r, sorted(peers[r]), world, 5)
        flat = [p for c in calls for p in c]
        assert sorted(flat) == sorted(peers[r]) and all(1 <= len(c) <= 5 for c in calls)
        keys = [tick_connect.pair_key(r, p, world) for p in flat]
        assert keys == sorted(keys)
    assert tick_connect.pair_key(3, 60, 64) == tick_connect.pair_key(60, 3, 64) == (7, 3, 60)


def _finishes(calls: dict[int, list[list[int]]]) -> bool:
    """Simulated: each rank waits on its current call until every pair in it has been posted by
    both ends (a pair completes only when both ends have it in their current call)."""
    at = dict.fromkeys(calls, 0)
    done: set[tuple[int, int]] = set()
    while True:
        posted = {(r, p) for r in calls if at[r] < len(calls[r]) for p in calls[r][at[r]]}
        done |= {(min(r, p), max(r, p)) for r, p in posted if (p, r) in posted}
        moved = False
        for r in calls:
            if at[r] < len(calls[r]) and all((min(r, p), max(r, p)) in done for p in calls[r][at[r]]):
                at[r] += 1
                moved = True
        if not moved:
            return all(at[r] == len(calls[r]) for r in calls)


def test_the_order_cannot_deadlock():
    world = 40
    rng = random.Random(11)
    peers: dict[int, set[int]] = {r: set() for r in range(world)}
    for a, b in rng.sample(list(itertools.combinations(range(world), 2)), 300):
        peers[a].add(b)
        peers[b].add(a)
    for per_call in (1, 3, 16):
        assert _finishes({r: tick_connect.warmup_calls(r, sorted(peers[r]), world, per_call) for r in range(world)})
    # the simulation can fail: each rank taking its peers in ring order from itself deadlocks
    ring = {r: [[(r + d) % 3] for d in (1, 2)] for r in range(3)}
    assert not _finishes(ring)


@pytest.mark.parametrize("rank", [0, 75_263])
def test_at_9408_nodes_a_rank_opens_a_few_dozen_connections_in_a_few_calls(rank):
    topo = Topology(9408, 4, 2)
    plan = make_plan("frontier", parse_section({"enabled": True, "preset": "frontier"}).compression, topo)
    pieces = plan_pieces(plan, gather.backward_hops(plan, all_levels=False))
    peers = tick_agree.own_transfers_matched(topo, rank, pieces, 8, "auto")[2]
    calls = tick_connect.warmup_calls(rank, peers, topo.world_size)
    assert len(peers) <= 40 and len(calls) <= 3
    assert max(2 * len(c) for c in calls) <= 64  # ops per grouped call, as the ticks' own bound


def test_the_error_names_rank_peers_tiers_and_the_fix():
    e = tick_connect.TickConnectError(
        rank=3, silent=[9], lost=[12], tiers={9: "node", 12: "gpu"}, timeout_s=5.0, cause="Connection closed by peer"
    )
    text = str(e)
    assert "rank 3 could not connect" in text and "peer ranks [9] did not answer within" in text
    assert "peer ranks [12] closed their connection" in text and "node: [9]" in text and "gpu: [12]" in text
    assert "Check the network" in text and "Cause: Connection closed by peer" in text
    import pickle

    assert str(pickle.loads(pickle.dumps(e))) == text  # crosses the rank's result pipe whole
