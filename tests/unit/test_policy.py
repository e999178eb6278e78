"""The compression policy: per tier and per kind of traffic, block sizes, error feedback, numerics;
backward compatibility of the earlier keys; every bad value named with its fix."""

import pytest

from zeropp_hier.core.config import hier_config_from_ds, parse_section
from zeropp_hier.core.errors import HierConfigError
from zeropp_hier.core.plan import make_plan
from zeropp_hier.core.topology import Topology


def comp(section_compression, preset="frontier"):
    return parse_section({"preset": preset, "compression": section_compression}).compression


def test_weights_apply_to_both_gathers_unless_overridden():
    c = comp({"weights": {"node": "int8", "gpu": "fp16"}})
    assert (c.forward_weights.node, c.forward_weights.gpu) == ("int8", "fp16")
    assert c.backward_weights == c.forward_weights
    assert c.weights == c.forward_weights  # the earlier single field still reads
    c = comp({"weights": "int8", "backward_weights": {"gcd": "none"}})
    assert (c.forward_weights.gcd, c.backward_weights.gcd, c.backward_weights.gpu) == ("int8", "none", "int8")
    c = comp({"forward_weights": "bf16"})
    assert c.forward_weights.gpu == "bf16"
    assert c.backward_weights.node == "int8" and c.backward_weights.gpu == "none"  # preset default


def test_per_kind_schemes_reach_the_plan():
    c = comp(
        {
            "forward_weights": {"node": "int4"},
            "backward_weights": {"gcd": "int8"},
            "gradients": {"gcd": "bf16"},
            "block_size": {"node": 64, "gcd": 1024},
        }
    )
    p = make_plan("frontier", c, Topology(2, 2, 2))
    assert [(h.tier, h.scheme, h.block_size) for h in p.forward] == [
        ("node", "int4", 64),
        ("gpu", "none", 256),
        ("gcd", "none", 1024),
    ]
    assert [(h.tier, h.scheme, h.block_size) for h in p.backward] == [("gcd", "int8", 1024)]
    assert [(h.tier, h.scheme) for h in p.reduce] == [("gcd", "bf16"), ("gpu", "int8"), ("node", "int8")]
    # a flat hop takes its slowest tier's scheme, block size and feedback flag
    z = make_plan("zeropp", comp({"block_size": {"gpu": 128}, "error_feedback": True}, "zeropp"), Topology(2, 2, 2))
    assert [(h.axes, h.block_size, h.error_feedback) for h in z.reduce] == [
        (("gpu", "gcd"), 128, True),
        (("node",), 256, True),
    ]


def test_block_size_int_or_per_tier():
    c = comp({"block_size": 64})
    assert c.block_size == 64 and (c.block_sizes.gcd, c.block_sizes.gpu, c.block_sizes.node) == (64, 64, 64)
    c = comp({"block_size": {"node": 128}})
    assert c.block_size == 256 and (c.block_sizes.gcd, c.block_sizes.node) == (256, 128)


def test_error_feedback_resolution():
    f = comp({})  # frontier default: off the int8 node stage ("auto"), off the gpu stage (its memory)
    assert (f.error_feedback.gcd, f.error_feedback.gpu, f.error_feedback.node) == (False, False, False)
    f = comp({"gradients": {"node": "int4"}})  # an int4 node stage: "auto" feeds it back
    assert (f.error_feedback.gcd, f.error_feedback.gpu, f.error_feedback.node) == (False, False, True)
    assert not comp({"error_feedback": "auto"}).error_feedback.gpu  # "auto" given: off for int8
    assert comp({"error_feedback": "auto", "gradients": {"gpu": "int4"}}).error_feedback.gpu  # on where int4
    assert comp({"error_feedback": {"gpu": True}}).error_feedback.gpu
    assert comp({}, "zeropp").error_feedback.node is False  # ZeRO++ has none; opt in
    z = comp({"error_feedback": "auto"}, "zeropp").error_feedback
    assert (z.gpu, z.node) == (True, True)
    on = comp({"error_feedback": True}).error_feedback  # every compressed tier
    assert (on.gcd, on.gpu, on.node) == (True, True, True)
    exact = comp({"gradients": {"gcd": "none"}, "error_feedback": True}).error_feedback  # not the exact one
    assert (exact.gcd, exact.gpu, exact.node) == (False, True, True)
    assert not comp({"error_feedback": False}).error_feedback.node
    per = comp({"error_feedback": {"gpu": True, "node": False}}).error_feedback
    assert (per.gpu, per.node) == (True, False)
    assert not comp("none").error_feedback.node  # nothing compressed, nothing fed back
    assert comp("int4").error_feedback.gcd  # int4 everywhere: auto feeds back everywhere


@pytest.mark.parametrize(
    "compression, field, fragment",
    [
        ({"forward_weights": {"node": "int2"}}, "zeropp_hier.compression.forward_weights.node", "use one of"),
        ({"backward_weights": "fp8"}, "zeropp_hier.compression.backward_weights", "use one of"),
        ({"backward_weight": "int8"}, "zeropp_hier.compression.backward_weight", "unknown key"),
        ({"block_size": {"node": 100}}, "zeropp_hier.compression.block_size.node", "power of two"),
        ({"block_size": {"rack": 64}}, "zeropp_hier.compression.block_size.rack", "unknown key"),
        ({"block_size": "256"}, "zeropp_hier.compression.block_size", "power of two"),
        ({"error_feedback": "on"}, "zeropp_hier.compression.error_feedback", 'use true, false or "auto"'),
        ({"error_feedback": 1}, "zeropp_hier.compression.error_feedback", "use true, false"),
        ({"error_feedback": {"node": "yes"}}, "zeropp_hier.compression.error_feedback.node", "use true, false"),
        (
            {"gradients": {"gcd": "none"}, "error_feedback": {"gcd": True}},
            "zeropp_hier.compression.error_feedback.gcd",
            "gradients on the gcd tier are not compressed",
        ),
    ],
)
def test_compression_errors(compression, field, fragment):
    with pytest.raises(HierConfigError) as e:
        comp(compression)
    assert e.value.field == field
    assert fragment in str(e.value)


def test_numerics_section():
    n = parse_section({"preset": "frontier"}).numerics
    assert (n.nonfinite, n.sample_every) == ("skip", 16)
    n = parse_section({"numerics": {"nonfinite": "raise", "sample_every": 0}}).numerics
    assert (n.nonfinite, n.sample_every) == ("raise", 0)
    for bad, field in (
        ({"nonfinite": "ignore"}, "nonfinite"),
        ({"sample_every": -1}, "sample_every"),
        ({"sample_every": 2.5}, "sample_every"),
        ({"nan": "skip"}, "nan"),
    ):
        with pytest.raises(HierConfigError) as e:
            parse_section({"numerics": bad})
        assert e.value.field == f"zeropp_hier.numerics.{field}"


def test_raise_is_refused_with_fp16_loss_scaling():
    cfg = {
        "zero_optimization": {"stage": 3},
        "fp16": {"enabled": True},
        "zeropp_hier": {"numerics": {"nonfinite": "raise"}},
    }
    with pytest.raises(HierConfigError, match='use "skip" with fp16') as e:
        hier_config_from_ds(cfg)
    assert e.value.field == "zeropp_hier.numerics.nonfinite"
    cfg["fp16"]["enabled"] = False
    cfg["bf16"] = {"enabled": True}
    assert hier_config_from_ds(cfg).numerics.nonfinite == "raise"


def test_frontier_default_compresses_gradients_int8_on_every_hop_without_feedback():
    """[Note: preset compression defaults]: int8 on every gradient hop (int4 on the package links
    cost held-out loss in the paired test, int8 did not; int4 on the network too); no error
    feedback on any ("auto" is for int4 stages; the gpu stage's residual would hold half of every
    bucket). int4 on the package links stays a user's choice, still without feedback there."""
    p = make_plan("frontier", comp(None), Topology(2, 4, 2))
    assert [(h.tier, h.scheme, h.error_feedback) for h in p.reduce] == [
        ("gcd", "int8", False),
        ("gpu", "int8", False),
        ("node", "int8", False),
    ]
    gpu4 = make_plan("frontier", comp({"gradients": {"gpu": "int4"}}), Topology(2, 4, 2))
    assert [(h.tier, h.scheme, h.error_feedback) for h in gpu4.reduce][1] == ("gpu", "int4", False)
