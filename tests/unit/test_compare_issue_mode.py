"""``benchmarks.compare --issue-mode`` ([Note: benchmark issue mode] in
benchmarks/compare_variants.py): what each configuration of ours runs with in each mode, that the
plan records the mode, that every table and the chart name it, that a recorded file without it
renders as lanes and says so, and that the planner beside the run models each configuration's
mode. Pure: no cluster is built."""

import json
import statistics
from pathlib import Path

import pytest

from benchmarks import compare
from benchmarks.compare_planner import compute_estimate, predictions, schedule_mode
from benchmarks.compare_report import report
from benchmarks.compare_variants import configs, in_issue_mode, issue_mode_label

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results"


def test_gpu_mode_sets_what_nccl_and_rccl_resolve_and_keeps_named_modes():
    every = configs(8, False)
    for name, cfg in every.items():
        gpu, lanes = in_issue_mode(cfg, "gpu"), in_issue_mode(cfg, "lanes")
        assert lanes == cfg  # gloo's threads: the configuration as written
        if cfg["kind"] == "stock":
            assert gpu == cfg  # DeepSpeed issues its own collectives
        elif "overlap" in cfg:
            assert gpu["overlap"] == cfg["overlap"], name  # ticks, false: run as named
        else:
            assert gpu == {**cfg, "overlap": "gpu"}, name
    assert every["frontier/ticks"]["overlap"] == "ticks" and every["frontier/ticks"]["pipeline"]["chunks"] > 1
    with pytest.raises(ValueError, match="'rccl'"):
        in_issue_mode(every["frontier"], "rccl")


def _plan(argv):
    args = compare.parse_args(argv)
    return compare.build_plan(args, compare.spec_maker(args)(args.node_mbit), "no stock quantization here")


def test_the_plan_records_the_mode_and_the_default_is_gpu():
    plan = _plan(["--configs", "zeropp,frontier,frontier/ticks,ds-zeropp"])
    assert plan["issue_mode"] == "gpu"
    c = plan["configs"]
    assert c["zeropp"]["overlap"] == c["frontier"]["overlap"] == "gpu"
    assert c["frontier/ticks"]["overlap"] == "ticks" and "overlap" not in c["ds-zeropp"]
    lanes = _plan(["--issue-mode", "lanes", "--configs", "zeropp,frontier"])
    assert lanes["issue_mode"] == "lanes" and all("overlap" not in v for v in lanes["configs"].values())
    with pytest.raises(SystemExit):
        _plan(["--issue-mode", "nccl"])


def _recorded(name):
    rec = json.loads((RESULTS / name).read_text())
    pred = predictions(
        rec["plan"],
        rec["probe"],
        compute_estimate(rec["summary"]),
        statistics.median(rec["quant_rate_per_rank"]),
        list(rec["summary"]["shaped"]),
    )
    return rec, pred


def test_a_file_without_the_mode_renders_as_lanes_and_says_so():
    rec, pred = _recorded("compare_link_bound_share15.json")
    assert "issue_mode" not in rec["plan"]
    text = report(rec["summary"], pred, {"notes": []})
    old = issue_mode_label(rec["plan"])
    assert "lanes" in old and "recorded before" in old
    # every table's title: the step table, the planner's, link use
    assert text.count(f"ours in {old}") == 3
    assert all(p["mode"] == "lanes" for p in pred.values())


def test_every_table_names_the_gpu_mode_and_the_planner_models_each_configurations_mode():
    rec, _ = _recorded("compare_link_bound_share15.json")
    plan = {**rec["plan"], "issue_mode": "gpu"}
    plan["configs"] = {n: in_issue_mode(c, "gpu") for n, c in plan["configs"].items()}
    plan["configs"]["frontier/ticks"] = in_issue_mode(configs(8, False)["frontier/ticks"], "gpu")
    plan["configs"]["frontier/pipe-one-lane"] = {**plan["configs"]["frontier/pipe"], "overlap": "one_lane"}
    shaped = rec["summary"]["shaped"]
    summary = {
        **rec["summary"],
        "shaped": {
            **shaped,
            "frontier/ticks": shaped["frontier/pipe"],
            "frontier/pipe-one-lane": shaped["frontier/pipe"],
        },
    }
    names = list(summary["shaped"])
    pred = predictions(
        plan, rec["probe"], compute_estimate(rec["summary"]), statistics.median(rec["quant_rate_per_rank"]), names
    )
    text = report(summary, pred, {"notes": [], "issue_mode": issue_mode_label(plan)})
    assert text.count("ours in issue mode gpu (one issuing thread") == 3 and "recorded before" not in text
    assert {n: pred[n]["mode"] for n in names} == {
        "ds-zeropp": "lanes",
        "zeropp": "one_lane",  # overlap true on NCCL/RCCL: a flat hop runs one lane
        "frontier/pipe": "ticks",
        "frontier/pipe-exact-gcd": "ticks",
        "frontier/ticks": "ticks",
        "frontier/pipe-one-lane": "one_lane",
    }
    # the same 4 chunks: hop after hop slowest, in ticks faster (the tiers overlap inside a job),
    # on lanes (as recorded) fastest (they overlap across jobs too)
    lanes, lanes_pred = _recorded("compare_link_bound_share15.json")
    assert schedule_mode(lanes["plan"]["configs"]["frontier/pipe"]) == "lanes"
    on_lanes, in_ticks = lanes_pred["frontier/pipe"]["scheduled_s"], pred["frontier/ticks"]["scheduled_s"]
    assert on_lanes < in_ticks < pred["frontier/pipe-one-lane"]["scheduled_s"]
    assert pred["frontier/pipe"]["scheduled_s"] == in_ticks  # the same 4 chunks in ticks


def test_the_chart_title_names_the_mode(tmp_path):
    # matplotlib is one of the package's dependencies (pyproject.toml): no skip
    from benchmarks.compare_report import bar_chart

    rec, _ = _recorded("compare_link_bound_share15.json")
    out = tmp_path / "c.png"
    title = bar_chart(rec["summary"], str(out), "base", issue_mode_label({"issue_mode": "gpu"}))
    assert title == "ours in issue mode gpu (one issuing thread, as NCCL/RCCL)" and out.stat().st_size > 0
    assert "recorded before" in (bar_chart(rec["summary"], str(out), "base") or "")
