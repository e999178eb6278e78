"""Nothing of ours in flight at a boundary ([Note: quiet boundaries] in zeropp_hier/comm/boundary.py):
a real hop gather is queued on a real engine's executor, held behind a gate that only a drain
opens; then the step's boundary operations run (the optimizer step with its agreed non-finite
check, a checkpoint save, a load). Each must drain the executor before its own work starts."""

import pytest

from zeropp_hier.app.spec import ds_config

from . import ranks_boundary as rb

LABELS = {"step": "numerics agreement", "save": "first file write", "load": "first file read"}


@pytest.fixture(scope="module")
def drained(world4, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("boundary"))
    cfg = ds_config("frontier", gpus_per_node=2, gcds_per_gpu=2, compression="none")  # 1 x 2 x 2
    return world4.run(rb.boundaries_drain, cfg, root)


@pytest.mark.parametrize("op", ["step", "save", "load"])
def test_boundary_drains_a_queued_gather_before_its_own_work(drained, op):
    label = LABELS[op]
    for rank, r in enumerate(drained):
        got = r["ops"][op]
        assert got["queued"] >= 2, got  # the gate and the gather's hops were in flight on entry
        # the drain opened the gate, the gather finished, and only then did the operation begin
        assert got["events"] == ["drain began", "gather done", label], f"rank {rank}: {got['events']}"
        assert got["seen"][label] == {"gather_done": True, "in_flight": 0}, f"rank {rank}: {got['seen']}"
        # the gather itself was real and complete: every rank's rows, each intact
        assert got["rows"] == [1000.0 * q for q in range(r["world"])], got["rows"]
        assert got["row_ok"], got
    assert drained[0]["saved"]
