"""The paired convergence test's statistics and protocol (benchmarks/cpu/paired): paired
differences, the t-interval against values computed by hand from printed t tables, the
equivalence decision on constructed intervals, and the protocol's refusals."""

from __future__ import annotations

import json
import math
import os

import pytest

from benchmarks.cpu.paired import analyze, stats
from benchmarks.cpu.paired import protocol as proto

# two-sided 95% critical values of Student's t from printed tables (e.g. NIST/SEMATECH
# e-Handbook, Table 1.4.2.7.4.2), 3 decimals: independent of the series the module sums
T_975 = {1: 12.706, 2: 4.303, 4: 2.776, 5: 2.571, 9: 2.262, 19: 2.093, 29: 2.045}


def test_paired_relative_differences_are_per_seed_and_relative_to_the_reference():
    d = stats.paired_relative_differences([2.02, 1.98, 2.0], [2.0, 2.0, 1.6])
    assert d == pytest.approx([0.01, -0.01, 0.25])


def test_paired_relative_differences_refuse_unpaired_or_bad_values():
    with pytest.raises(ValueError, match="differ in length"):
        stats.paired_relative_differences([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="not finite"):
        stats.paired_relative_differences([math.nan], [1.0])
    with pytest.raises(ValueError, match="not positive"):
        stats.paired_relative_differences([1.0], [0.0])


@pytest.mark.parametrize("df", sorted(T_975))
def test_t_quantile_matches_printed_tables(df):
    assert stats.t_quantile(0.975, df) == pytest.approx(T_975[df], abs=6e-4)


def test_t_cdf_closed_forms():
    # df 1 is the Cauchy distribution, df 2 has F(t) = 1/2 + t / (2 sqrt(2 + t^2))
    for t in (-3.0, -0.4, 0.0, 0.7, 5.0):
        assert stats.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-14)
        assert stats.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-14)
    # far in the tail the t distribution approaches the normal: 1.959964 at df 10^4
    assert stats.t_quantile(0.975, 10_000) == pytest.approx(1.96, abs=1e-3)


def test_t_interval_of_a_small_case_worked_by_hand():
    # d = 0.1, 0.3, 0.2, 0.4, 0.0 (in %): mean 0.2; squared deviations 0.01+0.01+0+0.04+0.04 = 0.10;
    # sd = sqrt(0.10 / 4) = 0.158114; se = 0.158114 / sqrt(5) = 0.070711; t(0.975, 4) = 2.776
    # -> half-width 0.196299, interval [0.003701, 0.396299]
    iv = stats.t_interval([0.1, 0.3, 0.2, 0.4, 0.0])
    assert iv.n == 5
    assert iv.mean == pytest.approx(0.2)
    assert iv.sd == pytest.approx(0.158114, abs=1e-6)
    assert iv.se == pytest.approx(0.070711, abs=1e-6)
    assert iv.low == pytest.approx(0.003701, abs=5e-5)
    assert iv.high == pytest.approx(0.396299, abs=5e-5)
    assert iv.half_width == pytest.approx(0.196299, abs=5e-5)


def test_t_interval_needs_two_seeds():
    with pytest.raises(ValueError, match="at least 2"):
        stats.t_interval([0.1])


def _interval(low: float, high: float) -> stats.Interval:
    mid = (low + high) / 2
    return stats.Interval(n=5, mean=mid, sd=0.0, se=0.0, t=0.0, low=low, high=high, level=0.95)


@pytest.mark.parametrize(
    "low, high, decision",
    [
        (-0.002, 0.002, "equivalent"),
        (0.001, 0.0029, "equivalent"),  # away from 0, still inside the margin
        (-0.002, 0.004, "inconclusive"),  # crosses +margin
        (-0.0031, 0.0, "inconclusive"),  # crosses -margin
        (-0.004, 0.004, "inconclusive"),  # wider than the margin on both sides
        (0.003, 0.01, "not equivalent"),  # wholly at or above +margin
        (-0.02, -0.005, "not equivalent"),  # wholly below -margin
    ],
)
def test_equivalence_decision(low, high, decision):
    assert stats.equivalence(_interval(low, high), 0.003) == decision


def test_equivalence_refuses_a_non_positive_margin():
    with pytest.raises(ValueError, match="margin"):
        stats.equivalence(_interval(-0.1, 0.1), 0.0)


def test_detectable_half_width_shrinks_with_seeds_and_matches_the_interval():
    sd = 0.004
    # the half-width an interval of 5 values with this sd has
    iv = stats.t_interval([sd * x for x in (-1.2649, -0.6325, 0.0, 0.6325, 1.2649)])
    assert iv.sd == pytest.approx(sd, rel=1e-3)
    assert stats.detectable_half_width(sd, 5) == pytest.approx(iv.half_width, rel=1e-3)
    assert stats.detectable_half_width(sd, 10) < stats.detectable_half_width(sd, 5)


def _record(arm, seed, held, init="i", order="o", losses=None):
    return {
        "arm": arm,
        "seed": seed,
        "held_out": {"10": held, "20": held},
        "losses": losses or [held + 0.1] * 20,
        "init_sha256": f"{init}{seed}",
        "order_sha256": order,
    }


def _protocol(arms=("stock", "A/A", "x")):
    return {
        "margin": 0.003,
        "control_margin": 0.001,
        "level": 0.95,
        "reference": "stock",
        "control": "A/A",
        "metric": "held_out",
        "arms": {a: {"preset": "stock", "compression": None} for a in arms},
        "run": {"train_last": 5},
    }


def test_analysis_decides_from_held_out_pairs_and_checks_the_control():
    runs = {}
    for s, (ref, aa, x) in enumerate([(2.0, 2.0002, 2.04), (1.9, 1.8998, 1.94), (2.1, 2.1001, 2.14)]):
        runs[str(s)] = {"stock": _record("stock", s, ref), "A/A": _record("A/A", s, aa), "x": _record("x", s, x)}
    out = analyze.analyze(_protocol(), runs, pilot=False)
    rows = {r["arm"]: r for r in out["rows"]}
    assert rows["A/A"]["held_out"]["decision"] == "equivalent"
    assert rows["x"]["held_out"]["decision"] == "not equivalent"  # about +2%, tight
    assert out["control_within"] and out["control_contains_zero"] and out["verdict"].startswith("valid")
    assert "not equivalent" in analyze.table(out)


def test_analysis_flags_broken_pairing_and_a_biased_control():
    runs = {
        "1": {"stock": _record("stock", 1, 2.0), "A/A": _record("A/A", 1, 2.1, init="j")},
        "2": {"stock": _record("stock", 2, 2.0), "A/A": _record("A/A", 2, 2.1)},
    }
    out = analyze.analyze(_protocol(("stock", "A/A")), runs, pilot=False)
    assert any("different weights" in p for p in out["problems"])
    assert out["verdict"].startswith("invalid")
    runs["1"]["A/A"] = _record("A/A", 1, 2.1)
    runs["2"]["A/A"]["held_out"] = {"10": 2.09, "20": 2.09}
    out = analyze.analyze(_protocol(("stock", "A/A")), runs, pilot=False)
    assert not out["problems"] and not out["control_within"]
    assert "not inside +-0.10%" in out["verdict"]


def test_a_pilot_draws_no_decision():
    runs = {str(s): {a: _record(a, s, 2.0 + 0.001 * s * (a == "A/A")) for a in ("stock", "A/A")} for s in (1, 2)}
    out = analyze.analyze(_protocol(("stock", "A/A")), runs, pilot=True)
    assert out["verdict"].startswith("pilot")
    assert "(pilot)" in analyze.table(out) and "equivalent |" not in analyze.table(out)


def test_the_committed_protocol_is_complete(tmp_path):
    p = proto.load()
    assert 0 < p.margin < 0.1 and p.reference in p.arms and p.control in p.arms
    assert p.arms[p.reference]["preset"] == "stock" and p.arms[p.control]["preset"] != "stock"
    assert proto.eval_steps(p.run)[-1] == p.run["steps"]


def test_protocol_refusals_name_the_field(tmp_path):
    with pytest.raises(proto.ProtocolError, match="no protocol"):
        proto.load(str(tmp_path / "absent.json"))
    good = json.loads(open(proto.DEFAULT_PATH).read())
    for field, value, said in [
        ("margin", None, "margin"),
        ("margin", 0.5, "margin"),
        ("seeds", [1], "seeds"),
        ("seeds", [1, 1], "repeat"),
        ("control", "nope", "control"),
        ("control_margin", 0.01, "control_margin"),
    ]:
        bad = dict(good)
        if value is None:
            del bad[field]
        else:
            bad[field] = value
        path = tmp_path / "p.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(proto.ProtocolError, match=said):
            proto.load(str(path))
    bad = {**good, "run": {**good["run"], "eval_last": 1000}}
    (tmp_path / "p.json").write_text(json.dumps(bad))
    with pytest.raises(proto.ProtocolError, match="eval_last"):
        proto.load(str(tmp_path / "p.json"))


def test_pilot_run_shortens_and_keeps_the_evaluations_inside():
    p = proto.load()
    run = proto.pilot_run(p.run, 12, 3, 3)
    assert run["steps"] == 12 and proto.eval_steps(run) == [6, 9, 12]
    assert 1 <= run["warmup_steps"] <= 12
    with pytest.raises(proto.ProtocolError):
        proto.pilot_run(p.run, 4, 3, 3)


def _args(**kw):
    import argparse

    base = {"pilot": False, "seeds": None, "arms": None, "steps": None, "eval_every": None, "eval_last": None}
    return argparse.Namespace(**{**base, **kw})


def test_a_full_run_takes_nothing_from_the_command_line_and_needs_a_committed_protocol(tmp_path):
    from benchmarks.cpu.paired import run as paired_run

    p = proto.load()
    with pytest.raises(SystemExit, match="--steps.*--pilot"):
        paired_run.plan(p, _args(steps=10))
    copy = tmp_path / "protocol.json"
    copy.write_text(open(proto.DEFAULT_PATH).read())
    with pytest.raises(SystemExit, match="not tracked"):
        paired_run.plan(proto.load(str(copy)), _args())
    seeds, arms, run = paired_run.plan(p, _args(pilot=True, seeds=[7, 8], arms=["stock", "A/A"], steps=24))
    assert seeds == [7, 8] and arms == ["stock", "A/A"] and run["steps"] == 24
    with pytest.raises(SystemExit, match="not in the protocol"):
        paired_run.plan(p, _args(pilot=True, arms=["stock", "bogus"]))


ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def test_the_committed_result_holds_the_analysis_of_its_own_runs():
    """docs' table renders benchmarks/results/paired.json's stored analysis; it must be what the
    protocol's rule gives for the runs recorded beside it (a hand edit or a stale analysis fails)."""
    rec = json.loads((ROOT / "benchmarks/results/paired.json").read_text())
    again = analyze.analyze({**rec["protocol"], "run": rec["run"]}, rec["runs"], rec["pilot"])
    assert json.loads(json.dumps(again)) == rec["analysis"]
    assert rec["analysis"]["verdict"].startswith("valid")


def _plan_rows(lines: list[str]) -> dict[tuple[str, str], str]:
    """(phase, tier) -> scheme from a run's recorded plan of hops (planner.tables.plan_lines)."""
    head = lines[1]
    cols = {name: head.index(name) for name in ("phase", "tier", "ranks", "scheme", "block")}
    rows, phase = {}, ""
    for line in lines[3:]:
        phase = line[cols["phase"] : head.index("hop axes")].strip() or phase
        tier = line[cols["tier"] : cols["ranks"]].strip()
        rows[(phase, tier)] = line[cols["scheme"] : cols["block"]].strip()
    return rows


def test_the_committed_v2_result_holds_its_analysis_and_its_arms_ran_as_the_protocol_says():
    """paired_v2.json (protocol version 2): the stored analysis, reproducibility check included,
    is what the rule gives for its runs under the committed protocol_v2.json; each frontier arm's
    own plan of hops compresses what the protocol says."""
    from benchmarks.cpu.paired import run as paired_run

    p = proto.load(proto.V2_PATH)
    rec = json.loads((ROOT / "benchmarks/results/paired_v2.json").read_text())
    assert rec["protocol_sha256"] == p.sha256 and not rec["pilot"]
    cwd = os.getcwd()
    os.chdir(ROOT)  # the protocol names the earlier file relative to the repository root
    try:
        again = paired_run.analysis(p, rec)
    finally:
        os.chdir(cwd)
    assert json.loads(json.dumps(again)) == rec["analysis"]
    assert rec["analysis"]["verdict"].endswith("valid: decisions stand as tabled")
    assert rec["analysis"]["reproduction"]["seeds"]
    for arms in rec["runs"].values():
        assert arms["stock"]["plan"] is None
        gpu8, w16 = _plan_rows(arms["frontier gpu8"]["plan"]), _plan_rows(arms["frontier w16"]["plan"])
        assert [gpu8[("grad reduce", t)] for t in ("gcd", "gpu", "node")] == ["int8", "int8", "int8"]
        assert [w16[("grad reduce", t)] for t in ("gcd", "gpu", "node")] == ["int8", "int4", "int8"]
        assert gpu8[("forward gather", "node")] == "int8" and w16[("forward gather", "node")] == "none"
        assert all(s == "none" for (phase, _), s in w16.items() if phase.endswith("gather"))


def test_version_2_protocol_arms_each_drop_one_of_frontiers_compressions():
    """protocol_v2.json: version 1's run, seeds and margins; `frontier gpu8` differs from the
    frontier preset only in int8 gradients on the gpu hop, `frontier w16` only in uncompressed
    weights (as the policy parser resolves them, feedback included)."""
    from dataclasses import replace

    from zeropp_hier.core.policy import PerTier, parse_compression

    v1, v2 = proto.load(), proto.load(proto.V2_PATH)
    assert v2.version == 2 and v2.default_out(False) == "paired_v2.json" and v1.default_out(False) == "paired.json"
    for key in ("margin", "control_margin", "level", "metric", "seeds", "run", "reference", "control"):
        assert v2.data[key] == v1.data[key], key
    assert list(v2.arms) == ["stock", "A/A", "frontier gpu8", "frontier w16"]
    assert v2.contrasts == [("frontier gpu8", "frontier w16")]
    assert v2.reproduce == {"file": "benchmarks/results/paired.json", "arm": "stock"}
    frontier = parse_compression(None, "frontier", "c")
    gpu8 = parse_compression(v2.arms["frontier gpu8"]["compression"], "frontier", "c")
    w16 = parse_compression(v2.arms["frontier w16"]["compression"], "frontier", "c")
    # protocol 2 ran when frontier's gpu hop was int4: its gpu8 arm is that with int8 there, which
    # is today's default (the finding adopted, [Note: preset compression defaults])
    old_default = parse_compression({"gradients": {"gpu": "int4"}}, "frontier", "c")
    assert old_default.gradients.gpu == "int4" and frontier.forward_weights.node == "int8"
    assert gpu8 == replace(old_default, gradients=replace(old_default.gradients, gpu="int8")) == frontier
    none = PerTier(gcd="none", gpu="none", node="none")
    assert w16 == replace(frontier, forward_weights=none, backward_weights=none)


def test_protocol_refuses_a_bad_version_or_reproduce_entry(tmp_path):
    good = json.loads(open(proto.V2_PATH).read())
    for field, value in [("version", 0), ("version", "2"), ("reproduce", {"file": "x.json", "arm": "nope"})]:
        (tmp_path / "p.json").write_text(json.dumps({**good, field: value}))
        with pytest.raises(proto.ProtocolError, match=field):
            proto.load(str(tmp_path / "p.json"))


def test_reproduction_compares_one_arm_seed_by_seed_with_an_earlier_file():
    now = {"1": {"stock": _record("stock", 1, 2.0)}, "2": {"stock": _record("stock", 2, 2.02)}, "3": {}}
    then = {"1": {"stock": _record("stock", 1, 2.0)}, "2": {"stock": _record("stock", 2, 2.0)}}
    out = analyze.reproduction(now, then, "stock")
    assert out["seeds"] == ["1", "2"] and not out["all_identical"]
    assert out["per_seed"]["1"] == {"losses_identical": True, "held_out_identical": True, "held_out_rel_diff": 0.0}
    assert out["per_seed"]["2"]["held_out_rel_diff"] == pytest.approx(0.01)
    assert out["max_abs_rel_diff"] == pytest.approx(0.01)
    assert analyze.reproduction(now, {"1": now["1"]}, "stock")["all_identical"]
    assert analyze.reproduction(now, {}, "stock") == {
        "arm": "stock",
        "seeds": [],
        "per_seed": {},
        "all_identical": False,
        "max_abs_rel_diff": None,
    }


def test_a_stopped_run_is_marked_partial_and_a_complete_one_is_not():
    runs = {str(s): {a: _record(a, s, 2.0 + 1e-5 * s * (a == "A/A")) for a in ("stock", "A/A")} for s in (1, 2)}
    proto_ = {**_protocol(("stock", "A/A")), "seeds": [1, 2, 3]}
    out = analyze.analyze(proto_, runs, pilot=False)
    assert out["verdict"].startswith("PARTIAL (2 of 3 seeds)") and "valid" in out["verdict"]
    runs["3"] = {a: _record(a, 3, 2.0) for a in ("stock", "A/A")}
    assert analyze.analyze(proto_, runs, pilot=False)["verdict"].startswith("valid")
