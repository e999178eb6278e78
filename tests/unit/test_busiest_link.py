"""[Note: busiest-link bound] in planner/pipeline.py: auto chooses compression and pipeline chunks
from the busiest link's time; the chunks' staging enters the memory model."""

from dataclasses import replace

import pytest

from zeropp_hier import planner as P


def fair_cluster(ratios, library="gloo"):
    """The fair fight's shape (2 nodes x 4 packages x 2 GCDs) at link ratios gcd:gpu:node."""
    bps = 0.6e6 / 8
    c = P.emulated(node_mbit=0.6, nodes=2, gpus_per_node=4, gcds_per_gpu=2, compute_s=0.0)
    tiers = {t: P.TierLink(r * bps, lat) for t, r, lat in zip(("gcd", "gpu", "node"), ratios, (2e-4, 5e-4, 1e-3))}
    return replace(c, tiers=tiers, memory_per_gcd=8e9, library=library)


WL = replace(P.gpt_workload(3.4e6, 4, 256, 64, 1, weight_bytes=2, vocab=1024), reduce_bucket=786432)


def by_name(preds):
    return {p.candidate.name: p for p in preds}


def test_package_links_carry_the_node_tier_and_bind_at_frontier_ratios():
    c = fair_cluster((16, 4, 1))
    p = P.predict(P.Candidate("frontier", False, "frontier", P.compression_for("frontier")), c, WL)
    assert p.busiest_link == "gpu_out"
    # the node hop's bytes also leave through the package links: a node-only collective loads them
    node_hop = next(k for k in p.costs if k.coll.axes == ("node",) and k.coll.phase == "forward_gather")
    assert node_hop.link_seconds["gpu_out"] > 0 and node_hop.link_seconds["node_out"] > 0
    # the bound is the sum over collectives of each link's seconds, bytes and every chunk's
    # messages' framing ([Note: per-message framing]), and no schedule beats it
    gpu_out = sum(
        k.link_seconds.get("gpu_out", 0.0) + k.frame_link_seconds.get("gpu_out", 0.0) * p.chunks for k in p.costs
    )
    assert sum(k.frame_link_seconds.get("gpu_out", 0.0) for k in p.costs) > 0
    assert p.link_s["gpu_out"] == pytest.approx(gpu_out)
    assert p.link_bound_s <= p.pipelined_comm_s <= p.comm_s


def test_auto_takes_frontier_where_package_links_bind_never_its_int4_and_zeropp_on_flat_links():
    # int4 on the package links moves fewer bytes over the busiest (package) link, and plan ranks
    # it; auto leaves it out ([Note: preset compression defaults]: it costs measured loss)
    c = fair_cluster((16, 4, 1))
    planned = by_name([P.predict(cand, c, WL) for cand in P.default_candidates(c)])
    int8, int4 = planned["frontier"], planned["frontier/gpu-int4"]
    assert int8.candidate.compression.gradients.gpu == "int8" and int4.candidate.compression.gradients.gpu == "int4"
    assert int4.link_bound_s < int8.link_bound_s
    ranked = P.rank_auto(c, WL, P.auto_candidates())
    assert all(p.candidate.compression.gradients.gpu != "int4" for p in ranked if p.candidate.preset == "frontier")
    assert ranked[0].candidate.preset == "frontier"
    # flat links: frontier's exact in-package stage makes the gcd link its busiest; zeropp's is lower
    flat = P.rank_auto(fair_cluster((1, 1, 1)), WL, P.auto_candidates())
    assert flat[0].candidate.name == "zeropp"
    assert by_name(flat)["frontier"].busiest_link == "gcd"


def test_chunks_minimise_the_pipelined_jobs_on_lanes_and_stay_one_on_one_lane():
    c = fair_cluster((16, 4, 1))
    cand = P.Candidate("frontier", False, "frontier", P.compression_for("frontier"))
    p = P.predict(cand, c, WL)
    assert p.chunks > 1
    jobs = P.phase_jobs(p.costs, WL)
    best = min(P.jobs_time(jobs, k) for k in range(1, 65))
    assert P.jobs_time(jobs, p.chunks) == best
    assert P.jobs_time(jobs, p.chunks) < P.jobs_time(jobs, 1)
    # one issuing lane: nothing overlaps, chunks would only add latency
    one_lane = replace(fair_cluster((16, 4, 1), library="rccl"), issue_mode="one_lane")
    assert P.predict(cand, one_lane, WL).chunks == 1
    # a given count is kept, and auto_candidates passes one on
    assert P.predict(cand._replace(chunks=3), c, WL).chunks == 3
    assert {p.chunks for p in P.rank_auto(c, WL, P.auto_candidates(chunks=1))} == {1}


def test_pipeline_staging_is_counted_and_bounded():
    c = fair_cluster((16, 4, 1))
    cand = P.Candidate("frontier", False, "frontier", P.compression_for("frontier"))
    one = P.memory(cand, c, WL, chunks=1)
    four = P.memory(cand, c, WL, chunks=4)
    assert "pipeline staging" not in one.parts
    extra = four.parts["pipeline staging"]
    assert four.total - one.total == pytest.approx(extra)
    bucket = min(WL.reduce_bucket, WL.params)
    # the stated bound: one gathered bucket + one fp32 copy of a gradient bucket's rows + each
    # stage's running chunk staging
    assert extra == pytest.approx(
        WL.weight_bytes * WL.largest_layer_params + 4 * bucket + 4 * P.CHUNK_STAGING_COPIES * 3 * bucket / 4
    )
    assert P.pipeline_staging(WL, 8, 3) < P.pipeline_staging(WL, 4, 3)  # smaller chunks, less running


def test_chunks_follow_the_issue_mode():
    """[Note: busiest-link bound]: the planner chooses ``pipeline.chunks`` for the issue mode it
    models (``ClusterModel.issue_mode``; None: the library's default): the jobs in ticks where
    ticks run, 1 hop after hop on one lane, and the mode decides what ``auto`` ranks by."""
    cand = P.Candidate("frontier", False, "frontier", P.compression_for("frontier"))
    assert fair_cluster((16, 4, 1)).mode == "lanes" and fair_cluster((16, 4, 1), library="rccl").mode == "one_lane"
    ticks = replace(fair_cluster((16, 4, 1), library="rccl"), issue_mode="ticks")
    p = P.predict(cand, ticks, WL)
    jobs = P.phase_jobs(p.costs, WL)
    assert p.chunks > 1
    assert P.jobs_time(jobs, p.chunks, "ticks") == min(P.jobs_time(jobs, k, "ticks") for k in range(1, 65))
    assert P.jobs_time(jobs, p.chunks, "ticks") < P.jobs_time(jobs, 1, "ticks")
    # one chunk in ticks is hop after hop, each hop paying one exchange step's latency, not a
    # ring's k - 1 ([Note: tick latency])
    by_hand = sum(j.calls * (sum(j.hop_s) + sum(j.tick_latency_s) + sum(j.frame_s)) for j in jobs)
    assert P.jobs_time(jobs, 1, "ticks") == pytest.approx(by_hand)
    assert P.jobs_time(jobs, 1, "ticks") < P.jobs_time(jobs, 1, "one_lane")
    assert p.mode == "ticks" and P.rank_key(p) == p.pipelined_comm_s >= p.link_bound_s
    one = replace(ticks, issue_mode="one_lane")
    q = P.predict(cand, one, WL)
    assert q.mode == "one_lane" and q.chunks == 1 and P.rank_key(q) == q.comm_s
    # ticks overlap the tiers inside a job only: never faster than lanes, never slower than one lane
    lanes = P.predict(cand, replace(ticks, issue_mode="lanes"), WL)
    assert lanes.pipelined_comm_s <= p.pipelined_comm_s <= q.comm_s
    with pytest.raises(ValueError, match="issue_mode = 'gpu'"):
        replace(ticks, issue_mode="gpu")


def test_without_a_set_mode_each_candidate_runs_as_overlap_true_resolves_for_its_plan():
    """``ClusterModel.issue_mode`` None: on NCCL/RCCL a plan whose every hop spans one tier
    (frontier) runs ticks, one whose hops cross tiers (zeropp, zero3) one lane, as comm/issue.py
    resolves ``overlap: true``; stock DeepSpeed and gloo keep the library's default."""
    rccl, gloo = fair_cluster((16, 4, 1), library="rccl"), fair_cluster((16, 4, 1))
    preds = {p.candidate.name: p for p in P.rank_auto(rccl, WL, P.auto_candidates())}
    assert {n for n, p in preds.items() if p.mode == "ticks"} == {n for n in preds if n.startswith("frontier")}
    assert preds["zeropp"].mode == preds["zero3"].mode == "one_lane" and preds["zeropp"].chunks == 1
    assert all(P.one_tier_plan(p.candidate, rccl) == (p.mode == "ticks") for p in preds.values())
    stock = next(c for c in P.default_candidates(rccl) if c.stock)
    assert P.issue_mode_of(stock, rccl) == rccl.mode == "one_lane"
    assert {p.mode for p in P.rank_auto(gloo, WL, P.auto_candidates())} == {"lanes"}


def test_a_tick_pays_one_exchange_step_so_chunks_pay_at_frontier_scale():
    """[Note: tick latency]: a tick sends a hop's rows to every member at once, so each hop in a
    tick pays its tier's alpha once, where a ring pays it k - 1 times. At Frontier's rates and
    alphas, 20B at 48 nodes, the tick mode then gains from chunks (counting ring steps, the node
    hop's 47 alphas per chunk made one chunk look best)."""
    from zeropp_hier.planner.workload import gpt_workload

    wl = gpt_workload(20e9, 44, 6144, 2048, 1)
    ticks = replace(P.frontier(48), issue_mode="ticks")
    cand = P.Candidate("frontier", False, "frontier", P.compression_for("frontier"))
    p = P.predict(cand, ticks, wl)
    for c in p.costs:
        k = ticks.topology.axes_size(c.coll.axes)
        alpha = ticks.tiers[c.coll.axes[0]].latency
        calls = c.latency_seconds / (
            alpha * (k - 1) * (2 if c.coll.op == "reduce_scatter" and ticks.library == "gloo" else 1)
        )
        assert c.step_latency_seconds == pytest.approx(alpha * calls)
        if k > 2:
            assert c.step_latency_seconds < c.latency_seconds
    jobs = P.phase_jobs(p.costs, wl)
    assert p.chunks > 1
    assert P.jobs_time(jobs, p.chunks, "ticks") < P.jobs_time(jobs, 1, "ticks")
    assert p.link_bound_s <= p.pipelined_comm_s < p.comm_s
