"""The universal conversion made by the ranks of a job, each its share ([Note: a conversion in
shares] in zeropp_hier/deepspeed/checkpoint/universal.py): a 4-rank checkpoint converted by 2 ranks
gives, file for file and bit for bit, what DeepSpeed's ds_to_universal gives in one process
(``checkpoint.to_universal``); what it read and wrote is counted; a damaged source file found by
one rank's share is named on every rank, and nothing is committed."""

import os
import shutil

import pytest

from zeropp_hier.app.longrun import resume
from zeropp_hier.app.spec import ds_config
from zeropp_hier.deepspeed import checkpoint
from zeropp_hier.deepspeed.checkpoint.files import read_manifest
from zeropp_hier.launch.world import WorldError

from . import ranks_universal as ru

TAG = "t"


@pytest.fixture(scope="module")
def source(world4, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("src") / "ck")
    world4.run(ru.train_and_save, ds_config("frontier", gpus_per_node=2, gcds_per_gpu=2), root, TAG, 2)
    return root


def test_two_ranks_convert_a_four_rank_checkpoint_like_one_process(source, world2, tmp_path):
    one = checkpoint.to_universal(source, str(tmp_path / "one"), TAG)
    out = world2.run(ru.convert, source, str(tmp_path / "shared"), TAG)
    assert out[0] == out[1] | {"seconds": out[0]["seconds"]}  # every rank returns the same account
    got, want = read_manifest(out[0]["out"])[0], read_manifest(one)[0]
    assert got is not None and want is not None
    # the same files with the same bytes (the manifests' sha256), the fp32 tensors included
    assert {k: v["sha256"] for k, v in got["files"].items()} == {k: v["sha256"] for k, v in want["files"].items()}
    assert any(k.endswith("exp_avg_sq.pt") for k in got["files"]) and len(got["files"]) > 10
    assert got["source_manifest_sha256"] == want["source_manifest_sha256"]
    assert checkpoint.verify_tag(str(tmp_path / "shared"), TAG) == []
    # every file of the source, the other ranks' from their pieces of its manifest
    assert out[0]["bytes_read"] == sum(resume.saved_sizes(source, TAG).values())
    assert out[0]["bytes_written"] == sum(f["bytes"] for f in got["files"].values())
    assert (out[0]["source_world"], out[0]["world"]) == (4, 2) and out[0]["seconds"] > 0
    with open(tmp_path / "shared" / "latest_universal") as f:
        assert f.read().strip() == TAG


def test_a_damaged_file_in_one_share_is_named_on_every_rank(source, world2, tmp_path):
    bad = str(tmp_path / "bad")
    shutil.copytree(source, bad)
    victim = os.path.join(bad, TAG, "zero_pp_rank_3_mp_rank_00_optim_states.pt")
    with open(victim, "ab") as f:
        f.write(b"x")
    with pytest.raises(WorldError) as e:
        world2.run(ru.convert, bad, str(tmp_path / "out"), TAG)
    texts = list(e.value.failures.values())
    assert len(texts) == 2 and all("zero_pp_rank_3_mp_rank_00_optim_states.pt" in t for t in texts), texts
    assert not os.path.exists(tmp_path / "out" / TAG)
