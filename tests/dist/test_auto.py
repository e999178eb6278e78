"""``"preset": "auto"`` ([Note: auto preset] in zeropp_hier/deepspeed/auto.py) on 8 real ranks
(2 nodes x 2 packages x 2 GCDs, gloo over loopback): the choice is made at initialize, is the
same on every rank, is recorded, and the engine then trains as the chosen preset."""

import pytest

from zeropp_hier.app.spec import ds_config
from zeropp_hier.core.errors import HierConfigError

STEPS = 2


def auto_runs(cfgs: dict, steps: int) -> dict:
    import time

    import zeropp_hier
    from zeropp_hier.app import run as app_run

    out = {}
    for name, cfg in cfgs.items():
        t0 = time.perf_counter()
        engine = app_run.build_engine(cfg)
        built = time.perf_counter() - t0
        losses = app_run.train_steps(engine, steps)
        st = zeropp_hier.comm_stats(engine)
        out[name] = {
            "losses": losses,
            "auto": st["auto"],
            "preset": engine.hier_runtime.plan.preset,
            "build_s": built,
            "bytes": st["bytes"],
            "chunks": engine.hier_runtime.cfg.pipeline.chunks,
        }
        app_run.release(engine)
    return out


def _auto(**auto):
    cfg = ds_config("auto")
    if auto:
        cfg["zeropp_hier"]["auto"] = auto
    return cfg


def test_auto_chooses_once_alike_on_every_rank_and_trains_as_the_choice(world8):
    # declared rates: Frontier's ratios at the emulated cluster's scale (links slow beside this
    # CPU's quantization), and Frontier's own rates (there this tiny model's communication takes
    # microseconds, and the CPU's quantization time decides)
    cfgs = {
        "probed": _auto(probe_kb=64),
        "frontier_ratios": _auto(tier_gbps={"gcd": 0.016, "gpu": 0.004, "node": 0.001}),
        "frontier_rates": _auto(tier_gbps={"gcd": 200, "gpu": 50, "node": 12.5}),
    }
    res = world8.run(auto_runs, cfgs, STEPS)
    for name in cfgs:
        choices = {r[name]["auto"]["chosen"] for r in res}
        assert len(choices) == 1, f"{name}: ranks chose differently: {choices}"
        rec = res[0][name]["auto"]
        assert rec["ranking"][0]["name"] == rec["chosen"] and rec["runner_up"] is not None
        # it says what it weighed ([Note: auto ranks communication and host work])
        assert rec["ranks"].startswith("communication and host work"), rec["ranks"]
        # the host term, measured on the ranks (every rank got the same record: the slowest
        # rank's figures); each candidate's key is its links' time plus its host's (gloo waits)
        host = rec["host"]
        assert host["collective_s"] > 0 and host["p2p_op_s"] > 0 and host["quant_rate"] > 0, host
        assert host["source"].startswith("measured at initialize")
        for c in rec["ranking"]:
            assert c["combine"] == "sum" and c["predicted_s"] == pytest.approx(
                c["predicted_link_s"] + c["predicted_host_s"]
            )
            # gloo: a collective costs its ring steps at the probe's seconds per step (world - 1 timed)
            assert host["ring_steps"] == 7
            w = c["host_work"]
            ops = w["collective_steps"] * host["collective_s"] / 7 + w["p2p_ops"] * host["p2p_op_s"]
            ops += w["tick_elems"] * host["tick_elem_s"]  # in ticks: the elements their hops touch
            assert c["predicted_host_s"] == pytest.approx(ops) and ops > 0
        assert [c["predicted_s"] for c in rec["ranking"] if c["fits"]] == sorted(
            c["predicted_s"] for c in rec["ranking"] if c["fits"]
        )
        # and each candidate's bytes per tier, the why of a choice (the network's, printed)
        assert all(set(c["tier_bytes"]) == {"gcd", "gpu", "node"} for c in rec["ranking"])
        assert all(sum(c["tier_bytes"].values()) > 0 for c in rec["ranking"])
        # the engine runs the chosen preset's plan and its traffic follows
        assert all(r[name]["preset"] == rec["preset"] for r in res)
        assert all(r[name]["losses"][-1] < r[name]["losses"][0] * 1.5 for r in res)
        # [Note: busiest-link bound]: gloo runs lanes, so the ranking used the pipelined estimate
        # (at least the busiest link's time) and the engine pipelines in the chunks chosen
        assert all(r[name]["chunks"] == rec["chunks"] >= 1 for r in res)
        assert rec["link_bound_s"] <= rec["predicted_pipelined_s"] <= rec["predicted_comm_s"] * (1 + 1e-9)
    probed = res[0]["probed"]["auto"]
    assert probed["source"].startswith("probed at initialize")
    assert all(v > 0 for v in probed["rates_gbps"].values())
    # declared rates skip the probe: the ranking used the declaration itself (no timing compared:
    # the two runs' seconds depend on the machine's load)
    assert res[0]["frontier_rates"]["auto"]["source"] == "declared tier_gbps"
    assert res[0]["frontier_rates"]["auto"]["rates_gbps"] == pytest.approx({"gcd": 200, "gpu": 50, "node": 12.5})
    # slow links: a compressed layout with a kept copy (for this tiny model the planner prefers
    # zeropp's flat int4 gradient stage on gloo); Frontier's rates: this tiny model's bytes take
    # microseconds, and the host's work decides ([Note: auto ranks communication and host work])
    assert res[0]["frontier_ratios"]["auto"]["preset"] in ("zeropp", "frontier")
    fast = res[0]["frontier_rates"]["auto"]["ranking"]
    assert all(c["predicted_host_s"] > c["predicted_link_s"] for c in fast), fast


def test_auto_refuses_a_compression_section_and_foreign_keys():
    from zeropp_hier.core.config import parse_section

    with pytest.raises(HierConfigError, match="zeropp_hier.compression"):
        parse_section({"preset": "auto", "compression": "int8"})
    with pytest.raises(HierConfigError, match="zeropp_hier.auto"):
        parse_section({"preset": "frontier", "auto": {"probe_kb": 64}})
    with pytest.raises(HierConfigError, match="tier_gbps"):
        parse_section({"preset": "auto", "auto": {"tier_gbps": {"gcd": 1}}})


def probe_sizes(target_s):
    import torch
    import torch.distributed as dist

    from zeropp_hier.comm.groups import build_hop_groups
    from zeropp_hier.core.topology import Topology
    from zeropp_hier.core.vocab import TIERS
    from zeropp_hier.detect.links import measure_tiers

    topo = Topology.for_world(dist.get_world_size(), gpus_per_node=2, gcds_per_gpu=2)
    groups = build_hop_groups(topo, [(t,) for t in TIERS], dist.get_rank(), 60)
    try:
        out = measure_tiers(groups, torch.device("cpu"), [4096, 1 << 20], 1, target_s=target_s)
    finally:
        for hg in groups.values():
            dist.destroy_process_group(hg.group)
    # [Note: latency from a tiny message]: every tier measured one, and its rates are finite
    assert all(v["tiny_all_gather_s"] > 0 and 0 < v["bandwidth"] < float("inf") for v in out.values()), out
    assert all(0 <= v["latency"] <= v["tiny_all_gather_s"] / (v["group_size"] - 1) for v in out.values()), out
    return {t: sorted(int(s) for s in v["all_gather_s"]) for t, v in out.items()}


def test_probe_cuts_its_larger_message_to_the_time_target_alike_on_every_rank(world8):
    # a target no link can meet: every tier's larger message is cut to its floor, 4x the
    # smaller; without a target the sizes are as asked. Every rank measured the same sizes.
    cut = world8.run(probe_sizes, 1e-9)
    assert all(r == cut[0] for r in cut)
    assert cut[0] == {t: [4096, 16384] for t in ("gcd", "gpu", "node")}
    full = world8.run(probe_sizes, None)
    assert full[0] == {t: [4096, 1 << 20] for t in ("gcd", "gpu", "node")}


def resolve_counting(section: dict, fail_on_rank0: bool) -> dict:
    """``auto.resolve`` on this rank, counting the planner's rankings (the real ``rank_auto``, wrapped);
    ``fail_on_rank0``: rank 0's ranking raises, as a bug in it would."""
    import torch
    import torch.distributed as dist

    from zeropp_hier import planner
    from zeropp_hier.core.config import parse_section
    from zeropp_hier.deepspeed import auto
    from zeropp_hier.deepspeed.runtime import topology_for

    rank = dist.get_rank()
    calls = []
    real = planner.rank_auto

    def counted(*a, **k):
        calls.append(1)
        if fail_on_rank0:
            raise ValueError("planner broke")
        return real(*a, **k)

    planner.rank_auto = counted
    try:
        cfg = parse_section(section)
        module = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
        topo = topology_for(cfg, dist.get_world_size())
        try:
            chosen, record = auto.resolve(cfg, module, topo, rank, torch.device("cpu"))
        except RuntimeError as e:
            return {"rankings": len(calls), "error": str(e)}
    finally:
        planner.rank_auto = real
    return {
        "rankings": len(calls),
        "preset": chosen.preset,
        "compression": chosen.compression,
        "memory": chosen.memory,
        "record": record,
    }


def test_auto_ranks_on_rank_0_and_every_rank_takes_its_choice(world4):
    section = _auto(tier_gbps={"gcd": 0.016, "gpu": 0.004, "node": 0.001})["zeropp_hier"]
    res = world4.run(resolve_counting, section, False)
    assert [r["rankings"] for r in res] == [1, 0, 0, 0]
    assert all(r["record"] == res[0]["record"] and r["record"]["ranked_on"] == 0 for r in res)
    for r in res:  # the whole choice, not only its name
        assert (r["preset"], r["compression"], r["memory"]) == (
            res[0]["preset"],
            res[0]["compression"],
            res[0]["memory"],
        )
    assert res[0]["preset"] == res[0]["record"]["preset"]
    # a ranking that fails on rank 0 fails every rank with its error; none waits for a choice
    res = world4.run(resolve_counting, section, True)
    assert [r["rankings"] for r in res] == [1, 0, 0, 0]
    assert all("ranking the candidates failed on rank 0 (ValueError: planner broke)" in r["error"] for r in res)


def test_auto_ranks_each_candidate_in_the_issue_mode_it_would_run(world4):
    # overlap "gpu": true as NCCL/RCCL resolve it, on gloo. frontier's hops each span one tier, so
    # it would run ticks; zero3's one hop and zeropp's flat hops cross tiers, so they would run one
    # lane, hop after hop, in one chunk ([Note: one issuing thread on GPUs] in comm/issue.py)
    section = _auto(tier_gbps={"gcd": 0.016, "gpu": 0.004, "node": 0.001})["zeropp_hier"]
    res = world4.run(resolve_counting, {**section, "overlap": "gpu"}, False)
    ranking = res[0]["record"]["ranking"]
    modes = {e["name"]: e["issue_mode"] for e in ranking}
    assert {n for n, m in modes.items() if m == "ticks"} == {n for n in modes if n.startswith("frontier")}, modes
    assert {modes["zero3"], modes["zeropp"]} == {"one_lane"}, modes
    assert all(e["chunks"] == 1 for e in ranking if e["issue_mode"] == "one_lane"), ranking
    chosen = next(e for e in ranking if e["name"] == res[0]["record"]["chosen"])
    assert res[0]["record"]["issue_mode"] == chosen["issue_mode"]
    # gloo's own default (overlap true): every candidate on lanes
    res = world4.run(resolve_counting, section, False)
    assert {e["issue_mode"] for e in res[0]["record"]["ranking"]} == {"lanes"}


def test_declared_host_rates_skip_the_host_probe_and_host_false_ranks_communication_alone(world4):
    section = _auto(tier_gbps={"gcd": 0.016, "gpu": 0.004, "node": 0.001})["zeropp_hier"]
    declared = {"collective_us": 40, "p2p_op_us": 8, "quant_melems_per_s": 100}
    res = world4.run(resolve_counting, {**section, "auto": {**section["auto"], "host": declared}}, False)
    host = res[0]["record"]["host"]
    assert host["source"] == "declared auto.host" and host["seconds"] == 0.0
    assert (host["collective_s"], host["p2p_op_s"], host["quant_rate"]) == pytest.approx((40e-6, 8e-6, 1e8))
    assert all(r["record"] == res[0]["record"] for r in res)
    res = world4.run(resolve_counting, {**section, "auto": {**section["auto"], "host": False}}, False)
    off = res[0]["record"]
    assert off["host"] is None and off["ranks"].startswith("communication only")
    assert all(c["predicted_host_s"] == 0.0 and c["host_work"] is None for c in off["ranking"])
