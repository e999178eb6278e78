"""Config validation: every invalid input raises HierConfigError naming field, value and fix."""

import pytest

from zeropp_hier.core.config import hier_config_from_ds, parse_section
from zeropp_hier.core.errors import HierConfigError
from zeropp_hier.core.plan import make_plan
from zeropp_hier.core.topology import Topology

BASE = {"zero_optimization": {"stage": 3}}


def ds(section, **zero):
    return {"zero_optimization": {"stage": 3, **zero}, "zeropp_hier": section}


@pytest.mark.parametrize(
    "section, field, fragment",
    [
        (
            {"presett": "frontier"},
            "zeropp_hier.presett",
            "unknown key; allowed keys are ['enabled', 'preset', 'topology', 'compression', 'numerics'",
        ),
        ({"preset": "zero4"}, "zeropp_hier.preset", "use one of ['zero3', 'zeropp', 'frontier', 'auto']"),
        ({"enabled": "yes"}, "zeropp_hier.enabled", "use true or false"),
        ({"topology": {"gcds_per_gpu": 0}}, "zeropp_hier.topology.gcds_per_gpu", "use a positive integer"),
        ({"topology": {"gpus_per_node": "4"}}, "zeropp_hier.topology.gpus_per_node", "use a positive integer"),
        ({"topology": {"gpus": 4}}, "zeropp_hier.topology.gpus", "unknown key"),
        ({"topology": {"mode": "guess"}}, "zeropp_hier.topology.mode", 'use "auto"'),
        ({"topology": {"mode": "auto", "rank_map": [0, 1]}}, "zeropp_hier.topology.rank_map", "remove rank_map"),
        ({"topology": {"mode": "auto", "gcds_per_gpu": 0}}, "zeropp_hier.topology.gcds_per_gpu", "positive integer"),
        ({"topology": {"rank_map": "0,1"}}, "zeropp_hier.topology.rank_map", "give a list of integers"),
        (
            {"compression": {"gradients": {"node": "int3"}}},
            "zeropp_hier.compression.gradients.node",
            "use one of ['none', 'fp16', 'bf16', 'int8', 'int4']",
        ),
        ({"compression": {"weights": {"rack": "int8"}}}, "zeropp_hier.compression.weights.rack", "unknown key"),
        (
            {"compression": {"block_size": 100}},
            "zeropp_hier.compression.block_size",
            "use a power of two from 32 to 4096",
        ),
        ({"compression": {"block_size": 8192}}, "zeropp_hier.compression.block_size", "power of two"),
        ({"compression": "int2"}, "zeropp_hier.compression", "use one of"),
        ({"compression": {"activations": "int8"}}, "zeropp_hier.compression.activations", "unknown key"),
        ("frontier", "zeropp_hier", "expected a JSON object"),
        ({"overlap": "yes"}, "zeropp_hier.overlap", '"one_lane" (overlapped, one issuing thread, hop after hop'),
        ({"overlap": "serialised"}, "zeropp_hier.overlap", '"serial" (one lane, each hop collective issued after'),
        ({"checkpoint": {"trust_pickles": "yes"}}, "zeropp_hier.checkpoint.trust_pickles", "only for checkpoints"),
        ({"checkpoint": {"trust": True}}, "zeropp_hier.checkpoint.trust", "unknown key"),
        ({"checkpoint": True}, "zeropp_hier.checkpoint", "expected a JSON object"),
        (
            {"numerics": {"max_consecutive_skips": 0}},
            "zeropp_hier.numerics.max_consecutive_skips",
            "use a positive integer: stop the job after this many skipped steps in a row (default 100)",
        ),
        ({"numerics": {"max_consecutive_skips": 2.5}}, "zeropp_hier.numerics.max_consecutive_skips", "positive"),
        ({"numerics": {"max_consecutive_skips": True}}, "zeropp_hier.numerics.max_consecutive_skips", "positive"),
        ({"pipeline": {"chunks": 0}}, "zeropp_hier.pipeline.chunks", "use an integer from 1 (no pipelining)"),
        ({"pipeline": {"chunks": 65}}, "zeropp_hier.pipeline.chunks", "to 64"),
        ({"pipeline": {"chunks": True}}, "zeropp_hier.pipeline.chunks", "use an integer"),
        (
            {"pipeline": {"chunk": 4}},
            "zeropp_hier.pipeline.chunk",
            "unknown key; allowed keys are ['chunks', 'backward_layers_ahead', 'hop_steps']",
        ),
        ({"pipeline": {"backward_layers_ahead": -1}}, "zeropp_hier.pipeline.backward_layers_ahead", "at least 0"),
        ({"pipeline": {"backward_layers_ahead": 1.5}}, "zeropp_hier.pipeline.backward_layers_ahead", "leave it out"),
        ({"pipeline": {"hop_steps": "ring"}}, "zeropp_hier.pipeline.hop_steps", "ceil(log2 N) steps"),
        ({"pipeline": 4}, "zeropp_hier.pipeline", "expected a JSON object"),
    ],
)
def test_section_errors(section, field, fragment):
    with pytest.raises(HierConfigError) as e:
        parse_section(section)
    assert e.value.field == field
    assert fragment in str(e.value)
    assert f"at '{field}': got " in str(e.value)


@pytest.mark.parametrize(
    "zero, field",
    [
        ({"zero_hpz_partition_size": 8}, "zero_optimization.zero_hpz_partition_size"),
        ({"zero_quantized_weights": True}, "zero_optimization.zero_quantized_weights"),
        ({"zero_quantized_gradients": True}, "zero_optimization.zero_quantized_gradients"),
        ({"zero_quantized_nontrainable_weights": True}, "zero_optimization.zero_quantized_nontrainable_weights"),
        ({"reduce_scatter": False}, "zero_optimization.reduce_scatter"),
        ({"offload_param": {"device": "cpu"}}, "zero_optimization.offload_param.device"),
    ],
)
def test_conflicting_deepspeed_settings(zero, field):
    with pytest.raises(HierConfigError) as e:
        hier_config_from_ds(ds({"preset": "frontier"}, **zero))
    assert e.value.field == field
    assert "remove" in str(e.value)


def test_stage_must_be_3():
    with pytest.raises(HierConfigError, match='zero_optimization.stage.*set "stage": 3'):
        hier_config_from_ds({"zero_optimization": {"stage": 2}, "zeropp_hier": {"preset": "frontier"}})


def test_disabled_or_absent_section_is_stock():
    assert not hier_config_from_ds(BASE).enabled
    # a disabled section is not checked against DeepSpeed's settings
    assert not hier_config_from_ds(ds({"enabled": False}, zero_hpz_partition_size=8)).enabled


def test_presets_defaults_and_overrides():
    f = parse_section({"preset": "frontier"}).compression
    assert (f.weights.node, f.weights.gpu, f.weights.gcd) == ("int8", "none", "none")
    assert (f.gradients.node, f.gradients.gpu, f.gradients.gcd) == ("int8", "int8", "int8")
    z = parse_section({"preset": "zeropp"}).compression
    assert (z.gradients.node, z.gradients.gpu) == ("int4", "int4")
    assert parse_section({"preset": "zero3"}).compression.gradients.node == "none"
    o = parse_section({"preset": "frontier", "compression": {"gradients": {"node": "int4"}, "block_size": 64}})
    assert o.compression.gradients.node == "int4" and o.compression.gradients.gpu == "int8"
    assert o.compression.block_size == 64
    off = parse_section({"preset": "frontier", "compression": "none"}).compression
    assert {off.weights.node, off.gradients.node, off.gradients.gpu} == {"none"}


def test_plans_per_preset():
    t = Topology(2, 2, 2)
    f = make_plan("frontier", parse_section({"preset": "frontier"}).compression, t)
    assert [h.axes for h in f.forward] == [("node",), ("gpu",), ("gcd",)]
    assert [h.scheme for h in f.forward] == ["int8", "none", "none"]
    assert [h.axes for h in f.backward] == [("gcd",)] and f.kept_axes == ("node", "gpu")
    assert [(h.axes, h.scheme) for h in f.reduce] == [(("gcd",), "int8"), (("gpu",), "int8"), (("node",), "int8")]
    z = make_plan("zeropp", parse_section({"preset": "zeropp"}).compression, t)
    assert [h.axes for h in z.forward] == [("node", "gpu", "gcd")] and z.forward[0].scheme == "int8"
    assert [h.axes for h in z.backward] == [("gpu", "gcd")] and z.kept_axes == ("node",)
    assert [(h.axes, h.scheme) for h in z.reduce] == [(("gpu", "gcd"), "int4"), (("node",), "int4")]
    # hops over an axis of size 1 are dropped: one node, so nothing crosses the network
    one = make_plan("frontier", parse_section({"preset": "frontier"}).compression, Topology(1, 2, 2))
    assert all("node" not in h.axes for h in one.forward + one.reduce)


def test_initialize_refuses_bad_topology_before_deepspeed(monkeypatch):
    import torch

    import zeropp_hier

    monkeypatch.setenv("WORLD_SIZE", "6")
    cfg = ds({"preset": "frontier", "topology": {"gpus_per_node": 2, "gcds_per_gpu": 2}})
    with pytest.raises(zeropp_hier.HierTopologyError, match="world size 6 is not a multiple of"):
        zeropp_hier.initialize(model=torch.nn.Linear(2, 2), config=cfg)
    assert not torch.distributed.is_initialized()  # refused before any process group existed


def test_version_check_names_found_and_supported():
    from zeropp_hier.core.errors import DeepSpeedVersionError
    from zeropp_hier.deepspeed._compat import check_deepspeed_version

    check_deepspeed_version("0.19.8")
    check_deepspeed_version("0.19.8+cpu")
    # the declared version is the tested one: 0.19.0 (its Init lacks ds_zero_partition_world_size),
    # 0.19.7 (not run) and a later patch release (not run) are refused
    for bad in ("0.18.9", "0.19.0", "0.19.7", "0.19.9", "0.20.0", "1.0.0"):
        with pytest.raises(DeepSpeedVersionError) as e:
            check_deepspeed_version(bad)
        assert f"found DeepSpeed {bad}" in str(e.value) and "==0.19.8" in str(e.value)


def test_torch_outside_the_tested_set_is_warned_on_rank_zero_and_refused_below_the_floor():
    import warnings

    from zeropp_hier.core.errors import TorchVersionError
    from zeropp_hier.deepspeed._compat import SILENCE_ENV, UntestedTorchWarning, check_torch_version

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the tested torch (any local label) warns nothing
        check_torch_version("2.13.0+cpu", {})
        check_torch_version("2.13.0", {})
        check_torch_version("2.10.0+rocm7.1", {"RANK": "3"})  # only rank 0 says it
        check_torch_version("2.10.0+rocm7.1", {SILENCE_ENV: "1"})
    # Frontier's OLCF torch, a patch release of the tested one (not run), a later one
    for untested in ("2.10.0+rocm7.1", "2.13.1", "2.15.0", "3.0.0"):
        with pytest.warns(UntestedTorchWarning) as seen:
            check_torch_version(untested, {"SLURM_PROCID": "0"})
        text = str(seen[0].message)
        assert f"found torch {untested}" in text and "2.13.0" in text and f"{SILENCE_ENV}=1" in text
    with pytest.raises(
        TorchVersionError, match=r"needs torch >= 2\.1 but found torch 2\.0\.1; install torch==2\.13\.0"
    ):
        check_torch_version("2.0.1", {"RANK": "5"})  # refused on every rank


def test_pyproject_declares_the_ranges_the_import_checks():
    import re
    from pathlib import Path

    from zeropp_hier.deepspeed._compat import SUPPORTED_DEEPSPEED, SUPPORTED_TEXT, TESTED_TORCH, TESTED_TORCH_TEXT

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'"deepspeed{SUPPORTED_TEXT}"' in text
    # the declared ranges are the tested versions, ends included: one DeepSpeed, one torch
    lo, hi = SUPPORTED_DEEPSPEED
    assert SUPPORTED_TEXT == "==" + ".".join(map(str, lo)) and hi == lo[:2] + (lo[2] + 1,)
    assert re.findall(r'"torch([^"]*)"', text) == [f"=={TESTED_TORCH[0]}"] and len(TESTED_TORCH) == 1
    assert f"torch {TESTED_TORCH_TEXT}" in text, "pyproject's comment names the tested torch"


def test_overlap_takes_true_false_and_one_lane():
    assert parse_section({}).overlap is True
    assert parse_section({"overlap": False}).overlap is False
    assert parse_section({"overlap": "one_lane"}).overlap == "one_lane"


def test_pipeline_chunks_left_out_is_the_issue_modes_choice():
    # None: resolved per issue mode at start-up (comm/issue.default_chunks, tests/unit/test_issue_mode.py)
    assert parse_section({}).pipeline.chunks is None
    assert parse_section({"pipeline": {}}).pipeline.chunks is None
    assert parse_section({"pipeline": {"chunks": 1}}).pipeline.chunks == 1
    assert parse_section({"pipeline": {"chunks": 4}}).pipeline.chunks == 4
    # the backward window is off unless asked for ([Note: backward window])
    assert parse_section({}).pipeline.backward_layers_ahead is None
    assert parse_section({"pipeline": {"backward_layers_ahead": 0}}).pipeline.backward_layers_ahead == 0
    assert parse_section({}).pipeline.hop_steps == "auto"
    assert parse_section({"pipeline": {"hop_steps": "log"}}).pipeline.hop_steps == "log"


def test_checkpoint_trust_pickles_defaults_to_false():
    assert parse_section({}).checkpoint.trust_pickles is False
    assert parse_section({"checkpoint": {"trust_pickles": True}}).checkpoint.trust_pickles is True
