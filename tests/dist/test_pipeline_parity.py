"""Whole-engine parity of pipelined hops ([Note: chunked gathers] in comm/gather.py): ``frontier``
without compression, every gather and gradient bucket cut into chunks, against stock DeepSpeed ZeRO-3 in the
same 8-rank world (2 nodes x 2 GPUs x 2 GCDs), beside the same preset unchunked."""

from zeropp_hier.app.spec import ds_config

from ..helpers import assert_losses_close, assert_states_close
from . import ranks_training

STEPS = 4
CHUNKS = 3


def _configs():
    pipelined = ds_config("frontier", compression="none")
    pipelined["zeropp_hier"]["pipeline"] = {"chunks": CHUNKS}
    return {
        "stock": ds_config(None),
        "frontier_exact": ds_config("frontier", compression="none"),
        "pipelined": pipelined,
    }


def test_pipelined_frontier_matches_stock(world8):
    for rank, res in enumerate(world8.run(ranks_training.run_configs, _configs(), STEPS)):
        for name in ("pipelined", "frontier_exact"):
            what = f"rank {rank} {name}"
            assert_losses_close(res[name]["losses"], res["stock"]["losses"], 1e-5, what)
            assert_states_close(res[name]["state"], res["stock"]["state"], 1e-5, what)
        what = f"rank {rank} pipelined"
        plain, piped = res["frontier_exact"]["stats"], res["pipelined"]["stats"]
        for phase in ("forward_gather", "backward_gather", "grad_reduce"):
            # the same bytes on every tier, in more collectives: gathers and stages really were chunked
            assert piped["bytes"][phase] == plain["bytes"][phase], (what, phase)
            for tier, calls in plain["calls"][phase].items():
                if calls:
                    assert piped["calls"][phase][tier] > calls, (what, phase, tier, piped["calls"][phase])
