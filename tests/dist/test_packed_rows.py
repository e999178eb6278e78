"""Packed buckets through the whole engine, on a real world: every bucket whose whole-block
padding outweighs its values packed, as at 75,264 ranks ([Note: per-rank costs flat in the
world], [Note: a packed row's block] in core/layout.py), kept copies of whole rows
([Note: kept copies of packed buckets] in comm/gather.py)."""

from zeropp_hier.app.spec import ds_config

from ..helpers import rel_diff
from . import ranks_packed, ranks_training

STEPS = 3


def test_packed_buckets_keep_exact_copies_and_train(world8):
    topo = dict(gpus_per_node=2, gcds_per_gpu=2)
    cfgs = {"frontier": ds_config("frontier", **topo), "zeropp": ds_config("zeropp", **topo)}
    results = world8.run(ranks_packed.run_packed, cfgs, STEPS)
    stock = world8.run(ranks_training.run_configs, {"stock": ds_config(None)}, STEPS)
    for rank, res in enumerate(results):
        for name, r in res.items():
            what = f"rank {rank} {name}"
            assert r["packed"] > 0, f"{what}: no bucket packed"
            assert r["rows"] > 0, f"{what}: no backward gather ran from a whole kept row"
            assert r["compared"] > 0 and r["differ"] == 0, f"{what}: backward weights differ from the forward's: {r}"
            final = r["losses"][-1]
            ref = stock[rank]["stock"]["losses"][-1]
            assert rel_diff(final, ref) <= 0.02, f"{what}: final loss {final} vs stock {ref}"
