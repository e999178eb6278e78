"""zeropp_hier.Init (models built partitioned) and the disabled section, beside stock."""

import pytest

from ..helpers import assert_losses_close
from . import ranks_training


@pytest.fixture(scope="module")
def results(world8):
    return world8.run(ranks_training.init_parity, 4)


def test_partitioned_construction_matches_stock(results):
    for rank, r in enumerate(results):
        assert r["hier"]["engine"] == "HierEngine"
        assert r["hier"]["optimizer"] == "HierZeroOptimizer_Stage3"
        assert_losses_close(r["hier"]["losses"], r["stock"]["losses"], 1e-5, f"rank {rank}")
        # the parameters made under zeropp_hier.Init gather through the hierarchy
        assert r["hier"]["stats"]["calls"]["forward_gather"]["node"] > 0
        assert r["hier"]["stats"]["calls"]["backward_gather"]["gcd"] > 0


def test_disabled_section_is_stock_deepspeed(results):
    for r in results:
        assert r["disabled"] == {"engine": "DeepSpeedEngine", "optimizer": "DeepSpeedZeroOptimizer_Stage3"}


def test_weights_modified_outside_the_optimizer_reach_the_next_step(world8):
    results = world8.run(ranks_training.modified_weights, 3)
    for rank, r in enumerate(results):
        assert r["hier"]["kept_before"] > 0, "no shard was kept: the test proves nothing"
        assert_losses_close(r["hier"]["losses"], r["stock"]["losses"], 1e-5, f"rank {rank}")
