"""The DeepSpeed configs in configs/ are what users copy: each must pass DeepSpeed's own (strict)
validation and ours, say what it claims, and the CPU one must be the main job's config."""

import json
from pathlib import Path

import pytest

from zeropp_hier.app.spec import ds_config
from zeropp_hier.core.config import hier_config_from_ds
from zeropp_hier.core.plan import make_plan
from zeropp_hier.core.topology import Topology

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
FILES = sorted(CONFIGS.glob("*.json"))
FRONTIER_384 = Topology(48, 4, 2)  # the paper's scale: 48 nodes x 4 MI250X x 2 GCDs


def _load(name: str) -> dict:
    with open(CONFIGS / name) as f:
        return json.load(f)


def test_the_examples_exist():
    assert {f.name for f in FILES} >= {
        "frontier_bf16.json",
        "zeropp_baseline_bf16.json",
        "zero3_stock_bf16.json",
        "cpu_sim_2x2x2.json",
    }


@pytest.mark.parametrize("path", FILES, ids=[f.name for f in FILES])
def test_deepspeed_and_zeropp_hier_accept_it(path):
    from deepspeed.runtime.config import DeepSpeedConfig

    with open(path) as f:
        cfg = json.load(f)
    ds = DeepSpeedConfig({k: v for k, v in cfg.items() if k != "zeropp_hier"})
    assert ds.zero_config.stage == 3
    hier_config_from_ds(cfg)  # raises HierConfigError naming the field otherwise


def test_frontier_example_is_the_hybrid_rule_at_384_gcds():
    cfg = hier_config_from_ds(_load("frontier_bf16.json"))
    assert cfg.enabled and cfg.preset == "frontier" and cfg.topology.mode == "auto"
    plan = make_plan(cfg.preset, cfg.compression, FRONTIER_384)
    assert [(h.axes, h.scheme) for h in plan.forward] == [(("node",), "int8"), (("gpu",), "none"), (("gcd",), "none")]
    assert [(h.axes, h.scheme) for h in plan.backward] == [(("gcd",), "none")]
    assert [(h.axes, h.scheme, h.error_feedback) for h in plan.reduce] == [
        (("gcd",), "int8", False),
        (("gpu",), "int8", False),
        (("node",), "int8", False),
    ]
    # and it spells out the preset's own defaults: the example is today's frontier
    assert (
        cfg.compression
        == hier_config_from_ds(
            {**_load("frontier_bf16.json"), "zeropp_hier": {"enabled": True, "preset": "frontier"}}
        ).compression
    )


def test_zeropp_example_is_the_baseline_and_stock_example_has_no_section():
    cfg = hier_config_from_ds(_load("zeropp_baseline_bf16.json"))
    assert cfg.enabled and cfg.preset == "zeropp"
    assert not hier_config_from_ds(_load("zero3_stock_bf16.json")).enabled
    # the three Frontier examples differ only in the zeropp_hier section and the scheduler
    strip = lambda c: {
        k: v
        for k, v in c.items()
        if k
        not in (
            "zeropp_hier",
            "scheduler",  # noqa: E731
            "wall_clock_breakdown",
        )
    }
    frontier, zeropp, stock = (
        _load(n) for n in ("frontier_bf16.json", "zeropp_baseline_bf16.json", "zero3_stock_bf16.json")
    )
    assert strip(zeropp) == strip(stock)
    assert strip(frontier)["optimizer"] == stock["optimizer"] and frontier["bf16"] == stock["bf16"]


def test_cpu_example_is_the_main_jobs_config():
    assert _load("cpu_sim_2x2x2.json") == ds_config("frontier")
