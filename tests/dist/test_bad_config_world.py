"""Bad configs in a real 8-rank world: ``zeropp_hier.initialize`` refuses every one on every rank
with our error naming the field, before DeepSpeed creates a group or issues a collective; the
world is still usable afterwards. (test_config_fuzz.py covers thousands of sections, pure.)"""

from zeropp_hier.app.spec import ds_config

from ..helpers import set_path
from . import ranks_reliability as rs

JUNK = [None, -1, 0, 3.5, "int3", "", [], {}, True, float("nan"), 10**30, {"node": "int5"}]
# where each junk value goes; a junk value that is valid there (null = default) is skipped
FIELDS = ("enabled", "preset", "collective_timeout_s", "topology.gpus_per_node", "compression.block_size")
VALID_THERE = {
    "enabled": (True,),
    "preset": (None,),
    "collective_timeout_s": (None, 3.5),
    "topology.gpus_per_node": (None,),
    "compression.block_size": (None, {}),
}


def _spoiled(path: str, value) -> dict:
    return set_path(ds_config("frontier"), tuple(path.split(".")), value)


def bad_configs() -> list[tuple[dict, str]]:
    """(config, text the error's field must contain): each section field spoiled with junk, plus
    topologies that do not fit the 8-rank world and DeepSpeed settings that conflict."""
    out = []
    for field in FIELDS:
        for value in JUNK:
            if any(value is v or value == v and type(value) is type(v) for v in VALID_THERE[field]):
                continue
            # a huge gpus_per_node is a valid number that does not fit the world: "topology"
            out.append(
                (_spoiled(f"zeropp_hier.{field}", value), "topology" if field.startswith("topology") else field)
            )
    out += [
        (_spoiled("zeropp_hier.topology.gpus_per_node", 3), "topology"),  # 8 ranks, 6 per node
        (_spoiled("zeropp_hier.topology.gcds_per_gpu", 16), "topology"),  # bigger than the world
        (_spoiled("zeropp_hier.topology.rank_map", [0, 1, 2, 3, 4, 5, 6, 6]), "rank_map"),
        (_spoiled("zeropp_hier.compression.gradients", {"node": "int2"}), "compression.gradients"),
        (_spoiled("zeropp_hier.compression.error_feedback", "sometimes"), "compression.error_feedback"),
        (_spoiled("zeropp_hier.numerics.nonfinite", "ignore"), "numerics.nonfinite"),
        (_spoiled("zeropp_hier.typo", 1), "zeropp_hier"),
        (_spoiled("zero_optimization.stage", 2), "zero_optimization.stage"),
        (_spoiled("zero_optimization.zero_hpz_partition_size", 8), "zero_hpz_partition_size"),
        (_spoiled("zero_optimization.offload_param", {"device": "cpu"}), "offload_param"),
    ]
    return out


def test_every_rank_refuses_every_bad_config_and_the_world_still_works(world8):
    cases = bad_configs()
    assert len(cases) > 40
    results = world8.run(rs.initialize_bad_configs, [c for c, _ in cases])
    for rank, r in enumerate(results):
        assert r["sum"] == 8.0
        assert r["groups_after"] == r["groups_before"], f"rank {rank}: a process group was created"
        for (cfg, expect), (kind, field) in zip(cases, r["outcomes"]):
            assert kind in ("HierConfigError", "HierTopologyError"), (rank, cfg.get("zeropp_hier"), kind, field)
            assert expect in field, (rank, expect, field)
    # every rank refused for the same reason (no rank went on into DeepSpeed alone)
    assert all(r["outcomes"] == results[0]["outcomes"] for r in results)
