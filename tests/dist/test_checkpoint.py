"""Save, load into a fresh engine, continue: same as never stopping; kept shards rebuilt."""

import pytest

from zeropp_hier.app.spec import ds_config

from ..helpers import assert_losses_close, assert_states_close
from . import ranks_training


@pytest.fixture(scope="module")
def resumed(world8, tmp_path_factory):
    ckpt = str(tmp_path_factory.mktemp("ckpt"))
    return world8.run(ranks_training.checkpoint_resume, ds_config("frontier", compression="none"), ckpt, 5, 5)


def test_resume_equals_uninterrupted(resumed):
    for rank, r in enumerate(resumed):
        assert_losses_close(r["resumed_losses"], r["ref_losses"], 1e-6, f"rank {rank} after resume")
        assert_states_close(r["state"], r["ref_state"], 1e-6, f"rank {rank} final weights")


def test_shards_invalidated_on_load_and_rebuilt_from_loaded_weights(resumed):
    for r in resumed:
        assert r["shards_after_load"] == 0
        assert r["shard_errors"]["count"] > 0, "no shard was rebuilt: the check proves nothing"
        assert r["shard_errors"]["max"] == 0.0
        # the continued run used the kept shards for its backward gathers
        assert r["stats"]["calls"]["backward_gather"]["gcd"] > 0


def test_a_save_lists_no_partition_group_ranks_without_autoep_experts(resumed):
    """[Note: partition groups only for AutoEP]: DeepSpeed's metadata of partition groups lists
    every rank of each sub-group's group at every save, then drops it unless a parameter is an
    AutoEP expert. Our save lists none and returns what DeepSpeed's returns (None); with an
    expert parameter, DeepSpeed's own metadata, its group's 8 ranks listed."""
    for rank, r in enumerate(resumed):
        m = r["partition_metadata"]
        assert m["rank_lists_in_save"] == 0, rank
        assert m["ours"] is None and m["deepspeed"] is None, rank
        assert m["rank_lists_autoep"] > 0 and m["ours_autoep"] == m["deepspeed_autoep"], rank
        assert all(g["partition_ranks"] == list(range(8)) for g in m["ours_autoep"]), rank
