"""``compression.rotation`` ([Note: rotation policy] in core/policy.py): per kind and tier, in the
shapes block_size takes, checked against each tier's block size, off by default in every preset,
and carried by the plan's hops."""

import pytest

from zeropp_hier.core.config import parse_section
from zeropp_hier.core.errors import HierConfigError
from zeropp_hier.core.plan import make_plan
from zeropp_hier.core.policy import PRESET_COMPRESSION
from zeropp_hier.core.topology import Topology


def comp(section_compression, preset="frontier"):
    return parse_section({"preset": preset, "compression": section_compression}).compression


def triple(per_tier):
    return (per_tier.gcd, per_tier.gpu, per_tier.node)


@pytest.mark.parametrize("preset", sorted(PRESET_COMPRESSION))
def test_off_by_default_in_every_preset(preset):
    c = comp(None, preset)
    for kind in (c.rotation.forward_weights, c.rotation.backward_weights, c.rotation.gradients):
        assert triple(kind) == (0, 0, 0)
    plan = make_plan(preset, c, Topology(2, 2, 2))
    assert all(h.rotate == 0 for h in (*plan.forward, *plan.backward, *plan.reduce))


def test_per_kind_and_tier_reaches_the_hops():
    c = comp({"rotation": {"gradients": {"node": 32}, "weights": 64}, "block_size": {"node": 128}})
    assert triple(c.rotation.gradients) == (0, 0, 32)
    # frontier quantizes weights on the node hop only: the kind-wide size lands there alone
    assert triple(c.rotation.forward_weights) == (0, 0, 64)
    assert triple(c.rotation.backward_weights) == (0, 0, 64)
    p = make_plan("frontier", c, Topology(2, 2, 2))
    assert [(h.tier, h.scheme, h.rotate) for h in p.reduce] == [
        ("gcd", "int8", 0),
        ("gpu", "int8", 0),
        ("node", "int8", 32),
    ]
    assert [(h.tier, h.rotate) for h in p.forward] == [("node", 64), ("gpu", 0), ("gcd", 0)]


def test_one_size_for_everything_and_overrides():
    c = comp({"rotation": 16})
    assert triple(c.rotation.gradients) == (16, 16, 16)
    c = comp({"rotation": {"weights": {"node": 32}, "forward_weights": {"node": 128}}, "weights": "int8"})
    assert c.rotation.forward_weights.node == 128 and c.rotation.backward_weights.node == 32
    assert comp({"rotation": {"gradients": 0}}).rotation.gradients.node == 0


@pytest.mark.parametrize(
    "compression, field, fragment",
    [
        (
            {"rotation": {"gradients": {"node": 24}}},
            "zeropp_hier.compression.rotation.gradients.node",
            "not a power of two",
        ),
        (
            {"rotation": {"gradients": {"node": 512}}},
            "zeropp_hier.compression.rotation.gradients.node",
            "larger than the block size 256",
        ),
        (
            {"rotation": {"gradients": 128}, "block_size": {"gcd": 64}},
            "zeropp_hier.compression.rotation.gradients",
            "larger than the block size 64",
        ),
        (
            {"rotation": {"gradients": {"node": 1}}},
            "zeropp_hier.compression.rotation.gradients.node",
            "power of two from 2",
        ),
        ({"rotation": {"gradients": {"node": True}}}, "zeropp_hier.compression.rotation.gradients.node", "0 (off)"),
        ({"rotation": {"grads": 32}}, "zeropp_hier.compression.rotation.grads", "unknown key"),
        ({"rotation": {"gradients": {"rack": 32}}}, "zeropp_hier.compression.rotation.gradients.rack", "unknown key"),
        (
            {"rotation": {"gradients": {"gcd": 32}}, "gradients": {"gcd": "bf16"}},
            "zeropp_hier.compression.rotation.gradients.gcd",
            "not quantized",
        ),
    ],
)
def test_bad_rotation_names_field_value_and_fix(compression, field, fragment):
    with pytest.raises(HierConfigError) as e:
        comp(compression)
    assert e.value.field == field
    assert fragment in str(e.value)
