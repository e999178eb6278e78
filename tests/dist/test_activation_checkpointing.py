"""Activation checkpointing per block, with both APIs (torch.utils.checkpoint non-reentrant, as
transformers enables it; deepspeed.checkpointing.checkpoint), on the job's GPT-NeoX: the
recompute in backward gathers each block's weights again, through the hierarchy. Parity with
stock DeepSpeed ZeRO-3 running the same checkpointing, in the same world."""

import pytest

from zeropp_hier.app.spec import ModelSpec, ds_config

from ..helpers import assert_losses_close, assert_states_close, rel_diff
from . import ranks_models

STEPS = 4
SPEC = ModelSpec(seq_len=32, layers=2)  # the quickstart's tiny GPT-NeoX, shorter samples, two blocks
CONFIGS = {
    "stock": ds_config(None),
    "zero3": ds_config("zero3", compression="none"),
    "frontier_exact": ds_config("frontier", compression="none"),
    "frontier": ds_config("frontier"),  # its default (hybrid) compression
}


@pytest.fixture(scope="module", params=["torch", "deepspeed"])
def runs(request, world8):
    return request.param, world8.run(ranks_models.checkpointed_runs, CONFIGS, SPEC, request.param, STEPS)


def test_backward_recomputes_every_block(runs):
    api, results = runs
    for r in results:
        for name, res in r.items():
            # one forward and one recompute per micro-step (accumulation 1)
            assert res["block_forwards"] == 2 * STEPS, f"{api} {name}: {res['block_forwards']} block forwards"


def test_exact_presets_equal_stock_with_the_same_checkpointing(runs):
    api, results = runs
    for rank, res in enumerate(results):
        for name in ("zero3", "frontier_exact"):
            what = f"{api} rank {rank} {name}"
            assert_losses_close(res[name]["losses"], res["stock"]["losses"], 1e-5, what)
            assert_states_close(res[name]["state"], res["stock"]["state"], 1e-5, what)


def test_default_compression_within_the_compressed_tolerance(runs):
    api, results = runs
    final = sum(r["frontier"]["losses"][-1] for r in results) / len(results)
    stock = sum(r["stock"]["losses"][-1] for r in results) / len(results)
    assert rel_diff(final, stock) <= 0.02, f"{api}: final loss {final} vs stock {stock}"
    assert results[0]["frontier"]["losses"] != results[0]["stock"]["losses"]  # it did compress
    assert results[0]["stock"]["losses"][-1] < results[0]["stock"]["losses"][0]  # and it learns
