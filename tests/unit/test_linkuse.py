"""benchmarks/compare/linkuse.py: busy intervals, link utilisation, the ideal step and the link-bound
rate ([Note: link use], [Note: link-bound calibration])."""

import pytest

from benchmarks.cluster.spec import ClusterSpec
from benchmarks.compare.linkuse import (
    LinkUse,
    busy_fractions,
    busy_summary,
    clip,
    efficiency,
    ideal,
    length,
    link_bound_rate,
    link_seconds,
    tier_of_lane,
    time_at_least,
    union,
    utilisation,
)


def test_union_merges_overlapping_and_touching_and_drops_empty():
    assert union([(3, 4), (0, 1), (0.5, 2), (2, 2.5), (5, 5), (7, 6)]) == [(0, 2.5), (3, 4)]
    assert length([(0, 1), (0.5, 2), (3, 4)]) == 3


def test_clip_keeps_only_the_parts_inside_the_windows():
    assert clip([(0, 10)], [(1, 2), (5, 7)]) == [(1, 2), (5, 7)]
    assert clip([(0, 1.5), (6, 9)], [(1, 2), (5, 7)]) == [(1, 1.5), (6, 7)]
    assert clip([(3, 4)], [(1, 2)]) == []


def test_time_at_least_counts_each_list_once():
    a = [(0, 4), (1, 2)]  # overlaps itself: still one busy tier
    b = [(3, 6)]
    c = [(5, 8)]
    assert time_at_least(1, [a]) == 4
    assert time_at_least(2, [a]) == 0
    assert time_at_least(2, [a, b, c]) == pytest.approx(1 + 1)  # [3,4] and [5,6]
    assert time_at_least(3, [a, b, c]) == 0
    assert time_at_least(1, [a, b, c]) == 8


def test_tier_of_lane_is_the_slowest_axis():
    assert tier_of_lane(("gcd",)) == "gcd"
    assert tier_of_lane(("gpu", "gcd")) == "gpu"
    assert tier_of_lane(("node", "gpu", "gcd")) == "node"
    assert tier_of_lane("node") == "node"
    with pytest.raises(ValueError, match="one_lane"):
        tier_of_lane(("one_lane",))


def test_busy_summary_of_one_rank():
    steps = [(0.0, 10.0), (10.0, 20.0)]
    records = [
        (("gcd",), 1.0, 3.0),
        (("gpu", "gcd"), 2.0, 6.0),  # gpu tier; overlaps gcd on [2, 3]
        (("node",), 5.0, 9.0),  # overlaps gpu on [5, 6]
        (("node",), 19.0, 21.0),  # half outside the measured steps
        (("gcd",), -2.0, -1.0),  # before them: not counted
    ]
    s = busy_summary(records, steps)
    assert s["busy_s"] == {"gcd": 2.0, "gpu": 4.0, "node": 5.0}
    assert s["together_s"] == pytest.approx(2.0)
    assert s["steps_s"] == 20.0 and s["steps"] == 2
    # step 1: 1 s before the first collective, 1 s after the last; step 2: 9 s before, 0 after
    assert s["outside_s"] == pytest.approx(1 + 1 + 9 + 0)
    f = busy_fractions([s, s])
    assert f["busy"] == {"gcd": 0.1, "gpu": 0.2, "node": 0.25}
    assert f["together"] == pytest.approx(0.1)
    assert f["outside_s"] == pytest.approx(5.5)


def test_a_step_without_collectives_is_all_outside():
    s = busy_summary([], [(0.0, 3.0)])
    assert s["outside_s"] == 3.0 and s["busy_s"]["node"] == 0.0 and s["together_s"] == 0.0
    with pytest.raises(ValueError):
        busy_fractions([])


def test_utilisation_ideal_and_efficiency():
    links = [
        LinkUse("a/lo", "gcd", 8.0, 1e6),  # 1 s at 8 Mbit/s
        LinkUse("a/pkg", "gpu", 2.0, 0.5e6),  # 2 s
        LinkUse("sw/p0", "gpu", 2.0, 0.25e6),  # 1 s
        LinkUse("sw/nic", "node", 1.0, 0.1e6),  # 0.8 s
    ]
    assert link_seconds(1e6, 8.0) == 1.0
    u = utilisation(links, 4.0)
    assert u["mean"] == {"gcd": 0.25, "gpu": pytest.approx(0.375), "node": 0.2}
    assert u["busiest"]["gpu"] == 0.5
    assert u["links_s"] == 2.0 and u["bound_by"] == "a/pkg"
    assert ideal(u["links_s"], 0.5) == 2.5
    assert ideal(u["links_s"], None) is None
    assert efficiency(2.5, 5.0) == 0.5
    assert efficiency(None, 5.0) is None
    with pytest.raises(ValueError, match="positive"):
        link_seconds(1.0, 0.0)
    with pytest.raises(ValueError, match="step time"):
        utilisation(links, 0.0)


def test_link_bound_rate_keeps_the_unshaped_step_under_the_share():
    # capacities per Mbit/s of node rate (16:4:1 with 2 GCDs per package, 8 per node)
    cal = {
        "zeropp": {"unshaped_s": 7.0, "links": [LinkUse("pkg", "gpu", 8.0, 10e6), LinkUse("nic", "node", 8.0, 4e6)]},
        "frontier": {"unshaped_s": 7.5, "links": [LinkUse("pkg", "gpu", 8.0, 6e6), LinkUse("nic", "node", 8.0, 2e6)]},
    }
    r = link_bound_rate(cal, share=0.3)
    # zeropp's bound at 1 Mbit/s: 10e6 * 8 / 8e6 = 10 s; rate <= 0.3 * 10 / 7.5 = 0.4
    assert r["slowest"] == "zeropp"
    assert r["link_bound_at_1mbit_s"] == {"zeropp": 10.0, "frontier": 6.0}
    assert r["node_mbit"] == pytest.approx(0.4)
    assert r["predicted_share"] <= 0.3 + 1e-12
    assert r["own_share"]["frontier"] == pytest.approx(7.5 / (6.0 / 0.4))
    # rounded down, never up: the share still holds
    cal["frontier"]["unshaped_s"] = 7.7
    r = link_bound_rate(cal, share=0.3)
    assert r["node_mbit"] == pytest.approx(0.38) and r["predicted_share"] <= 0.3
    with pytest.raises(ValueError, match="share"):
        link_bound_rate(cal, share=1.5)
    with pytest.raises(ValueError, match="no bytes"):
        link_bound_rate({"x": {"unshaped_s": 1.0, "links": [LinkUse("pkg", "gpu", 8.0, 0.0)]}})


def test_shaped_egress_covers_every_tbf_with_its_rate():
    spec = ClusterSpec(node_mbit=1.0, gpu_mbit=4.0, gcd_mbit=16.0, gpus_per_node=4)
    eg = spec.shaped_egress()
    tbfs = {(c[2], c[6]): float(c[10].removesuffix("mbit")) for c in spec.setup_commands() if c[0] == "tc"}
    assert {(e.namespace, e.ifname): e.mbit for e in eg} == tbfs
    tiers = {t: sum(1 for e in eg if e.tier == t) for t in ("gcd", "gpu", "node")}
    assert tiers == {"gcd": spec.packages, "gpu": 2 * spec.packages, "node": 2 * spec.nodes}


def test_probe_sizes_shrink_with_the_node_rate_within_bounds():
    from benchmarks.compare.run import DEFAULT_NODE_MBIT, probe_sizes

    assert probe_sizes(DEFAULT_NODE_MBIT) == "16384,1048576"
    assert probe_sizes(100.0) == "16384,1048576"
    assert probe_sizes(0.01) == "16384,65536"
    small, large = (int(x) for x in probe_sizes(1.5).split(","))
    assert small == 16384 and large == 262144 and large % 4096 == 0


def test_regime_check_is_the_unshaped_step_over_the_slowest_presets_shaped_step():
    from benchmarks.compare.report import regime_check

    summary = {
        "shaped": {"zeropp": {"median_step_s": 30.0}, "frontier": {"median_step_s": 20.0}},
        "unshaped": {"zeropp": {"median_step_s": 6.0}, "frontier": {"median_step_s": 7.5}},
    }
    c = regime_check(summary, "zeropp")
    assert c == {"unshaped_max_s": 7.5, "slowest_shaped_s": 30.0, "share": 0.25}
    assert regime_check({"shaped": summary["shaped"]}, "zeropp") is None  # --no-unshaped
