"""The tick schedule ([Note: ticks] in comm/tick/plan.py): pure, so checked here on topologies of
every shape the project runs: which hop of which chunk runs in which tick, and that every
transfer a rank posts has its match at its peer in the same tick."""

import pytest

from zeropp_hier.comm.tick import plan as tick_plan
from zeropp_hier.comm.tick.plan import EXCHANGE, GATHER, Slot
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


# -- log-step hops and bounded calls ([Note: log-step hops], [Note: bounded calls]) ----------------

FRONTIER_NODES = 9408  # Frontier: 9,408 nodes x 4 GPUs (MI250X packages) x 2 GCDs


def _pieces(preset, topo):
    from zeropp_hier.comm import gather
    from zeropp_hier.comm.tick import plan_pieces

    plan = make_plan(preset, parse_section({"enabled": True, "preset": preset}).compression, topo)
    return plan_pieces(plan, gather.backward_hops(plan, all_levels=False))


@pytest.mark.parametrize("n", [2, 3, 5, 6, 7, 8, 12, 48])
@pytest.mark.parametrize("kind", [GATHER, EXCHANGE])
def test_log_steps_deliver_every_block_to_its_place(n, kind):
    """Simulate the blocks each member holds through the log steps of ``step_units`` (the rows
    each step moves: the first ones held for a gather, the positions with bit s for an
    all-to-all), then the final rotation: every member ends with the block every other member
    meant for it, having received exactly the rows the schedule counts."""
    steps = tick_plan.step_count(n, tick_plan.LOG)
    assert steps == max(1, (n - 1).bit_length())  # ceil(log2 n)
    if kind == GATHER:
        held = {i: [i] for i in range(n)}  # position j: member i + j's block
    else:
        held = {i: [(i, (i + j) % n) for j in range(n)] for i in range(n)}  # (from, to) at j
    received = dict.fromkeys(range(n), 0)
    for s in range(steps):
        k = 1 << s
        sent = {}
        for i in range(n):
            units = tick_plan.step_units(n, i, kind, tick_plan.LOG, s)
            assert len(units) == 1 and 1 <= len(units[0]) <= 2  # one pair of ops
            out = [(j, rows) for j, rows, _ in units[0] if rows]
            assert len(out) == 1
            to, rows = out[0]
            if kind == GATHER:
                assert to == (i - k) % n and rows == min(k, n - k)
                sent[to] = held[i][:rows]
            else:
                idx = tick_plan.exchange_blocks(n, s)
                assert to == (i + k) % n and rows == len(idx)
                sent[to] = [held[i][j] for j in idx]
        for i in range(n):
            units = tick_plan.step_units(n, i, kind, tick_plan.LOG, s)
            frm, rows = next((j, r) for u in units for j, _, r in u if r)
            assert sent[i] and len(sent[i]) == rows
            received[i] += rows
            if kind == GATHER:
                assert frm == (i + k) % n
                held[i] += sent[i]
            else:
                assert frm == (i - k) % n
                for j, blk in zip(tick_plan.exchange_blocks(n, s), sent[i]):
                    held[i][j] = blk
    for i in range(n):
        if kind == GATHER:
            assert [held[i][(m - i) % n] for m in range(n)] == list(range(n))
            assert received[i] == n - 1  # the same bytes as direct
        else:
            got = [held[i][(i - m) % n] for m in range(n)]  # from member m
            assert got == [(m, i) for m in range(n)]
            assert received[i] == sum(len(tick_plan.exchange_blocks(n, s)) for s in range(steps)) >= n - 1


@pytest.mark.parametrize("n", [3, 5, 6, 12, 48])
@pytest.mark.parametrize("steps", ["direct", "log"])
@pytest.mark.parametrize("preset", ["zero3", "frontier"])
def test_log_step_and_direct_sequences_are_matched_for_any_group_size(n, steps, preset):
    """Node groups that are not powers of two, every piece, 1 and 3 chunks: the whole-world
    matcher finds every send's receive in the same tick and grouped call."""
    topo = Topology.for_world(n * 2 * 2, 2, 2)
    for chunks in (1, 3):
        for name, hops in _pieces(preset, topo).items():
            kind = EXCHANGE if name == "reduce" else GATHER
            seqs = {r: tick_plan.rank_sequence(topo, r, hops, kind, chunks, steps) for r in range(topo.world_size)}
            assert tick_plan.unmatched(seqs) == [], (name, chunks)
            sizes = [topo.axes_size(a) for a in hops]
            want_subs = sum(tick_plan.step_count(k, steps) for k in sizes)
            assert max(x.tick for x in seqs[0]) == chunks + want_subs - 2, (name, chunks)


def test_log_steps_and_direct_move_the_same_gather_rows_and_the_exchange_factor():
    topo = Topology.for_world(48, 1, 1)
    direct = tick_plan.rank_sequence(topo, 5, [("node",)], GATHER, 1, "direct")
    log = tick_plan.rank_sequence(topo, 5, [("node",)], GATHER, 1, "log")
    assert sum(x.recv for x in direct) == sum(x.recv for x in log) == 47
    assert sum(x.send for x in direct) == sum(x.send for x in log) == 47
    assert len({x.peer for x in direct}) == 47 and len({x.peer for x in log}) <= 2 * 6  # i +- 2^s
    ex = tick_plan.rank_sequence(topo, 5, [("node",)], EXCHANGE, 1, "log")
    # forwarded, never summed: about (N/2) log2 N blocks against N - 1
    assert sum(x.recv for x in ex) == sum(len(tick_plan.exchange_blocks(48, s)) for s in range(6)) == 128


def test_the_planners_rule_keeps_small_groups_direct():
    assert tick_plan.step_mode(2) == tick_plan.step_mode(8) == tick_plan.step_mode(32) == tick_plan.DIRECT
    assert tick_plan.step_mode(33) == tick_plan.step_mode(48) == tick_plan.step_mode(9408) == tick_plan.LOG
    # an exchange in log steps forwards more bytes: direct up to 256 members
    assert tick_plan.step_mode(256, kind=EXCHANGE) == tick_plan.DIRECT
    assert tick_plan.step_mode(257, kind=EXCHANGE) == tick_plan.LOG
    assert tick_plan.step_mode(48, "direct") == tick_plan.DIRECT and tick_plan.step_mode(2, "log") == tick_plan.LOG
    with pytest.raises(ValueError, match="hop steps"):
        tick_plan.step_mode(4, "ring")


def test_grouped_calls_are_cut_at_units_below_the_bound():
    assert tick_plan.pack_calls([4, 4, 2], bound=8) == [0, 0, 1]
    assert tick_plan.pack_calls([2] * 5, bound=4) == [0, 0, 1, 1, 2]
    with pytest.raises(ValueError, match="bound"):
        tick_plan.pack_calls([6], bound=4)
    # a direct tick over 48 members at a bound of 64: 94 ops in two calls, still matched
    topo = Topology.for_world(48 * 2, 1, 2)
    seqs = {r: tick_plan.rank_sequence(topo, r, [("node",), ("gcd",)], GATHER, 3, "direct") for r in range(96)}
    assert tick_plan.unmatched(seqs) == []
    per_call: dict = {}
    for x in seqs[0]:
        per_call[(x.tick, x.call)] = per_call.get((x.tick, x.call), 0) + (x.send > 0) + (x.recv > 0)
    assert max(per_call.values()) <= 64 and max(c for _, c in per_call) >= 1


@pytest.mark.parametrize("preset", ["zero3", "zeropp", "frontier"])
def test_at_all_of_frontier_peers_and_ops_per_call_stay_bounded(preset):
    """9,408 nodes x 4 GPUs x 2 GCDs (75,264 ranks), the pure schedule of every piece (forward,
    backward, reduce) at 8 chunks, for a rank at each end and one in the middle: at most 40
    distinct peers per rank and 64 ops per grouped call. Direct, the node hop alone would
    talk to 9,407 nodes in one call of 18,814 ops."""
    topo = Topology.for_world(FRONTIER_NODES * 8, 4, 2)
    pieces = _pieces(preset, topo)
    for rank in (0, topo.world_size // 2 + 3, topo.world_size - 1):
        peers: set[int] = set()
        for name, hops in pieces.items():
            kind = EXCHANGE if name == "reduce" else GATHER
            seq = tick_plan.rank_sequence(topo, rank, hops, kind, 8)
            peers |= {x.peer for x in seq}
            ops: dict = {}
            for x in seq:
                ops[(x.tick, x.call)] = ops.get((x.tick, x.call), 0) + (x.send > 0) + (x.recv > 0)
            assert max(ops.values()) <= tick_plan.MAX_OPS_PER_CALL, (name, max(ops.values()))
        assert rank not in peers
        assert len(peers) <= 40, (preset, rank, len(peers))
