"""``benchmarks.compare --issue-mode`` ([Note: benchmark issue mode] in
benchmarks/compare/variants.py): what each configuration of ours runs with in each mode, that the
plan records the mode, that every table and the chart name it, that a recorded file without it
renders as lanes and says so, and that the planner beside the run models each configuration's
mode. Pure: no cluster is built."""

import json
import statistics
from pathlib import Path

import pytest

from benchmarks.compare import run as compare
from benchmarks.compare.planner import (
    _candidate,
    as_recorded,
    compute_estimate,
    main,
    planner_inputs,
    predictions,
    recorded_predictions,
    schedule_mode,
)
from benchmarks.compare.report import report
from benchmarks.compare.variants import configs, in_issue_mode, issue_mode_label
from zeropp_hier import planner as P
from zeropp_hier.comm.issue import DEFAULT_TICK_CHUNKS

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
    from benchmarks.compare.report import bar_chart

    rec, _ = _recorded("compare_link_bound_share15.json")
    out = tmp_path / "c.png"
    title = bar_chart(rec["summary"], str(out), "base", issue_mode_label({"issue_mode": "gpu"}))
    assert title == "ours in issue mode gpu (one issuing thread, as NCCL/RCCL)" and out.stat().st_size > 0
    assert "recorded before" in (bar_chart(rec["summary"], str(out), "base") or "")


GPU_MODE_FILES = [
    "compare_link_bound_gpu_mode.json",
    "compare_link_bound_gpu_mode_ticks8.json",
    "compare_link_bound_gpu_mode_narrow-deep.json",
    "compare_link_bound_gpu_mode_wide-shallow.json",
    "compare_shapes_8x1x2.json",  # benchmarks/compare/cross_shapes.py
    "compare_shapes_2x4x2.json",
]


def test_the_plan_records_the_tick_chunks_and_the_planner_models_that_count():
    # [Note: recorded tick chunks]: a configuration in ticks without chunks runs the plan's count
    plan = _plan(["--configs", "zeropp,frontier"])
    assert plan["tick_chunks"] == DEFAULT_TICK_CHUNKS
    cands = {c.name: c for c in P.default_candidates(planner_inputs(plan, None, 1.0, 1e8)[0])}
    assert schedule_mode(plan["configs"]["frontier"]) == "ticks"
    for n in (3, 5):
        assert _candidate({**plan, "tick_chunks": n}, "frontier", cands).chunks == n
        assert _candidate({**plan, "tick_chunks": n}, "zeropp", cands).chunks == 1  # one lane: unchunked


def test_a_file_written_before_the_record_takes_the_count_its_notes_state():
    # run when the default was 4 chunks
    rec = json.loads((RESULTS / "compare_link_bound_gpu_mode_ticks8.json").read_text())
    assert "tick_chunks" not in rec["plan"]
    stated = [n for n in rec["notes"] if "chunks unless the configuration sets them" in n]
    assert len(stated) == 1
    count = as_recorded(rec)["tick_chunks"]
    assert f"{count} chunks unless" in stated[0]
    # a recorded count wins over the notes; a file with neither keeps its plan as it is
    assert as_recorded({**rec, "plan": {**rec["plan"], "tick_chunks": 7}})["tick_chunks"] == 7
    assert as_recorded({"plan": {"configs": {}}, "notes": ["nothing about ticks"]}) == {"configs": {}}
    # and the re-run models that count for `frontier` (ticks, chunks left out) and no other row
    at = {n: predictions({**rec["plan"], "tick_chunks": n}, *_inputs(rec), ["frontier", "zeropp"]) for n in (count, 8)}
    assert recorded_predictions(rec)["frontier"]["scheduled_s"] == at[count]["frontier"]["scheduled_s"]
    assert at[count]["frontier"]["scheduled_s"] != at[8]["frontier"]["scheduled_s"]
    assert at[count]["zeropp"]["scheduled_s"] == at[8]["zeropp"]["scheduled_s"]


def _inputs(rec):
    return rec["probe"], compute_estimate(rec["summary"]), statistics.median(rec["quant_rate_per_rank"])


def _chosen(rec: dict, name: str) -> str:
    """The configuration whose prediction stands for ``name``: ``auto``'s, the preset it chose
    with the links binding (as compare_shapes.md shows it)."""
    if name != "auto":
        return name
    return rec["summary"]["shaped"]["auto"]["auto"][0]["chosen"]


@pytest.mark.parametrize("recorded", GPU_MODE_FILES)
def test_the_schedule_predicts_the_gpu_mode_runs(recorded):
    """Re-run from each recorded GPU-mode run's inputs: every row within 10% of its measured step
    in the GPU issue modes (ticks, one lane, stock's own), the issue's goal (issue 49, issue 53:
    both cross_shapes runs, auto's row by the preset it chose), and within 15% in gloo's lanes
    (not a GPU mode). One known miss, within 12%: ``frontier/one-lane`` of the first run
    (+10.9%; +9.6% before the links' per-message framing): the planner's one lane ends every hop
    on all ranks together, where the ranks of small groups drift apart and overlap tiers
    ([Note: step schedule])."""
    rec = json.loads((RESULTS / recorded).read_text())
    pred = recorded_predictions(rec)
    shaped = rec["summary"]["shaped"]
    assert set(pred) == set(shaped) - {"auto"}
    for name in shaped:
        p = pred[_chosen(rec, name)]
        err = p["scheduled_s"] / statistics.median(shaped[name]["step_times"]) - 1
        if p["mode"] == "lanes" and not name.startswith("ds-"):
            bound = 0.15
        elif name == "frontier/one-lane":
            bound = 0.12
        else:
            bound = 0.10
        assert abs(err) <= bound, (name, p["mode"], err)


@pytest.mark.parametrize("shape", ["8x1x2", "2x4x2"])
def test_the_predicted_ratio_between_the_presets_is_within_10_percent_of_the_measured(shape):
    """Issue 53: at both cross_shapes shapes the planner's frontier / zeropp step ratio, re-run
    from the recorded inputs, within 10% of the measured ratio, on the same side of 1."""
    rec = json.loads((RESULTS / f"compare_shapes_{shape}.json").read_text())
    pred = recorded_predictions(rec)
    shaped = rec["summary"]["shaped"]
    measured = statistics.median(shaped["frontier"]["step_times"]) / statistics.median(shaped["zeropp"]["step_times"])
    predicted = pred["frontier"]["scheduled_s"] / pred["zeropp"]["scheduled_s"]
    assert abs(predicted / measured - 1) <= 0.10, (measured, predicted)
    assert (predicted > 1) == (measured > 1)


def test_the_entry_point_prints_each_files_table(capsys):
    path = RESULTS / GPU_MODE_FILES[0]
    main([str(path)])
    out = capsys.readouterr().out
    rec = json.loads(path.read_text())
    pred = recorded_predictions(rec)
    assert out.startswith(f"{path}\n| configuration | issue mode |")
    for name, sh in rec["summary"]["shaped"].items():
        row = next(line for line in out.splitlines() if line.startswith(f"| `{name}` |"))
        err = pred[name]["scheduled_s"] / statistics.median(sh["step_times"]) - 1
        assert f"{pred[name]['scheduled_s']:.1f} ({err:+.1%})" in row
        assert row.count(" / ") == (4 if sh.get("busy") else 2)  # planner's tiers, measured busy where recorded
