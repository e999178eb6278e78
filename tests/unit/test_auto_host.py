"""``auto``'s host term, pure parts ([Note: host term] in zeropp_hier/planner/host.py): the ops
each candidate's issuing thread issues per step, counted from the planner's own jobs and plan;
how host and link time combine per library and issue mode; the ranking with a host term; the
``auto.host`` config section; the unshaped benchmark's summary."""

import dataclasses
import math

import pytest

from benchmarks.compare import cross_shapes
from zeropp_hier import planner as P
from zeropp_hier.core.config import HOST_KEYS, parse_section
from zeropp_hier.core.errors import HierConfigError
from zeropp_hier.core.plan import make_plan

FAST = {t: P.TierLink(1e15, 0.0) for t in ("gcd", "gpu", "node")}  # links that never bind


def _cluster(nodes=2, gpus=4, library="gloo", tiers=None, **kw):
    cl = P.emulated(nodes=nodes, gpus_per_node=gpus, gcds_per_gpu=2, quant_rate=1e12)
    return dataclasses.replace(cl, library=library, tiers=tiers or cl.tiers, efficiency=1.0, **kw)


def _wl(layers=4, params=4e6, bucket=1e6, kept=0.0):
    return P.Workload(
        params=params,
        tokens_per_gcd=1,
        gathers_per_pass=layers,
        layers=layers,
        reduce_bucket=bucket,
        kept_at_turn=kept,
    )


def _cand(name):
    return next(c for c in P.auto_candidates() if c.name == name)


def _hops(cand, cluster):
    """Hops per phase of the candidate's plan (forward, the kept copy's backward, reduce)."""
    plan = make_plan(cand.preset, cand.compression, cluster.topology)
    backward = plan.backward_for(plan.kept_axes) if plan.kept_axes is not None else plan.forward
    return {"forward_gather": plan.forward, "backward_gather": backward, "grad_reduce": plan.reduce}


def test_jobs_follow_the_schedule_a_job_per_layer_and_bucket():
    wl = _wl(layers=6, params=6e6, bucket=2.5e6, kept=2e6)  # 2 of 6 layers held at the turn
    assert P.jobs_per_phase(wl) == {"forward_gather": 6, "backward_gather": 4, "grad_reduce": 3}


def test_one_lane_issues_a_collective_per_hop_and_job():
    cl, wl = _cluster(), _wl()
    jobs = P.jobs_per_phase(wl)
    for name in ("zero3", "zeropp"):
        cand = _cand(name)
        p = P.predict(cand, dataclasses.replace(cl, issue_mode="one_lane"), wl)
        work = P.host_work(p.costs, 1, "one_lane", cl, wl)
        want = sum(
            jobs[ph] * len([h for h in hops if cl.topology.axes_size(h.axes) > 1])
            for ph, hops in _hops(cand, cl).items()
        )
        assert work.collectives == want > 0 and work.p2p_ops == work.ticks == 0, (name, work)


def test_ticks_post_a_send_and_a_receive_per_peer_of_each_direct_hop():
    # frontier at 2 x 4 x 2: every hop direct (small groups), so a chunk's ops are 2 (k - 1) per hop
    cl, wl = _cluster(), _wl()
    cand = _cand("frontier")
    p = P.predict(cand, dataclasses.replace(cl, issue_mode="ticks"), wl)
    jobs = P.jobs_per_phase(wl)
    hops = _hops(cand, cl)
    per_chunk = {ph: sum(2 * (cl.topology.axes_size(h.axes) - 1) for h in hs) for ph, hs in hops.items()}
    for chunks in (1, 3, 8):
        work = P.host_work(p.costs, chunks, "ticks", cl, wl)
        assert work.p2p_ops == sum(jobs[ph] * chunks * per_chunk[ph] for ph in jobs), chunks
        # a stream of one piece: chunks + hops - 1 ticks per job
        assert work.ticks == sum(jobs[ph] * (chunks + len(hops[ph]) - 1) for ph in jobs)
        assert work.collectives == 0


def test_ticks_charge_the_elements_their_hops_touch_and_one_lane_none():
    # frontier at 2 x 4 x 2, whole model per step: forward gathers node (2), gpu (4), gcd (2) put
    # out 2, 8 and 16 shares; the backward re-gather from the copy kept over (node, gpu) 16; the
    # reduce hops take in the whole gradient (16 shares), then 8, then 2: 68 shares of params / 16
    cl, wl = _cluster(), _wl(params=16e6)
    share = wl.params / 16
    p = P.predict(_cand("frontier"), dataclasses.replace(cl, issue_mode="ticks"), wl)
    for chunks in (1, 4):  # the same elements whatever the chunks and jobs
        assert P.host_work(p.costs, chunks, "ticks", cl, wl).tick_elems == pytest.approx(68 * share)
    q = P.predict(_cand("zeropp"), dataclasses.replace(cl, issue_mode="one_lane"), wl)
    assert P.host_work(q.costs, 1, "one_lane", cl, wl).tick_elems == 0.0
    work = P.HostWork(collectives=0, p2p_ops=10, ticks=5, jobs=3, tick_elems=1e6)
    assert P.host_seconds(work, P.HostRates(0.0, 1e-4, tick_elem_s=2e-9)) == pytest.approx(1e-3 + 2e-3)


def test_host_seconds_and_how_they_meet_the_links():
    work = P.HostWork(collectives=10, p2p_ops=100, ticks=5, jobs=3)
    assert P.host_seconds(work, P.HostRates(1e-3, 1e-4)) == pytest.approx(10e-3 + 100e-4)
    # the issuing thread waits for each transfer on gloo and in RCCL's serial one lane
    assert P.combine_of("gloo", "ticks") == P.combine_of("gloo", "one_lane") == "sum"
    assert P.combine_of("rccl", "one_lane") == "sum"
    # it enqueues and moves on otherwise
    assert P.combine_of("rccl", "ticks") == P.combine_of("nccl", "one_lane") == P.combine_of("nccl", "ticks") == "max"


def _ranked(cluster, wl, host, gpu_modes=True):
    cands = P.auto_candidates()
    mode = {c.name: ("ticks" if c.preset == "frontier" else "one_lane") for c in cands} if gpu_modes else {}
    clusters = {c.name: dataclasses.replace(cluster, issue_mode=mode.get(c.name)) for c in cands}
    return P.rank_auto(cluster, wl, cands, clusters, host)


def test_a_costly_host_turns_the_ranking_where_the_links_are_fast():
    # links that never bind: the link term is the quantization alone; frontier's ticks post far
    # more ops than zeropp's collectives, so with ops that cost the host its ranking turns
    cl, wl = _cluster(tiers=FAST), _wl()
    comm_only = _ranked(cl, wl, None)
    costly = _ranked(cl, wl, P.HostRates(1e-3, 1e-3))
    names = [p.candidate.name for p in costly]
    assert names.index("zeropp") < names.index("frontier")
    for p in costly:  # sum on gloo: the key is link + host, the host term from the counted ops
        assert p.combine == "sum" and P.auto_key(p) == pytest.approx(P.rank_key(p) + p.host_s)
        assert p.host_s == pytest.approx(P.host_seconds(p.host_work, P.HostRates(1e-3, 1e-3)))
    assert all(p.host_s == 0.0 and p.host_work is None for p in comm_only)
    # a free host changes nothing but the chunks' tie-break: the same order as communication alone
    free = _ranked(cl, wl, P.HostRates(0.0, 0.0))
    assert [p.candidate.name for p in free] == [p.candidate.name for p in comm_only]


def test_chunks_are_chosen_with_the_host_in_view():
    # slow links pay for chunks in ticks; a host that pays per op takes them back
    slow = _cluster()
    wl = _wl(params=4e7, bucket=1e7)
    cheap = next(p for p in _ranked(slow, wl, P.HostRates(0.0, 0.0)) if p.candidate.name == "frontier")
    dear = next(p for p in _ranked(slow, wl, P.HostRates(0.0, 10.0)) if p.candidate.name == "frontier")
    assert cheap.chunks > 1 and dear.chunks == 1
    assert dear.candidate == _cand("frontier")  # the candidate itself: its name, chunks left to the planner
    # a configured count stays
    fixed = P.rank_auto(slow, wl, [_cand("frontier")._replace(chunks=4)], None, P.HostRates(0.0, 10.0))
    assert fixed[0].chunks == 4


def test_on_rccl_ticks_overlap_the_host_and_the_serial_lane_adds_it():
    cl = dataclasses.replace(P.frontier(48), library="rccl")
    wl = P.gpt_workload(20e9, 44, 6144, 2048, 1)
    by = {p.candidate.name: p for p in _ranked(cl, wl, P.HostRates(20e-6, 5e-6), gpu_modes=False)}
    assert by["frontier"].mode == "ticks" and by["frontier"].combine == "max"
    assert P.auto_key(by["frontier"]) == max(P.rank_key(by["frontier"]), by["frontier"].host_s)
    assert by["zeropp"].mode == "one_lane" and by["zeropp"].combine == "sum"


def test_host_work_at_9408_nodes_is_bounded():
    # [Scale] the counts one rank computes grow with its hops' peers, not the world: a node hop
    # over 9,408 nodes runs in ceil(log2 9408) = 14 log steps of at most 2 ops each
    cl = P.frontier(9408)
    wl = P.gpt_workload(20e9, 44, 6144, 2048, 1)
    cand = _cand("frontier")
    p = P.predict(cand._replace(chunks=8), dataclasses.replace(cl, issue_mode="ticks"), wl)
    work = P.host_work(p.costs, 8, "ticks", cl, wl)
    jobs = sum(P.jobs_per_phase(wl).values())
    per_chunk_bound = 3 * (2 * 1 + 2 * 3 + 2 * math.ceil(math.log2(9408)))  # gcd, gpu, node; 3 phases
    assert 0 < work.p2p_ops <= jobs * 8 * per_chunk_bound


def test_auto_host_config_declared_off_or_refused():
    sec = parse_section({"preset": "auto"})
    assert sec.auto.host is None  # measured at initialize
    assert parse_section({"preset": "auto", "auto": {"host": False}}).auto.host is False
    declared = {"collective_us": 40, "p2p_op_us": 8, "quant_melems_per_s": 5e4}
    got = parse_section({"preset": "auto", "auto": {"host": declared}}).auto.host
    assert dict(got) == declared and tuple(k for k, _ in got) == HOST_KEYS
    bad = [
        ({"collective_us": 40, "p2p_op_us": 8}, "zeropp_hier.auto.host.quant_melems_per_s", "None"),
        ({**declared, "p2p_op_us": -1}, "zeropp_hier.auto.host.p2p_op_us", "-1"),
        ({**declared, "collective_us": True}, "zeropp_hier.auto.host.collective_us", "True"),
        (True, "zeropp_hier.auto.host", "True"),
        ({**declared, "per_tick_us": 3}, "zeropp_hier.auto.host.per_tick_us", "3"),
    ]
    for value, field, shown in bad:
        with pytest.raises(HierConfigError) as e:
            parse_section({"preset": "auto", "auto": {"host": value}})
        msg = str(e.value)
        assert field in msg and shown in msg, msg
        assert "p2p_op_us" in msg or "allowed keys" in msg  # the fix names the keys
    with pytest.raises(HierConfigError, match="zeropp_hier.auto"):
        parse_section({"preset": "zeropp", "auto": {"host": False}})
    # the tick mode's per-element work: optional, 0 allowed, into seconds per element
    from zeropp_hier.deepspeed.auto_host import declared_host

    assert declared_host(got)[0].tick_elem_s == 0.0
    with_elem = parse_section({"preset": "auto", "auto": {"host": {**declared, "tick_ns_per_elem": 3}}}).auto.host
    assert declared_host(with_elem)[0].tick_elem_s == pytest.approx(3e-9)
    assert parse_section({"preset": "auto", "auto": {"host": {**declared, "tick_ns_per_elem": 0}}}).auto.host
    for value in (-1, float("nan"), "3"):
        with pytest.raises(HierConfigError) as e:
            parse_section({"preset": "auto", "auto": {"host": {**declared, "tick_ns_per_elem": value}}})
        assert "zeropp_hier.auto.host.tick_ns_per_elem" in str(e.value) and ">= 0" in str(e.value)


def _unshaped_record(auto_choice):
    def cfg(steps, auto=None):
        d = {"step_times": steps, "median_step_s": sorted(steps)[len(steps) // 2]}
        if auto:
            d["auto"] = [auto]
        return d

    ranking = [
        {
            "name": "zeropp",
            "issue_mode": "one_lane",
            "chunks": 1,
            "predicted_link_s": 0.2,
            "predicted_host_s": 0.1,
            "combine": "sum",
            "predicted_s": 0.3,
            "host_work": {"collectives": 15, "p2p_ops": 0, "ticks": 0},
        },
    ]
    auto = {
        "chosen": auto_choice,
        "chunks": 1,
        "ranks": "communication and host work",
        "ranking": ranking,
        "host": {"collective_s": 1e-3, "p2p_op_s": 5e-4, "quant_rate": 1e8, "seconds": 0.2},
    }
    return {
        "summary": {
            "unshaped": {"zeropp": cfg([3.0, 3.2]), "frontier": cfg([9.0, 9.5]), "auto": cfg([3.1, 3.3], auto)}
        },
        "regime": {"loadavg": {"unshaped/0/zeropp": {"begin": [5.0, 1, 1], "end": [6.0, 1, 1]}}},
    }


def test_unshaped_summary_names_the_faster_fixed_preset_and_autos_prediction():
    r = cross_shapes.unshaped_rows(_unshaped_record("zeropp"))
    assert r["faster_fixed"] == "zeropp" and r["auto"][0]["chosen"] == "zeropp"
    assert r["auto_over_best_fixed"] == pytest.approx(3.3 / 3.2)
    assert r["load_1min"]["zeropp"] == [5.0, 6.0] and r["load_1min"]["frontier"] is None
    text = "\n".join(cross_shapes.unshaped_markdown({"2x4x2": r}))
    assert (
        "`zeropp` (1 chunks)" in text
        and "| 2x4x2 | 0 | `zeropp` | one_lane | 1 | 0.200 | 0.100 | sum | 0.300 | 15 / 0 / 0 |" in text
    )
    assert "| 2x4x2 | 0 | 1000 | 500 | - | 100.0 | 0.20 |" in text
    argv = cross_shapes.compare_argv("2x4x2", 0.15, "/tmp/x", ("zeropp", "auto"), 2, "name")
    assert "--unshaped-only" in argv and argv[argv.index("--rounds") + 1] == "2"
    assert (
        argv[argv.index("--out") + 1] == "/tmp/x/name_2x4x2.json"
        and argv[argv.index("--configs") + 1] == "zeropp,auto"
    )


def test_gloo_charges_a_collective_its_ring_steps_and_drops_the_link_latency():
    # gloo runs a ring's k - 1 steps on the calling thread: zero3's world gather over 16 ranks is
    # 15 steps, zeropp's node-level backward over 8 is 7; the probe timed a ring of ``ring_steps``
    cl, wl = _cluster(), _wl()
    p = P.predict(_cand("zero3"), dataclasses.replace(cl, issue_mode="one_lane"), wl)
    work = P.host_work(p.costs, 1, "one_lane", cl, wl)
    k = cl.topology.world_size
    want = sum(
        n * (2 if c.coll.op == "reduce_scatter" else 1) * (k - 1)
        for c in p.costs
        for n in [P.jobs_per_phase(wl)[c.coll.phase]]
    )
    assert work.collective_steps == want
    rates = P.HostRates(0.015, 0.0, "probe", ring_steps=15)
    assert P.host_seconds(work, rates) == pytest.approx(want * 0.001)
    # a device library launches a collective in one call, whatever its group
    assert P.host_seconds(work, rates._replace(ring_steps=0)) == pytest.approx(work.collectives * 0.015)
    # on gloo the host term holds the fixed costs: the ranking prices the links without latency
    by = {q.candidate.name: q for q in _ranked(cl, wl, rates)}
    assert by["zero3"].latency_s == 0.0 and _ranked(cl, wl, None)[0].latency_s > 0.0
    rccl = dataclasses.replace(cl, library="rccl")
    assert all(q.latency_s > 0.0 for q in _ranked(rccl, wl, rates))


def test_host_probe_memory_at_9408_nodes_is_bounded():
    # [Scale] what the probe holds grows with the world (its all-gather's output, the tick pieces'
    # bucket of a few blocks per rank, the local pieces' larger bucket): each step frees its
    # tensors before the next, and at Frontier's 9,408 nodes x 4 x 2 the largest stays under
    # 0.2 GB of fp32 per rank (an MI250X GCD has 64 GB), all freed before the runtime is built
    from zeropp_hier.core.topology import Topology
    from zeropp_hier.deepspeed.auto_host import (
        LOCAL_ELEMS,
        PIECE_COPIES,
        PROBE_BLOCK,
        QUANT_ELEMS,
        TICK_CHUNKS,
        TINY,
        local_widths,
        probe_elements,
    )

    world = 9408 * 8
    big = probe_elements(Topology(9408, 4, 2))
    small, large = local_widths(world)
    assert large == 2 * small  # the world alone makes the bucket: the least that still gives a slope
    assert max(TINY * world, PIECE_COPIES * TICK_CHUNKS * PROBE_BLOCK * world, PIECE_COPIES * large * world) == big
    assert big < 0.2e9 / 4
    # at the emulated cluster's 16 ranks the local piece's bucket is about LOCAL_ELEMS, a layer
    small, large = local_widths(16)
    assert small == PROBE_BLOCK and large % small == 0 and LOCAL_ELEMS <= large * 16 < LOCAL_ELEMS + 16 * small
    assert probe_elements(Topology(2, 4, 2)) == PIECE_COPIES * large * 16 > QUANT_ELEMS


def test_the_local_pieces_elements_are_the_planners_count():
    # what the probe's per-element figure is divided by is what the host term multiplies it by:
    # frontier's forward gather (outputs 2, 8, 16 rows of the width at 2 x 4 x 2) and reduce
    # (inputs 16, 8, 2), linear in the width
    from zeropp_hier.core.topology import Topology
    from zeropp_hier.deepspeed.auto_host import piece_elements

    topo = Topology(2, 4, 2)
    comp = parse_section({"preset": "frontier"}).compression
    touched, quant = piece_elements(topo, comp, 32)
    assert touched == 52 * 32
    assert piece_elements(topo, comp, 64) == (2 * touched, 2 * quant) and quant > 0
    exact = parse_section({"preset": "frontier", "compression": "none"}).compression
    assert piece_elements(topo, exact, 32) == (touched, 0.0)


def test_the_probes_plan_changes_the_block_alone():
    # the tick pieces run the frontier plan with the kernels' smallest block: the same hops,
    # schemes and kept levels, so the same calls per chunk and hop
    from zeropp_hier.core.config import parse_section
    from zeropp_hier.core.plan import make_plan
    from zeropp_hier.core.topology import Topology
    from zeropp_hier.deepspeed.auto_host import PROBE_BLOCK, probe_plan
    from zeropp_hier.quant._checks import MIN_BLOCK

    assert PROBE_BLOCK == MIN_BLOCK
    topo = Topology(2, 4, 2)
    plan = make_plan("frontier", parse_section({"enabled": True, "preset": "frontier"}).compression, topo)
    cut = probe_plan(plan)

    def shape(hops):
        return [(h.axes, h.scheme, h.error_feedback) for h in hops]

    for a, b in [(plan.forward, cut.forward), (plan.backward, cut.backward), (plan.reduce, cut.reduce)]:
        assert shape(a) == shape(b) and {h.block_size for h in b} == {PROBE_BLOCK}
        assert {h.block_size for h in a} != {PROBE_BLOCK}  # it did cut something
    assert cut.kept_axes == plan.kept_axes and [x for x, _ in cut.by_level] == [x for x, _ in plan.by_level]
