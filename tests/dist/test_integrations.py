"""``zeropp_hier.patch_deepspeed()``: plain ``deepspeed.initialize`` honours the section, so the
Hugging Face Trainer (through Accelerate) runs the hierarchy with only the import, the patch
and the config flag. The Trainer runs on 4 real ranks (1 node x 2 packages x 2 GCDs). The patch
itself, without a world: tests/unit/test_patch.py."""
import pytest

from zeropp_hier.launch.world import LocalWorld

from . import ranks_hf

STEPS = 3


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("hf"))
    with LocalWorld(4, timeout=1500) as w:
        left = w.run(ranks_hf.shm_buffers_left)
        return {"left": left, "ranks": w.run(ranks_hf.hf_trainer_run, out, STEPS)}


def test_local_world_leaves_no_deepspeed_shm_buffers(hf_run):
    assert hf_run["left"] == [[]] * 4


def test_hf_trainer_trains_with_the_flag(hf_run):
    for r in hf_run["ranks"]:
        assert r["engine"] == "HierEngine" and r["patched"] and r["unpatched"]
        assert r["global_step"] == STEPS and len(r["losses"]) == STEPS
        assert all(0 < loss < 10 for loss in r["losses"])
        assert r["topology"] == [1, 2, 2]
    assert len({tuple(r["losses"]) for r in hf_run["ranks"]}) == 1  # the Trainer logs the loss averaged over ranks


def test_hf_trainer_backward_regathers_over_the_gcd_link_only(hf_run):
    for r in hf_run["ranks"]:
        calls, sent = r["stats"]["calls"], r["stats"]["bytes"]
        assert calls["backward_gather"]["gcd"] > 0 and sent["backward_gather"]["gcd"] > 0  # tertiary gathers
        assert sent["backward_gather"]["gpu"] == 0 and sent["backward_gather"]["node"] == 0
        assert sent["forward_gather"]["gpu"] > 0 and sent["grad_reduce"]["gpu"] > 0
