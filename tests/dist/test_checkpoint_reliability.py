"""Checkpoints that survive: a rank killed mid-write leaves the previous checkpoint and 'latest'
intact and training resumes from it; damaged files are refused by name on every rank; a
checkpoint saved on 2x2x2 loads under another topology and on another number of ranks, and
DeepSpeed's own zero_to_fp32 reads it."""

import json
import math
import os
import pickle
import shutil
import struct
import zipfile

import pytest
import torch

from zeropp_hier.app.spec import ds_config
from zeropp_hier.deepspeed import checkpoint
from zeropp_hier.launch.world import LocalWorld, WorldError

from ..helpers import assert_losses_close, assert_states_close, max_state_diff
from . import ranks_reliability as rs
from .test_failures import parse_error, processes_of

STEPS_BEFORE, STEPS_AFTER = 3, 3


def four_rank_config(**kw):
    return ds_config("frontier", gpus_per_node=2, gcds_per_gpu=2, compression="none", **kw)  # 1 x 2 x 2


# -- a rank killed while writing ------------------------------------------------------------------


@pytest.fixture(scope="module")
def crashed_save(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("crashed"))
    cfg = four_rank_config()
    cfg["zeropp_hier"]["collective_timeout_s"] = 10.0
    world = LocalWorld(4, timeout=600, pg_timeout_s=60.0, failure_grace_s=20.0, preload=True)
    try:
        with pytest.raises(WorldError) as e:
            world.run(rs.save_then_die_in_save, cfg, root, 2, STEPS_BEFORE, 2)
    finally:
        world.close(force=True)
    return root, cfg, e.value, world


def test_kill_during_save_leaves_previous_checkpoint_and_latest(crashed_save):
    root, _, err, world = crashed_save
    assert "killed by SIGKILL" in err.failures[2]
    # the crash really happened mid-write: the victim's file of the new tag is half there
    partial = os.path.join(root, ".tmp-bad", "zero_pp_rank_2_mp_rank_00_optim_states.pt")
    assert os.path.isfile(partial) and os.path.getsize(partial) > 0
    # a truncated file: torch's zip reader fails (RuntimeError, or OSError where the truncated
    # archive's directory points past the end), or unpickling runs out of bytes
    with pytest.raises((RuntimeError, OSError, EOFError, pickle.UnpicklingError)):
        torch.load(partial, weights_only=False)
    # ... yet nothing points at it: 'latest' still names the complete previous tag
    with open(os.path.join(root, "latest")) as f:
        assert f.read() == "good"
    assert not os.path.exists(os.path.join(root, "bad"))
    assert checkpoint.verify_tag(root, "good") == []
    assert checkpoint.complete_tags(root) == ["good"]
    # the other ranks stopped on their own, each naming what it waited for
    assert err.killed == [] and processes_of(world) == []
    for rank in (0, 1, 3):
        p = parse_error(err.failures[rank])
        assert p is not None, err.failures[rank]
        assert "checkpoint" in p["phase"] or p["phase"].startswith("DeepSpeed"), p


def test_resume_from_previous_checkpoint_equals_uninterrupted(crashed_save, world4):
    root, cfg, _, _ = crashed_save
    out = world4.run(rs.resume_from_latest, cfg, root, STEPS_BEFORE, STEPS_AFTER)
    for rank, r in enumerate(out):
        assert os.path.basename(os.path.dirname(r["path"])) == "good" and r["loaded_steps"] == STEPS_BEFORE
        assert_losses_close(r["losses"], r["ref_losses"], 1e-6, f"rank {rank} resumed")
        assert_states_close(r["state"], r["ref_state"], 1e-6, f"rank {rank} resumed")


# -- resharding (the 8-rank source also feeds the corruption tests) -------------------------------


@pytest.fixture(scope="module")
def source(world8, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("source"))
    cfg = ds_config("frontier", compression="none")  # 2 nodes x 2 GPUs x 2 GCDs
    out = world8.run(rs.reshard_source, cfg, root, STEPS_BEFORE, STEPS_AFTER)
    return root, out


def test_zero_to_fp32_of_our_checkpoint_equals_gathered_model(source):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    root, out = source
    consolidated = get_fp32_state_dict_from_zero_checkpoint(root, tag="reshard")
    saved = out[0]["saved"]
    assert set(consolidated) == set(saved)
    assert max_state_diff({k: v.float() for k, v in consolidated.items()}, saved) == 0.0


def test_load_under_other_topology_same_world(source, world8):
    """2x2x2 -> 1 node x 2 GPUs x 4 GCDs: same 8 ranks, so DeepSpeed's partitions (and the Adam
    states with them) load as they are; the hops and kept shards follow the new topology."""
    root, src = source
    cfg = ds_config("frontier", compression="none", gpus_per_node=2, gcds_per_gpu=4)
    out = world8.run(rs.reshard_target, cfg, root, STEPS_BEFORE, STEPS_AFTER)
    for rank, r in enumerate(out):
        assert max_state_diff(r["loaded"], src[rank]["saved"]) == 0.0
        assert_losses_close(r["losses"], src[rank]["ref_losses"], 1e-5, f"rank {rank} on 1x2x4")
        assert_states_close(r["state"], src[rank]["ref_state"], 1e-5, f"rank {rank} on 1x2x4")


def test_load_on_four_ranks_under_zero3_carries_weights_and_adam_states(source, world4, tmp_path):
    """8 ranks -> 4 ranks through DeepSpeed's universal checkpoint. The global batch is the same
    16 samples (8 x 2 before, 4 x 4 after), so continuing must match the 8-rank run."""
    root, src = source
    universal = checkpoint.to_universal(root, str(tmp_path / "universal"), tag="reshard")
    assert checkpoint.verify_tag(str(tmp_path / "universal"), "reshard") == []
    plain = ds_config("zero3", micro_batch=4, gpus_per_node=2, gcds_per_gpu=2)
    cfg = ds_config(
        "zero3", micro_batch=4, gpus_per_node=2, gcds_per_gpu=2, overrides={"checkpoint": {"load_universal": True}}
    )
    out = world4.run(
        rs.reshard_target, cfg, os.path.dirname(universal), STEPS_BEFORE, STEPS_AFTER, control=(plain, root)
    )
    ref = src[0]
    for rank, r in enumerate(out):
        assert r["world"] == 4
        assert max_state_diff(r["loaded"], ref["saved"]) == 0.0
        assert_losses_close(r["losses"], ref["ref_losses"], 1e-5, f"rank {rank} on 4 ranks")
        assert_states_close(r["state"], ref["ref_state"], 1e-5, f"rank {rank} on 4 ranks")
    # control: the same weights with fresh Adam states train differently, so the match above
    # shows that the optimizer states carried over, not just the weights
    assert max_state_diff(out[0]["weights_only_loaded"], ref["saved"]) == 0.0
    control = out[0]["weights_only_losses"]
    assert max(abs(a - b) / abs(b) for a, b in zip(control[1:], ref["ref_losses"][1:])) > 1e-3


# -- damaged checkpoints --------------------------------------------------------------------------


def _flip_tensor_byte(path: str) -> None:
    """Flip one byte inside the first tensor's data of a torch zip file (not its header)."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if "/data/" in i.filename and i.file_size > 64)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
        pos = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x40]))


def test_damaged_checkpoints_are_refused_by_name_on_every_rank(source, world8, tmp_path):
    root, _ = source
    cases, expect = {}, {}

    def copy(name):
        dst = str(tmp_path / name)
        shutil.copytree(root, dst)
        return dst, os.path.join(dst, "reshard")

    r, tag_dir = copy("truncated")
    victim = os.path.join(tag_dir, "zero_pp_rank_3_mp_rank_00_model_states.pt")
    with open(victim, "r+b") as f:
        f.truncate(os.path.getsize(victim) // 2)
    cases["truncated"], expect["truncated"] = (r, "reshard"), (victim, "truncated")

    r, tag_dir = copy("flipped")
    victim = os.path.join(tag_dir, "zero_pp_rank_6_mp_rank_00_optim_states.pt")
    size = os.path.getsize(victim)
    _flip_tensor_byte(victim)
    assert os.path.getsize(victim) == size
    torch.load(victim, weights_only=False)  # the damage is silent to torch: only the checksum sees it
    cases["flipped"], expect["flipped"] = (r, "reshard"), (victim, "corrupted")

    r, tag_dir = copy("missing")
    victim = os.path.join(tag_dir, "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    os.remove(victim)
    cases["missing"], expect["missing"] = (r, "reshard"), (victim, "missing")

    r, tag_dir = copy("no_manifest")
    victim = os.path.join(tag_dir, checkpoint.MANIFEST)
    os.remove(victim)
    cases["no_manifest"], expect["no_manifest"] = (r, "reshard"), (victim, "not committed by zeropp_hier")

    r, tag_dir = copy("bad_manifest")
    victim = os.path.join(tag_dir, checkpoint.MANIFEST)
    with open(victim) as f:
        m = json.load(f)
    m["files"] = "junk"
    with open(victim, "w") as f:
        json.dump(m, f)
    cases["bad_manifest"], expect["bad_manifest"] = (r, "reshard"), (victim, "unreadable manifest")

    r, _ = copy("latest_to_nowhere")
    with open(os.path.join(r, "latest"), "w") as f:
        f.write("ghost")
    cases["latest_to_nowhere"], expect["latest_to_nowhere"] = (r, None), (os.path.join(r, "ghost"), "no such")

    out = world8.run(rs.try_loads, ds_config("frontier", compression="none"), cases, (root, "reshard"))
    for rank, res in enumerate(out):
        for name, (path, words) in expect.items():
            e = res["errors"][name]
            assert e is not None, f"rank {rank} loaded the {name} checkpoint"
            assert e["path"] == path, (rank, name, e)
            assert words in e["message"] and f"'{path}'" in e["message"], (rank, name, e)
            assert "complete tags" in e["message"] or "no other complete tag" in e["message"]
        assert res["untouched"] == 0.0, "a refused load changed the weights"
        assert os.path.basename(os.path.dirname(res["good_path"])) == "reshard" and res["moved"] > 0
        assert math.isfinite(res["loss_after"])  # and the world is still usable
