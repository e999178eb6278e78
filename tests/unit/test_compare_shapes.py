"""``benchmarks.compare.cross_shapes``: the command line it gives ``benchmarks.compare`` at each shape,
the plan that makes, the planner modelling ``pipeline.hop_steps``, and the summary and tables
built from the recorded runs (``compare_shapes_<shape>.json``). Pure: no cluster is built."""

import json
import statistics
from pathlib import Path

import pytest

from benchmarks.compare import cross_shapes as compare_shapes
from benchmarks.compare import run as compare
from benchmarks.compare.planner import predictions

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results"
RECORDED = {s: RESULTS / f"compare_shapes_{s}.json" for s in compare_shapes.SHAPES}


def _plan(argv):
    args = compare.parse_args(argv)
    return args, compare.build_plan(args, compare.spec_maker(args)(args.node_mbit), "no stock quantization here")


@pytest.mark.parametrize("shape", list(compare_shapes.SHAPES))
def test_each_shape_runs_16_ranks_of_the_fair_fight_in_the_gpu_mode(shape):
    nodes, gpus = compare_shapes.SHAPES[shape]
    args, plan = _plan(compare_shapes.compare_argv(shape, 0.15, "/tmp/x"))
    assert (args.nodes, args.gpus_per_node, args.dtype, args.regime) == (nodes, gpus, "bf16", "link-bound")
    assert plan["world"] == 16 and plan["topology"] == {"gpus_per_node": gpus, "gcds_per_gpu": 2}
    assert args.out == f"/tmp/x/compare_shapes_{shape}.json"
    assert sorted(plan["configs"]) == sorted(compare_shapes.CONFIGS)
    assert plan["configs"]["frontier/log"]["pipeline"] == {"hop_steps": "log"}
    assert all(c["overlap"] == "gpu" for c in plan["configs"].values())


def test_fair_keeps_an_explicit_package_count_and_defaults_stay():
    assert compare.parse_args(["--fair"]).gpus_per_node == 4
    assert compare.parse_args([]).gpus_per_node == 2
    assert compare.parse_args(["--fair", "--gpus-per-node", "1", "--nodes", "8"]).gpus_per_node == 1


def test_the_planner_models_each_configurations_hop_steps():
    """At 8 x 1 x 2 frontier's node group of 8 runs direct by default; forced log steps change
    its schedule, not zeropp's (one lane, no ticks)."""
    _, plan = _plan(compare_shapes.compare_argv("8x1x2", 0.15))
    plan["configs"]["frontier/direct"] = {**plan["configs"]["frontier"], "pipeline": {"hop_steps": "direct"}}
    pred = predictions(plan, None, 3.0, 1e8, ["zeropp", "frontier", "frontier/log", "frontier/direct"])
    assert pred["frontier"]["scheduled_s"] == pred["frontier/direct"]["scheduled_s"]
    assert pred["frontier/log"]["scheduled_s"] != pred["frontier"]["scheduled_s"]
    assert pred["frontier/log"]["mode"] == pred["frontier"]["mode"] == "ticks"


def _rec(steps: dict, unshaped: dict, chosen: str, chosen_unshaped: str) -> dict:
    """A minimal benchmarks.compare record (hand-written: the arithmetic of the table only)."""

    def run(s, name, chosen_):
        d = {"median_step_s": s, "link_use": {"links_s": 0.8 * s, "bound_by": "zms-sw0/nic"}}
        if name == "auto":
            d["auto"] = [{"chosen": chosen_, "ranks": "communication only", "ranking": []}]
        return d

    return {
        "plan": {"node_mbit": 0.2},
        "summary": {
            "shaped": {n: run(s, n, chosen) for n, s in steps.items()},
            "unshaped": {n: run(s, n, chosen_unshaped) for n, s in unshaped.items()},
        },
        "predictions": {n: {"scheduled_s": s * 1.05, "mode": "ticks"} for n, s in steps.items() if n != "auto"},
        "regime": {"loadavg": {"shaped/0/zeropp": {"begin": [3.0, 2, 1], "end": [4.0, 2, 1]}}},
    }


def test_rows_ratios_auto_and_right_or_wrong():
    rec = _rec(
        {"zeropp": 10.0, "frontier": 12.5, "auto": 10.2},
        {"zeropp": 2.0, "frontier": 3.0, "auto": 3.1},
        "zeropp",
        "frontier",
    )
    r = compare_shapes.rows(rec)
    z, f, a = (r["rows"][n] for n in ("zeropp", "frontier", "auto"))
    assert f["vs_base"] == pytest.approx(10.0 / 12.5) and f["vs_base_unshaped"] == pytest.approx(2.0 / 3.0)
    assert f["vs_base_predicted"] == pytest.approx(10.5 / 13.125)
    assert a["predicted_s"] == rec["predictions"]["zeropp"]["scheduled_s"]  # the chosen preset's
    assert z["busiest_link_util"] == pytest.approx(0.8) and z["load_1min"] == [3.0, 4.0]
    assert r["faster"] == {"shaped": "zeropp", "unshaped": "zeropp"}
    lines = compare_shapes.markdown({"8x1x2": {**r, "bytes": {}}})
    assert "| 8x1x2 | binding (node 0.2 Mbit/s per GCD) | 10.00 | 12.50 | `zeropp` | 10.20 | 1.020 |" in lines
    assert "| 8x1x2 | unshaped | 2.00 | 3.00 | `frontier` | 3.10 | 1.550 |" in lines


@pytest.mark.parametrize("shape", [s for s, p in RECORDED.items() if p.exists()])
def test_the_recorded_runs_summarise_as_measured(shape):
    """From each recorded run: every row's step is the median of its measured steps, its ratio
    the base's over it, the busiest link's utilisation at most 1 (a link cannot carry more than
    its rate), auto's choice one of the presets ranked, and the link view per phase sums to the
    link view's total."""
    rec = json.loads(RECORDED[shape].read_text())
    r = compare_shapes.rows(rec)
    shaped = rec["summary"]["shaped"]
    for name, row in r["rows"].items():
        assert row["step_s"] == statistics.median(shaped[name]["step_times"])
        assert row["vs_base"] == pytest.approx(r["rows"]["zeropp"]["step_s"] / row["step_s"])
        assert 0 < row["busiest_link_util"] <= 1.0
        assert row["load_1min"]  # recorded beside every run
    for phase in ("shaped", "unshaped"):
        assert r["auto"][phase]["chosen"] in r["auto"][phase]["predicted_s"]
    for b in compare_shapes.byte_rows(rec).values():
        for t, total in b["link_total"].items():
            assert sum(b["link"][p][t] for p in compare_shapes.PHASES) <= total * (1 + 1e-9)


def test_auto_reads_the_drivers_probe_only_in_the_shaped_phase():
    """[Note: auto on the benchmark's probe]: shaped, ``auto`` ranks on the driver's probe file and
    is built unshaped; unshaped, it probes the links itself; other configurations are untouched."""
    from benchmarks.compare.rank import auto_on_probe, ds_overrides
    from zeropp_hier.core.config import parse_section

    auto, plan = {"kind": "ours", "preset": "auto", "overlap": "gpu"}, {"auto_probe_file": "p.json"}
    shaped = auto_on_probe(auto, plan, True)
    section = ds_overrides(shaped, {})["zeropp_hier"]
    assert parse_section({"enabled": True, "preset": "auto", **section}).auto.probe_file == "p.json"
    assert auto_on_probe(auto, plan, False) == auto and auto_on_probe(auto, {}, True) == auto
    zpp = {"kind": "ours", "preset": "zeropp"}
    assert auto_on_probe(zpp, plan, True) == zpp
