"""The tick mode's connection warm-up on real gloo ranks (8 ranks, 2 nodes x 2 GPUs x 2 GCDs):
every tick peer connected before the first step in bounded grouped calls, and a peer that never
answers (or dies) named by the ranks that wait on it ([Note: connections before the first step]
in comm/tick/connect.py)."""

import re

import pytest

from zeropp_hier.app.spec import ds_config
from zeropp_hier.comm import gather
from zeropp_hier.comm.tick import agree as tick_agree
from zeropp_hier.comm.tick import plan_pieces
from zeropp_hier.comm.tick.connect import warmup_calls
from zeropp_hier.core.config import parse_section
from zeropp_hier.core.plan import make_plan
from zeropp_hier.core.topology import Topology

from . import ranks_startup
from .test_failures import BOUND_S, broken_world, processes_of

TIMEOUT_S = 5.0
_CONNECT = re.compile(r"TickConnectError: zeropp_hier: rank (\d+) could not connect to its tick peers")


def _peers_of(rank: int, chunks: int) -> set[int]:
    """The victim's tick peers, by the pure start-up code, as the engine below computes them."""
    topo = Topology.for_world(8, 2, 2)  # ds_config's frontier: 2 x 2 x 2, identity map
    plan = make_plan("frontier", parse_section({"enabled": True, "preset": "frontier"}).compression, topo)
    pieces = plan_pieces(plan, gather.backward_hops(plan, all_levels=False))
    return set(tick_agree.own_transfers_matched(topo, rank, pieces, chunks, "auto")[2])


@pytest.mark.parametrize("per_call", [16, 1])
def test_every_tick_peer_is_connected_in_bounded_grouped_calls(bare8, per_call):
    results = bare8.run(ranks_startup.agree_and_connect, ranks_startup.RANK_MAP, per_call)
    assert len({r["digest"] for r in results}) == 1
    for rank, r in enumerate(results):
        assert r["peers"] and rank not in r["peers"], r
        # one send and one receive per peer, in grouped calls of at most per_call peers
        assert r["calls"] == len(r["ops"]) == -(-len(r["peers"]) // per_call), (rank, r)
        assert max(len(ops) for ops in r["ops"]) <= 2 * per_call
        posted = sorted((name, p) for ops in r["ops"] for name, p in ops)
        assert posted == sorted([("irecv", p) for p in r["peers"]] + [("isend", p) for p in r["peers"]])
        # each rank is among each of its peers' peers (the agreed schedule is symmetric)
        for p in r["peers"]:
            assert rank in results[p]["peers"], (rank, p)
        assert [p for call in warmup_calls(rank, r["peers"], 8, per_call) for p in call] == [
            p for ops in r["ops"] for name, p in ops if name == "isend"
        ]


@pytest.mark.parametrize("how", ["stall", "die"])
def test_a_peer_that_never_answers_the_warm_up_is_named_by_every_rank_waiting_on_it(how):
    cfg = ds_config("frontier")
    cfg["zeropp_hier"].update(overlap="ticks", pipeline={"chunks": 3}, collective_timeout_s=TIMEOUT_S)
    victim = 5
    world, err = broken_world(8, ranks_startup.warmup_fails, cfg, victim, how)
    waiting = _peers_of(victim, 3)
    assert waiting and len(waiting) < 7  # some ranks never exchange with the victim
    for rank in waiting:
        text = err.failures[rank]
        m = _CONNECT.search(text)
        assert m is not None and int(m[1]) == rank, f"rank {rank}:\n{text}"
        if how == "stall":
            assert f"peer ranks [{victim}] did not answer within collective_timeout_s = 5 s" in text, text
        else:
            assert f"peer ranks [{victim}] closed their connection" in text, text
        assert "Check the network" in text and "relaunch" in text, text
        assert re.search(rf"by tier: (node|gpu|gcd): \[{victim}\]", text), text
    if how == "stall":
        assert err.killed == [victim], err.killed  # only the stopped rank needed the launcher
    else:
        assert "killed by SIGKILL" in err.failures[victim] and err.killed == [], err.killed
    for rank in range(8):
        if rank != victim:
            assert rank in err.failures, f"rank {rank} went on as if nothing had failed"
            assert err.exit_after_s[rank] <= BOUND_S, (rank, err.exit_after_s)
    assert processes_of(world) == [], "a process of the failed world is still running"
