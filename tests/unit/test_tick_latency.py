"""The planner's cost of a hop in the tick mode ([Note: grouped-call rounds] in
planner/tick_latency.py, [Note: tick latency] in planner/pipeline.py): rounds of a grouped call
from the libraries' p2p batching, log-step sub-hops, and the chunk choice they lead to on
Frontier's model. Pure arithmetic; nothing here ran on a GPU."""

from dataclasses import replace

import pytest

from zeropp_hier import planner as P
from zeropp_hier.comm.tick import plan as tick_plan
from zeropp_hier.planner import tick_latency as T
from zeropp_hier.planner.workload import gpt_workload

WL = gpt_workload(20e9, 44, 6144, 2048, 1)  # the 20B GPT of the paper's 48-node run
CAND = P.Candidate("frontier", False, "frontier", P.compression_for("frontier"))


def test_rounds_follow_each_librarys_p2p_items_per_channel_batch():
    # RCCL: one p2p work item per channel batch, 8 channels: 47 peers take 6 rounds
    assert T.rounds(47, "rccl") == 6 and T.rounds(8, "rccl") == 1 and T.rounds(9, "rccl") == 2
    assert T.rounds(9407, "rccl") == 1176
    # NCCL: 8 items per batch, so 64 peers per round over 8 channels
    assert T.rounds(47, "nccl") == 1 and T.rounds(65, "nccl") == 2
    assert T.rounds(47, "gloo") == 1 and T.rounds(0, "rccl") == 0


@pytest.mark.parametrize("n", [3, 6, 48, 9408])
def test_sub_hops_are_the_runtimes_steps(n):
    """The planner's sub-hops are the schedule's own: as many as ``step_count``, the gather's
    shares summing to one (the same bytes as direct), the exchange's to its forwarding factor."""
    g = T.sub_hops(n, tick_plan.GATHER, "rccl", "log")
    assert len(g) == tick_plan.step_count(n, tick_plan.LOG) == (n - 1).bit_length()
    assert sum(s.share for s in g) == pytest.approx(1.0)
    assert all(s.alphas == 1 and s.peers <= 2 and s.ops == 2 for s in g)
    e = T.sub_hops(n, tick_plan.EXCHANGE, "rccl", "log")
    assert sum(s.share for s in e) == pytest.approx(T.exchange_factor(n, "log"))
    assert T.exchange_factor(n, "log") >= 1 and (T.exchange_factor(n, "log") > 1) == (n > 3)
    d = T.sub_hops(n, tick_plan.GATHER, "rccl", "direct")
    calls = -(-2 * (n - 1) // tick_plan.MAX_OPS_PER_CALL)
    assert len(d) == 1 and d[0].peers == n - 1 and d[0].alphas == T.rounds(n - 1, "rccl") + calls - 1


@pytest.mark.parametrize("nodes", [48, 1024])
def test_on_frontier_log_steps_beat_direct_ticks_and_chunks_are_rechosen(nodes):
    """Frontier in ticks, the 20B GPT: the default layout (log-step node gathers, and at 1,024
    nodes log-step exchanges) predicts less communication than every hop direct, each at the
    chunk count the planner chooses for it."""
    ticks = replace(P.frontier(nodes), issue_mode="ticks")
    auto = P.predict(CAND, ticks, WL)
    direct = P.predict(CAND, replace(ticks, hop_steps="direct"), WL)
    assert auto.pipelined_comm_s < direct.pipelined_comm_s
    jobs = P.phase_jobs(auto.costs, WL, ticks)
    assert P.jobs_time(jobs, auto.chunks, "ticks") == min(P.jobs_time(jobs, k, "ticks") for k in range(1, 65))
    # the node gather is ceil(log2 nodes) sub-hops of the forward job
    fwd = next(j for j in jobs if j.phase == "forward_gather")
    assert sum(1 for lane in fwd.lanes if lane == ("node",)) == (nodes - 1).bit_length()


def test_the_exchange_forwarding_is_charged_on_the_links():
    """A log-step all-to-all forwards blocks: forced at 48 nodes, the busiest-link bound rises
    by the forwarded bytes, which is why ``auto`` keeps exchanges direct up to 256 members."""
    ticks = replace(P.frontier(48), issue_mode="ticks")
    auto = P.predict(CAND, ticks, WL)
    log = P.predict(CAND, replace(ticks, hop_steps="log"), WL)
    assert log.link_bound_s > auto.link_bound_s
    assert auto.pipelined_comm_s < log.pipelined_comm_s
