"""The "check the claim" report (zeropp_hier/tools/compare_runs.py) on hand-made run records: the
warm-up is left out of every mean, stock shows no per-tier bytes, and runs that are not one job
are refused naming what differs. tests/system/test_slurm_compare.py runs the real job."""

import json
import struct

import pytest

from zeropp_hier.tools import compare_runs
from zeropp_hier.tools.compare_runs import CompareError


def _run(preset: str, step_s: float, warm_s: float = 5.0, steps: int = 4, world: int = 8):
    hier = preset in ("zeropp", "frontier")  # DeepSpeed's ZeRO++ runs are preset=stock with its keys
    summary = {
        "spec": {"preset": preset if hier else "stock"},
        "world": world,
        "params": 1_000_000,
        "tokens_per_step": 1000,
        "flops_per_token": 6e6,
        "peak_bf16_tflops": None,
        "peak_memory_bytes_per_rank": [3e8, 4e8],
        "final_loss": 5.0,
        "device": "cpu",
    }
    rows = []
    for i in range(steps):
        row = {"step": i, "loss": 5.0, "seconds": warm_s if i == 0 else step_s}
        if hier:  # the first step sends more (what later steps keep gathered)
            row["bytes"] = {"gcd": 300.0 if i == 0 else 30.0, "gpu": 20.0, "node": 10.0}
        rows.append(row)
    return summary, rows


def _runs(**kw):
    return {p: _run(p, s, **kw) for p, s in (("stock", 2.0), ("zeropp", 1.0), ("frontier", 0.5))}


def test_the_warm_up_is_left_out_of_every_mean():
    result = compare_runs.compare(_runs(), None, warmup=1)
    by = {r["preset"]: r for r in result["runs"]}
    assert [r["preset"] for r in result["runs"]] == ["stock", "zeropp", "frontier"]
    assert by["frontier"]["tokens_per_s"] == pytest.approx(1000 / 0.5)  # not diluted by the 5 s step
    assert by["frontier"]["step_s"] == pytest.approx(0.5) and by["frontier"]["measured_steps"] == 3
    assert by["frontier"]["bytes_per_step"] == {"gcd": 30.0, "gpu": 20.0, "node": 10.0}
    assert by["frontier"]["tflops_per_gcd"] == pytest.approx(6e6 * 1000 / 0.5 / 8 / 1e12)
    assert by["zeropp"]["speedup_vs_stock"] == pytest.approx(2.0)
    assert by["stock"]["peak_memory_bytes"] == 4e8 and by["stock"]["mfu"] is None
    ratios = {x["ratio"]: x for x in result["ratios"]}
    assert ratios["frontier over our zeropp preset"]["measured"] == pytest.approx(2.0)
    # the paper's 1.71x is against DeepSpeed's ZeRO++: not shown beside our zeropp preset
    assert ratios["frontier over our zeropp preset"]["published"] is None
    assert all(x["published"] is None for x in result["ratios"])
    assert set(result["not_run"]) == {"ds-zeropp", "ds-zeropp-hpz"}
    # with no warm-up left out, the first step counts
    whole = {r["preset"]: r for r in compare_runs.compare(_runs(), None, warmup=0)["runs"]}
    assert whole["frontier"]["tokens_per_s"] == pytest.approx(4000 / 6.5)


def test_stock_has_no_per_tier_bytes_and_the_table_says_so():
    probe = {"world": 8, "backend": "gloo", "tiers": {"node": {"bandwidth": 1e9, "latency": 1e-4, "group_size": 2}}}
    result = compare_runs.compare(_runs(), probe, warmup=1)
    assert result["runs"][0]["bytes_per_step"] is None
    lines = compare_runs.table_lines(result)
    stock = next(ln for ln in lines if ln.split()[:1] == ["stock"])
    frontier = next(ln for ln in lines if ln.split()[:1] == ["frontier"])
    assert stock.count("—") == 3 and "—" not in frontier
    assert "10 B" in frontier and "2000" in frontier and "4.00x" in frontier
    assert any("links probed (gloo, world 8):" in ln for ln in lines)
    assert any("node:" in ln and "8000.00 Mbit/s" in ln for ln in lines)
    assert any("no per-tier counters" in ln for ln in lines)
    assert any("say nothing about GPUs" in ln for ln in lines)  # device cpu


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda runs: runs["zeropp"][0]["spec"].update(preset="frontier"), "holds a run of preset 'frontier'"),
        (lambda runs: runs["frontier"][0].update(world=16), r"differ in world"),
        (lambda runs: runs.pop("stock"), r"no run of preset\(s\) \['stock'\]"),
    ],
)
def test_runs_that_are_not_one_job_are_refused(change, match):
    runs = _runs()
    change(runs)
    with pytest.raises(CompareError, match=match):
        compare_runs.compare(runs, None, warmup=1)


def test_a_warm_up_as_long_as_the_run_names_the_knob():
    with pytest.raises(CompareError, match="ZH_COMPARE_WARMUP"):
        compare_runs.compare(_runs(steps=2), None, warmup=2)


def test_the_command_writes_json_and_png_and_says_what_is_missing(tmp_path, capsys):
    for preset, (summary, rows) in _runs().items():
        d = tmp_path / preset
        d.mkdir()
        (d / "summary.json").write_text(json.dumps(summary))
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert compare_runs.main([str(tmp_path), "--warmup", "1"]) == 0
    printed = capsys.readouterr().out
    assert "links: no probe.json" in printed
    assert json.loads((tmp_path / "compare.json").read_text())["warmup_steps"] == 1
    png = (tmp_path / "compare.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (1200, 360)
    (tmp_path / "zeropp" / "summary.json").unlink()
    assert compare_runs.main([str(tmp_path)]) == 2
    assert "zeropp/summary.json is missing" in capsys.readouterr().err


def test_deepspeeds_zeropp_runs_sit_beside_ours_and_the_published_ratio_only_beside_the_full_one():
    runs = {**_runs(), "ds-zeropp-hpz": _run("ds-zeropp-hpz", 1.6)}
    why = "DeepSpeed's QuantizerBuilder is not implemented for the 'cpu' accelerator"
    result = compare_runs.compare(runs, None, warmup=1, not_run={"ds-zeropp": why})
    assert [r["preset"] for r in result["runs"]] == ["stock", "ds-zeropp-hpz", "zeropp", "frontier"]
    ratios = {x["ratio"]: x for x in result["ratios"]}
    hpz = "frontier over DeepSpeed's ZeRO++, hpZ only"
    assert ratios[hpz]["measured"] == pytest.approx(1.6 / 0.5) and ratios[hpz]["published"] is None
    assert result["not_run"] == {"ds-zeropp": why}
    lines = compare_runs.table_lines(result)
    assert any(ln.startswith("not run: ds-zeropp (DeepSpeed's ZeRO++ (hpZ, qwZ, qgZ)): DeepSpeed's") for ln in lines)
    row = next(ln for ln in lines if ln.split()[:1] == ["ds-zeropp-hpz"])
    assert row.count("—") == 3  # DeepSpeed's engine: no per-tier counters
    # with qwZ/qgZ too, the paper's ratios stand beside the measured ones of the same runs
    runs["ds-zeropp"] = _run("ds-zeropp", 1.8)
    ratios = {x["ratio"]: x for x in compare_runs.compare(runs, None, warmup=1)["ratios"]}
    full = ratios["frontier over DeepSpeed's ZeRO++ (hpZ, qwZ, qgZ)"]
    assert full["measured"] == pytest.approx(1.8 / 0.5) and full["published"] == 1.71
    assert ratios["DeepSpeed's ZeRO++ (hpZ, qwZ, qgZ) over stock ZeRO-3"]["published"] == 1.4
    assert ratios[hpz]["published"] is None


def test_a_deepspeed_zeropp_run_without_its_keys_is_refused():
    compare_runs.check_ds_run("ds-zeropp-hpz", {"zero_optimization": {"zero_hpz_partition_size": 4}})
    with pytest.raises(
        CompareError, match=r"ds-zeropp-hpz run's ds_config.json has \['zero_hpz_partition_size'\] off"
    ):
        compare_runs.check_ds_run("ds-zeropp-hpz", {"zero_optimization": {"stage": 3}})
    hpz_only = {"zero_optimization": {"zero_hpz_partition_size": 8, "zero_quantized_weights": True}}
    with pytest.raises(CompareError, match="zero_quantized_gradients"):
        compare_runs.check_ds_run("ds-zeropp", hpz_only)
