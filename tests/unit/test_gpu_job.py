"""benchmarks/gpu/job.py's pure parts: the Pythia ladder as the job builds it, the size choice
by the job's own memory check, the timed metrics and the comparison with stock. No ranks start
(tests/system/test_gpu_job.py runs the benchmark end to end on CPU)."""

import math

import pytest

from benchmarks.gpu import job as G
from zeropp_hier.app.spec import n_params
from zeropp_hier.app.train import spec_from_overrides

# Biderman et al. 2023, Table 1: total parameters of each Pythia model
PYTHIA_TOTAL_PARAMS = {
    "70m": 70_426_624,
    "160m": 162_322_944,
    "410m": 405_334_016,
    "1b": 1_011_781_632,
    "1.4b": 1_414_647_808,
    "2.8b": 2_775_208_960,
    "6.9b": 6_857_302_016,
    "12b": 11_846_072_320,
}
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def needs():
    """The job's memory check of every size at world size 1 (the H100's budget: sizes only)."""
    return {s: G.need_bytes(s, H100, None) for s in G.PYTHIA}


@pytest.fixture(scope="module")
def params():
    return {s: n_params(spec_from_overrides(G.model_overrides(s)).model) for s in G.PYTHIA}


def test_the_ladder_builds_pythias_published_models(params):
    assert params == PYTHIA_TOTAL_PARAMS
    for size, shape in G.PYTHIA.items():
        m = spec_from_overrides(G.model_overrides(size)).model
        assert (m.layers, m.hidden, m.heads, m.intermediate) == (shape.layers, shape.hidden, shape.heads, 4 * m.hidden)
        assert (m.seq_len, m.rotary_pct, m.parallel_residual, m.arch) == (2048, 0.25, True, "neox")


def test_both_configurations_run_the_gpu_recipe_at_one_rank():
    stock, ours = (spec_from_overrides(G.job_overrides("2.8b", c, 12, 3)) for c in ("stock", "ours"))
    assert (stock.preset, ours.preset, ours.compression) == ("stock", "zero3", "none")
    for spec in (stock, ours):
        assert (spec.dtype, spec.activation_checkpointing, spec.regather, spec.buckets) == (
            "bf16",
            "torch",
            False,
            "layer",
        )
        assert (spec.steps, spec.seed) == (12, 3)
        assert spec.topology == {"gpus_per_node": 1, "gcds_per_gpu": 1}
        assert spec.ds_config(world=1)["zero_optimization"]["stage"] == 3
    assert "zeropp_hier" in ours.ds_config(world=1) and "zeropp_hier" not in stock.ds_config(world=1)
    # apart from the section, the two runs get the same DeepSpeed config
    assert {k: v for k, v in ours.ds_config(world=1).items() if k != "zeropp_hier"} == stock.ds_config(world=1)


def test_need_grows_with_the_model(needs, params):
    by_size = sorted(G.PYTHIA, key=lambda s: params[s])
    assert [needs[s] for s in by_size] == sorted(needs[s] for s in by_size)


@pytest.mark.parametrize("budget_gb", [20, 40, 64, 80, 141, 192])
@pytest.mark.parametrize("margin", [0.0, 0.25])
def test_the_choice_is_the_largest_size_that_fits_with_the_margin(needs, params, budget_gb, margin):
    chosen = G.choose_size(needs, params, budget_gb * 1e9, margin)
    room = (1 - margin) * budget_gb * 1e9
    assert chosen is not None
    assert needs[chosen] <= room
    assert all(needs[s] > room for s in G.PYTHIA if params[s] > params[chosen])


def test_nothing_is_chosen_when_even_the_smallest_does_not_fit(needs, params):
    assert G.choose_size(needs, params, min(needs.values()) * 0.99, 0.0) is None


def _summary(**kw):
    s = {
        "tokens_per_step": 8192,
        "world": 1,
        "flops_per_token": 1.7e10,
        "peak_bf16_tflops": 989.0,
        "peak_memory_bytes_per_rank": [5e10],
        "params": 2_775_208_960,
        "device": H100,
    }
    return {**s, **kw}


def test_warmup_steps_are_left_out_of_the_timing():
    rows = [{"step": i, "seconds": 9.0 if i < 2 else 0.5 + 0.1 * i, "loss": 1.0} for i in range(6)]
    m = G.run_metrics(rows, _summary(), warmup=2)
    timed = [r["seconds"] for r in rows[2:]]
    assert m["timed_steps"] == 4
    assert m["step_s"] == pytest.approx(sum(timed) / 4)
    assert m["tokens_per_s"] * m["step_s"] == pytest.approx(8192)
    assert m["tflops_per_gcd"] == pytest.approx(1.7e10 * 8192 / m["step_s"] / 1e12)
    assert m["mfu"] == pytest.approx(m["tflops_per_gcd"] / 989.0)
    with pytest.raises(ValueError):
        G.run_metrics(rows, _summary(), warmup=6)


def _config(step_s, losses):
    m = G.run_metrics([{"step": 0, "seconds": step_s}], _summary(), warmup=0)
    return {**m, "losses": losses}


@pytest.mark.parametrize("slower", [1.0, 1.02, 1.04])
def test_the_target_is_the_per_step_overhead(slower):
    stock, ours = _config(1.0, [3.0, 2.9]), _config(slower, [3.0, 2.9])
    c = G.compare(stock, ours, "bf16")
    assert c["overhead_per_step"] == pytest.approx(slower - 1)
    assert c["target_met"] == (slower - 1 <= G.TARGET)
    assert c["ratio_ours_over_stock"]["tokens_per_s"] == pytest.approx(1 / slower)
    assert c["losses_match"] and c["loss_max_rel_diff"] == 0.0
    text = "\n".join(
        G.table_lines({"configs": {"stock": stock, "ours": ours}, "comparison": c, "settings": {"warmup": 0}})
    )
    assert ("NOT met" in text) == (not c["target_met"])


@pytest.mark.parametrize(
    "ours_losses, match", [([3.0, 2.9], True), ([3.0, 2.9 * 1.03], False), ([3.0, math.nan], False), ([3.0], False)]
)
def test_losses_are_compared_step_by_step(ours_losses, match):
    c = G.compare(_config(1.0, [3.0, 2.9]), _config(1.0, ours_losses), "bf16")
    assert c["losses_match"] is match
    assert c["loss_rtol"] == G.LOSS_RTOL["bf16"]
