"""The benchmark's GPT-NeoX shapes (benchmarks/compare/shapes.py), what the comparison's ranks build from
a plan, and the job's config overrides the benchmarks pass (``JobSpec.ds_config``)."""

import dataclasses

import pytest

from benchmarks.compare import rank as compare_rank
from benchmarks.compare.planner import planner_inputs
from benchmarks.compare.shapes import DEFAULT_SHAPE, SHAPES, planner_model
from zeropp_hier.app.model import models
from zeropp_hier.app.spec import JobSpec, n_params


def test_three_shapes_differ_in_hidden_depth_and_vocabulary():
    assert DEFAULT_SHAPE in SHAPES and len(SHAPES) >= 3
    for field in ("hidden", "layers", "vocab_size"):
        assert len({getattr(s, field) for s in SHAPES.values()}) == len(SHAPES), field
    for name, spec in SHAPES.items():
        spec.check()
        assert spec.arch == "neox", name
        assert 2e6 < n_params(spec) < 8e6, name  # a few M: 16 ranks on 2 cores stay feasible
    # the default is sized like the benchmark model it replaced (vocab 1024, seq 64, d 256, 4 x 4)
    base = SHAPES[DEFAULT_SHAPE]
    assert (base.vocab_size, base.seq_len, base.hidden, base.heads, base.layers) == (1024, 64, 256, 4, 4)


def test_blocks_of_the_built_model():
    spec = SHAPES["narrow-deep"]
    model = models.build(dataclasses.replace(spec, vocab_size=64), {})
    assert len(models.blocks(model)) == spec.layers
    with pytest.raises(TypeError, match="no transformer blocks"):
        models.blocks(model.lm.gpt_neox.embed_in)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_plan_of_a_shape_feeds_the_planner_and_the_ranks(shape):
    spec = SHAPES[shape]
    plan = {
        "model": planner_model(spec),
        "model_spec": dataclasses.asdict(spec),
        "params": n_params(spec),
        "micro_batch": 2,
        "regather": True,
        "dtype": "bf16",
        "world": 16,
        "node_mbit": 6.0,
        "topology": {"gpus_per_node": 4, "gcds_per_gpu": 2},
    }
    _, wl = planner_inputs(plan, None, 1.0, 1e8)
    assert wl.layers == spec.layers and wl.params == n_params(spec)
    stock = compare_rank.job_spec({"kind": "stock"}, plan)
    ours = compare_rank.job_spec({"kind": "ours", "preset": "frontier", "compression": "none"}, plan)
    assert stock.model == ours.model == spec  # the same model for the baseline and for us
    assert (stock.preset, ours.preset, ours.compression) == ("stock", "frontier", "none")
    assert stock.dtype == ours.dtype == "bf16" and stock.micro_batch == ours.micro_batch == 2


def test_overrides_merge_into_the_job_config():
    plan = {"prefetch_bucket": 1000, "reduce_bucket": 500}
    zpp = {"kind": "stock", "zero": {"zero_hpz_partition_size": 8}}
    cfg = JobSpec(preset="stock", dtype="bf16").ds_config(compare_rank.ds_overrides(zpp, plan))
    zero = cfg["zero_optimization"]
    assert "zeropp_hier" not in cfg and cfg["bf16"] == {"enabled": True}
    assert zero["stage"] == 3 and zero["zero_hpz_partition_size"] == 8  # the job's keys stay
    assert zero["stage3_prefetch_bucket_size"] == 1000 and zero["reduce_bucket_size"] == 500
    ours = {"kind": "ours", "preset": "frontier", "pipeline": {"chunks": 4}, "prefetch": False}
    cfg = JobSpec(preset="frontier").ds_config(compare_rank.ds_overrides(ours, plan))
    assert cfg["zeropp_hier"]["pipeline"] == {"chunks": 4} and cfg["zeropp_hier"]["preset"] == "frontier"
    assert cfg["zero_optimization"]["stage3_prefetch_bucket_size"] == 0  # prefetch off: the job's regather
    assert cfg["zero_optimization"]["reduce_bucket_size"] == 500


def test_a_model_asked_for_whole_is_whole_beside_a_live_zero3_config():
    """The convergence benchmark evaluates final weights in a whole copy while the run's
    ``HfDeepSpeedConfig`` may still be alive in the process."""
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    live = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    assert is_deepspeed_zero3_enabled()
    spec = dataclasses.replace(SHAPES["base"], vocab_size=64, layers=1)
    model = models.build(spec, {})
    assert sum(p.numel() for p in model.parameters()) == n_params(spec)
    assert is_deepspeed_zero3_enabled()  # restored afterwards
    del live
