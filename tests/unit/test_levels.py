"""Kept levels under a memory budget ([Note: kept levels] in core/levels.py): pure logic."""

import pytest

from zeropp_hier.core import levels
from zeropp_hier.core.config import parse_section
from zeropp_hier.core.errors import HierConfigError
from zeropp_hier.core.plan import make_plan
from zeropp_hier.core.policy import CompressionConfig
from zeropp_hier.core.topology import Topology

pytestmark = pytest.mark.unit

TOPO = Topology.for_world(16, gpus_per_node=4, gcds_per_gpu=2)  # 2 nodes x 4 packages x 2 GCDs
LAYERS = [(f"blocks.{i}", 1000.0) for i in range(8)]  # per-rank slot elements of each layer


@pytest.mark.parametrize(
    "name,layer",
    [
        ("blocks.3.attn.qkv.weight", "blocks.3"),
        ("model.layers.12.mlp.w1", "model.layers.12"),
        ("wte.weight", "wte"),
        ("ln_f.bias", "ln_f"),
        ("scale", "scale"),
    ],
)
def test_layer_of(name, layer):
    assert levels.layer_of(name) == layer


def test_no_budget_keeps_the_presets_copy_everywhere():
    lp = levels.assign(LAYERS, "frontier", TOPO, 1.0)
    assert set(lp.levels.values()) == {"package"}
    # a package copy spans node and gpu: 2 * 4 of the 16 per-rank slots
    assert lp.kept_bytes == 8 * 1000 * 8
    assert set(levels.assign(LAYERS, "zeropp", TOPO, 1.0).levels.values()) == {"node"}


def test_budget_fills_node_copies_first_then_package_in_model_order():
    package, node = 8 * 1000, 2 * 1000  # bytes per layer at 1 byte per element
    # every layer's node copy plus the upgrade of three layers
    budget = 8 * node + 3 * (package - node)
    # the same for zeropp: its budget beyond the node copies buys package copies
    zpp = levels.assign(LAYERS, "zeropp", TOPO, 1.0, budget)
    assert [zpp.levels[n] for n, _ in LAYERS] == ["package"] * 3 + ["node"] * 5
    lp = levels.assign(LAYERS, "frontier", TOPO, 1.0, budget)
    assert [lp.levels[n] for n, _ in LAYERS] == ["package"] * 3 + ["node"] * 5
    assert lp.kept_bytes == budget
    assert lp.counts() == {"package": 3, "node": 5, "none": 0}
    assert levels.summarize(lp, [n for n, _ in LAYERS]) == [
        ("blocks.0 .. blocks.2 (3)", "package"),
        ("blocks.3 .. blocks.7 (5)", "node"),
    ]


def test_budget_below_every_node_copy_leaves_layers_without_a_copy():
    lp = levels.assign(LAYERS, "frontier", TOPO, 1.0, 5 * 2000 + 1999)
    assert lp.counts() == {"package": 0, "node": 5, "none": 3}
    assert lp.kept_bytes <= lp.budget_bytes
    assert levels.assign(LAYERS, "frontier", TOPO, 1.0, 0).counts()["none"] == 8


def test_every_level_has_backward_hops():
    plan = make_plan("frontier", CompressionConfig(), TOPO)
    assert plan.backward_for(("node", "gpu")) == plan.backward
    assert [h.axes for h in plan.backward_for(("node",))] == [("gpu",), ("gcd",)]
    # zeropp under a budget: package copies re-gather inside the package, after its flat forward
    zpp = make_plan("zeropp", CompressionConfig(), TOPO)
    assert zpp.kept_axes == ("node",) and [h.axes for h in zpp.backward_for(("node", "gpu"))] == [("gcd",)]
    assert [h.axes for h in zpp.forward] == [("node", "gpu", "gcd")]
    with pytest.raises(KeyError):
        make_plan("zero3", CompressionConfig(), TOPO).backward_for(("node", "gpu"))


def test_memory_config_errors_name_the_field():
    assert parse_section({"memory": {"kept_shards_gb": 2}}).memory.kept_shards_gb == 2.0
    for bad in (-1, "2GB", True, float("inf")):
        with pytest.raises(HierConfigError, match="memory.kept_shards_gb"):
            parse_section({"memory": {"kept_shards_gb": bad}})
    with pytest.raises(HierConfigError, match="zero3"):
        parse_section({"preset": "zero3", "memory": {"kept_shards_gb": 1}})
    with pytest.raises(HierConfigError, match="memory.kept_gb"):
        parse_section({"memory": {"kept_gb": 1}})
