"""A rank that cannot write: a write refused inside DeepSpeed's own save on one rank ends the save
on every rank with the same named error (rank, file, cause), within the collective timeout; the
previous checkpoint stays the one 'latest' names and loads bit for bit ([Note: a rank that
cannot write] in zeropp_hier/deepspeed/checkpoint/writes.py)."""

import os

import pytest

from zeropp_hier.app.spec import ds_config
from zeropp_hier.deepspeed import checkpoint

from . import ranks_save_faults as rs

DS_TIMEOUT_S = 60.0
CASES = [("fsize", 2), ("enospc", 0)]  # (how the write is refused, on which rank)


@pytest.fixture(scope="module")
def refused(world4, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("refused"))
    cfg = ds_config("frontier", gpus_per_node=2, gcds_per_gpu=2, compression="none")  # 1 x 2 x 2
    cfg["zeropp_hier"].update(collective_timeout_s=10.0, deepspeed_group_timeout_s=DS_TIMEOUT_S)
    return root, world4.run(rs.save_with_a_write_refused, cfg, root, 2, CASES)


@pytest.mark.parametrize("kind,victim", CASES)
def test_every_rank_raises_the_same_named_error(refused, kind, victim):
    _, out = refused
    errors = [r["errors"][kind] for r in out]
    assert all(e is not None for e in errors), errors
    assert len({(e["path"], e["problem"]) for e in errors}) == 1, errors
    e = errors[0]
    assert f"failed on rank {victim}:" in e["problem"], e
    assert "nothing committed, 'latest' unchanged" in e["problem"], e
    assert f".tmp-bad_{kind}" in e["path"], e
    # the victim's first file (ZeRO-3 writes a model-states file per rank): named with its cause
    assert os.path.basename(e["path"]) == f"zero_pp_rank_{victim}_mp_rank_00_model_states.pt", e
    if kind == "fsize":  # the kernel refused the write: torch's writer says so its own way
        assert "RuntimeError" in e["problem"] and "refused a write" in e["problem"], e
    else:
        assert "No space left on device" in e["problem"], e
    assert "free space" in e["fix"], e
    seconds = [r["errors"][kind]["seconds"] for r in out]
    print(f"{kind} on rank {victim}: every rank raised within {max(seconds):.2f} s (bound {DS_TIMEOUT_S:g} s)")
    assert max(seconds) < DS_TIMEOUT_S, seconds


def test_previous_checkpoint_stays_latest_and_loads_bit_for_bit(refused):
    root, out = refused
    with open(os.path.join(root, "latest")) as f:
        assert f.read() == "good"
    assert checkpoint.complete_tags(root) == ["good"]
    assert checkpoint.verify_tag(root, "good") == []
    # nothing of the refused saves is left behind (rank 0 removed them), the good files untouched
    left = [n for n in os.listdir(root) if n.startswith(".") or n.startswith("bad")]
    assert left == [], left
    assert out[0]["good_files_before"] == out[0]["good_files_after"]
    for rank, r in enumerate(out):
        assert os.path.basename(os.path.dirname(r["loaded_path"])) == "good", r["loaded_path"]
        assert r["bit_equal"] == r["names"], f"rank {rank}: not bit for bit: {set(r['names']) - set(r['bit_equal'])}"
        assert all(loss == loss for loss in r["after_losses"])  # the world trained on after the failures
