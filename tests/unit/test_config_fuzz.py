"""Property-based config fuzzing: thousands of generated ``zeropp_hier`` sections and DeepSpeed
configs around them. Every invalid one raises ``HierConfigError`` naming the field that is
wrong; every valid one parses to what was written; nothing raises anything else or hangs.

Pure: no processes, no torch.distributed. ``initialize`` runs exactly these steps
(``hier_config_from_ds``, then ``topology_for`` with the world size) before DeepSpeed starts.
"""

import math

import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zeropp_hier.core.config import (
    _SECTION_KEYS,
    _TOPOLOGY_KEYS,
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    PRESETS,
    hier_config_from_ds,
    parse_section,
)
from zeropp_hier.core.errors import HierConfigError, HierTopologyError
from zeropp_hier.core.plan import make_plan
from zeropp_hier.core.policy import _COMPRESSION_KEYS, DEFAULT_BLOCK_SIZE, PRESET_COMPRESSION, SCHEMES
from zeropp_hier.core.vocab import FIXED_PRESETS, TIERS
from zeropp_hier.deepspeed.runtime import topology_for

from ..helpers import set_path


def fuzz(examples: int):
    # derandomized: the same examples on every run, so that a failure reproduces; no database
    # files in the repository. ~1 ms per example: the whole module takes a few CPU seconds.
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


SECTION_KEYS = ("enabled", "preset", "topology", "compression", "numerics", "collective_timeout_s")
BLOCKS = [2**k for k in range(5, 13)]

# -- JSON-like values of every kind ---------------------------------------------------------------
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=10),
    st.sampled_from(["auto", "none", "int8", "int4", "frontier", "zero3", "fp16", "3", "", "latest"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)

# -- valid sections -------------------------------------------------------------------------------
schemes = st.sampled_from(SCHEMES)
tier_schemes = st.one_of(schemes, st.dictionaries(st.sampled_from(TIERS), schemes, max_size=3))
compressions = st.one_of(
    st.none(),
    schemes,
    st.fixed_dictionaries(
        {}, optional={"weights": tier_schemes, "gradients": tier_schemes, "block_size": st.sampled_from(BLOCKS)}
    ),
)
topologies = st.fixed_dictionaries(
    {}, optional={"gcds_per_gpu": st.integers(1, 4), "gpus_per_node": st.integers(1, 8)}
)
timeouts = st.one_of(st.integers(1, 86400), st.floats(1.0, 86400.0))
sections = st.fixed_dictionaries(
    {},
    optional={
        "enabled": st.booleans(),
        # "auto" takes no compression section; its own errors are tested in tests/dist/test_auto.py
        "preset": st.sampled_from(FIXED_PRESETS),
        "topology": topologies,
        "compression": compressions,
        "collective_timeout_s": timeouts,
    },
)


def is_bad_int(v, lo=1):
    return not (isinstance(v, int) and not isinstance(v, bool) and v >= lo)


# -- one mutation each, with the field it must be reported at ------------------------------------
def _not(pred):
    return json_values.filter(lambda v: not pred(v))


def _valid_timeout(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v) and 1.0 <= v <= 86400.0


def _valid_block(v):
    # null means "the default"; an object gives one block size per tier (issue 4)
    return (
        v is None
        or (isinstance(v, int) and not isinstance(v, bool) and v in BLOCKS)
        or (isinstance(v, dict) and all(k in TIERS and _valid_block(x) and x is not None for k, x in v.items()))
    )


def _hashable_in(options):
    return lambda v: isinstance(v, str) and v in options


MUTATIONS = [
    # (path to set, strategy for the bad value, field the error must name)
    (("enabled",), _not(lambda v: isinstance(v, bool)), "zeropp_hier.enabled"),
    (("preset",), _not(_hashable_in(PRESETS)), "zeropp_hier.preset"),
    (("topology",), json_values.filter(lambda v: not isinstance(v, dict) and v != "auto"), "zeropp_hier.topology"),
    (("topology", "gcds_per_gpu"), json_values.filter(is_bad_int), "zeropp_hier.topology.gcds_per_gpu"),
    (("topology", "gpus_per_node"), json_values.filter(is_bad_int), "zeropp_hier.topology.gpus_per_node"),
    (
        ("topology", "rank_map"),
        json_values.filter(
            lambda v: v is not None and not (isinstance(v, list) and all(not is_bad_int(x, lo=-(2**80)) for x in v))
        ),
        "zeropp_hier.topology.rank_map",
    ),
    (
        ("compression",),
        json_values.filter(lambda v: v is not None and not isinstance(v, dict) and not _hashable_in(SCHEMES)(v)),
        "zeropp_hier.compression",
    ),
    (("compression", "block_size"), _not(_valid_block), "zeropp_hier.compression.block_size"),
    (("compression", "weights", "node"), _not(_hashable_in(SCHEMES)), "zeropp_hier.compression.weights.node"),
    (("compression", "gradients", "gpu"), _not(_hashable_in(SCHEMES)), "zeropp_hier.compression.gradients.gpu"),
    (("collective_timeout_s",), _not(_valid_timeout), "zeropp_hier.collective_timeout_s"),
]
UNKNOWN_KEY_AT = [(), ("topology",), ("compression",), ("compression", "weights"), ("compression", "gradients")]
ALLOWED = {
    # every key the parser takes (the generator above draws only a subset): a key drawn at random
    # that happens to be a real one ("pipeline", "memory") is not unknown
    (): _SECTION_KEYS,
    ("topology",): _TOPOLOGY_KEYS,
    ("compression",): _COMPRESSION_KEYS,
    ("compression", "weights"): TIERS,
    ("compression", "gradients"): TIERS,
}


def validate(section, world: int | None = None, zero: dict | None = None):
    """What ``initialize`` runs before any process group exists."""
    ds = {"zero_optimization": zero if zero is not None else {"stage": 3}, "zeropp_hier": section}
    cfg = hier_config_from_ds(ds)
    if world is not None and cfg.enabled and cfg.topology.mode != "auto":  # auto: detected collectively
        topo = topology_for(cfg, world)
        make_plan(cfg.preset, cfg.compression, topo)
    return cfg


def assert_names_field(err: HierConfigError, field: str):
    # the field itself, or a key inside it (e.g. one tier of a per-tier object)
    assert err.field == field or err.field.startswith(field + "."), (
        f"error names {err.field!r}, expected {field!r}: {err}"
    )
    assert str(err).startswith(f"zeropp_hier config error at '{err.field}': got "), str(err)
    assert err.fix and len(err.fix) > 10


@fuzz(300)
@given(section=sections)
def test_valid_sections_parse_to_what_was_written(section):
    cfg = parse_section(section)
    assert cfg.enabled == section.get("enabled", True)
    assert cfg.preset == section.get("preset", "frontier")
    topo = section.get("topology", {})
    assert cfg.topology.gcds_per_gpu == topo.get("gcds_per_gpu", 2)
    assert cfg.topology.gpus_per_node == topo.get("gpus_per_node", 4)
    assert cfg.collective_timeout_s == float(section.get("collective_timeout_s", DEFAULT_COLLECTIVE_TIMEOUT_S))
    comp = section.get("compression")
    if isinstance(comp, dict):
        assert cfg.compression.block_size == comp.get("block_size", DEFAULT_BLOCK_SIZE)
        for kind in ("weights", "gradients"):
            given_ = comp.get(kind)
            for tier in TIERS:
                want = (
                    given_
                    if isinstance(given_, str)
                    else (given_ or {}).get(tier, PRESET_COMPRESSION[cfg.preset][kind].get(tier, "none"))
                )
                attr = "forward_weights" if kind == "weights" else kind
                assert getattr(cfg.compression, attr).of(tier) == want
    elif isinstance(comp, str):
        assert {getattr(cfg.compression, k).of(t) for k in ("weights", "gradients") for t in TIERS} == {comp}


@fuzz(800)
@given(section=sections, data=st.data())
def test_one_bad_value_is_reported_at_its_field(section, data):
    path, bad, field = data.draw(st.sampled_from(MUTATIONS))
    value = data.draw(bad)
    broken = set_path(section, path, value)
    try:
        parse_section(broken)
    except HierConfigError as e:
        assert_names_field(e, field)
        return
    raise AssertionError(f"accepted an invalid section: {broken!r}")


@fuzz(400)
@given(section=sections, data=st.data())
def test_unknown_key_is_reported_at_its_path(section, data):
    where = data.draw(st.sampled_from(UNKNOWN_KEY_AT))
    key = data.draw(st.text(min_size=1, max_size=12).filter(lambda k: k not in ALLOWED[where]))
    value = data.draw(json_values)
    broken = set_path(section, where + (key,), value)
    try:
        parse_section(broken)
    except HierConfigError as e:
        assert_names_field(e, ".".join(("zeropp_hier",) + where + (key,)))
        assert "unknown key; allowed keys are" in str(e)
        return
    raise AssertionError(f"accepted an unknown key: {broken!r}")


ZERO_KEYS = [
    "stage",
    "zero_hpz_partition_size",
    "zero_quantized_weights",
    "zero_quantized_gradients",
    "zero_quantized_nontrainable_weights",
    "reduce_scatter",
    "offload_param",
    "offload_optimizer",
    "stage3_param_persistence_threshold",
]


@fuzz(1000)
@given(
    section=st.one_of(
        sections, json_values, st.dictionaries(st.sampled_from(SECTION_KEYS + ("junk",)), json_values, max_size=5)
    ),
    zero=st.one_of(json_values, st.dictionaries(st.sampled_from(ZERO_KEYS), json_values, max_size=4)),
    world=st.integers(1, 64),
)
def test_junk_never_escapes_as_another_exception(section, zero, world):
    try:
        cfg = validate(section, world, zero)
    except HierTopologyError as e:
        assert e.field in ("topology", "topology.rank_map"), e
        assert f"at '{e.field}': got " in str(e)
    except HierConfigError as e:
        assert e.field.split(".")[0] in ("zeropp_hier", "zero_optimization"), e
        assert f"at '{e.field}': got " in str(e)
        if e.field.startswith("zeropp_hier."):
            # the error points at something the user wrote (defaults are always valid)
            rest = e.field[len("zeropp_hier.") :]
            assert isinstance(section, dict) and any(rest == str(k) or rest.startswith(f"{k}.") for k in section), (
                e,
                section,
            )
    else:
        assert cfg.enabled in (True, False)
    assert not dist.is_initialized()


@fuzz(400)
@given(
    section=sections.filter(lambda s: s.get("enabled", True)),
    world=st.integers(1, 128),
    rank_map=st.one_of(st.none(), st.lists(st.integers(-3, 130), max_size=12), st.permutations(range(8))),
)
def test_topology_against_world_size(section, world, rank_map):
    if rank_map is not None:
        section = set_path(section, ("topology", "rank_map"), list(rank_map))
    topo = section.get("topology", {})
    per_node = topo.get("gcds_per_gpu", 2) * topo.get("gpus_per_node", 4)
    fits = world % per_node == 0 and (rank_map is None or sorted(rank_map) == list(range(world)))
    try:
        validate(section, world)
    except HierTopologyError as e:
        assert not fits, e
        assert e.field == ("topology" if world % per_node else "topology.rank_map"), e
        return
    assert fits, f"accepted world {world} for {section!r}"
