"""The config's choices: each Literal type and the tuple the parsers check agree, every value of
the type parses, and a value outside it is refused naming the field, the value and the choices."""

import dataclasses
from typing import get_args

import pytest

from zeropp_hier.core import config, policy, vocab
from zeropp_hier.core.config import parse_section
from zeropp_hier.core.errors import HierConfigError

# (the Literal type, the tuple the parser checks, a section setting the field to a value)
CHOICES = [
    (config.Preset, config.PRESETS, lambda v: {"preset": v}, "zeropp_hier.preset"),
    (config.TopologyMode, config.TOPOLOGY_MODES, lambda v: {"topology": {"mode": v}}, "zeropp_hier.topology.mode"),
    (config.OverlapMode, config.OVERLAP_MODES, lambda v: {"overlap": v}, "zeropp_hier.overlap"),
    (
        policy.Scheme,
        policy.SCHEMES,
        lambda v: {"compression": {"gradients": {"node": v}}},
        "zeropp_hier.compression.gradients.node",
    ),
    (
        policy.NonfinitePolicy,
        policy.NONFINITE_POLICIES,
        lambda v: {"numerics": {"nonfinite": v}},
        "zeropp_hier.numerics.nonfinite",
    ),
    (
        policy.ResidualDtype,
        policy.RESIDUAL_DTYPES,
        lambda v: {"numerics": {"residual_dtype": v}},
        "zeropp_hier.numerics.residual_dtype",
    ),
]


@pytest.mark.parametrize("kind, values, section, field", CHOICES, ids=lambda x: getattr(x, "__name__", None))
def test_choice_tuple_is_its_type(kind, values, section, field):
    assert values == get_args(kind)
    for v in values:
        parse_section(section(v))  # every value of the type parses
    with pytest.raises(HierConfigError) as e:
        parse_section(section("no-such-choice"))
    assert e.value.field == field and e.value.value == "no-such-choice"
    for v in values:
        assert v in e.value.fix  # the fix names every choice


def test_fixed_presets_are_the_presets_but_auto():
    assert set(config.PRESETS) == {*vocab.FIXED_PRESETS, "auto"}
    assert set(policy.PRESET_COMPRESSION) == set(vocab.FIXED_PRESETS) == set(policy.PRESET_ERROR_FEEDBACK)
    for kinds in policy.PRESET_COMPRESSION.values():
        for per_tier in kinds.values():
            assert set(per_tier.values()) <= set(policy.SCHEMES)


def test_parsed_config_holds_values_of_the_types():
    cfg = parse_section({"preset": "zeropp", "overlap": "one_lane", "numerics": {"residual_dtype": "bf16"}})
    assert cfg.preset in get_args(config.Preset)
    assert cfg.overlap in get_args(config.OverlapMode)
    assert cfg.numerics.residual_dtype in get_args(policy.ResidualDtype)
    for kind in ("forward_weights", "backward_weights", "gradients"):
        schemes = getattr(cfg.compression, kind)
        for f in dataclasses.fields(schemes):
            assert getattr(schemes, f.name) in get_args(policy.Scheme)


def test_one_vocabulary_for_presets_tiers_and_axes():
    """Presets, tiers and axes are named once (core/vocab.py); the section's parser, the topology,
    the policy and the job's spec read them from there, and the job adds only "stock"."""
    from typing import get_type_hints

    from zeropp_hier.app import spec
    from zeropp_hier.core import topology

    assert vocab.TIERS == ("gcd", "gpu", "node") and vocab.AXES == tuple(reversed(vocab.TIERS))
    assert topology.AXES is vocab.AXES and policy.TIERS is vocab.TIERS and config.TIERS is vocab.TIERS
    assert config.PRESETS is vocab.PRESETS
    assert vocab.PRESETS == (*vocab.FIXED_PRESETS, "auto")
    assert spec.PRESETS == (*vocab.PRESETS, "stock")
    assert get_args(get_type_hints(spec.JobSpec)["preset"]) == spec.PRESETS
    # a rank's coordinate lists the axes slowest first
    assert topology.Topology(2, 2, 2).coord(5)._fields == vocab.AXES
