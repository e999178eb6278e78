"""Checkpoints that cannot run code or lose a run ([Note: tensors-only loading], [Note: atomic
checkpoint]): real checkpoints of every preset load tensors-only; a pickle that would run code is
refused on every rank and nothing runs; the manifest covers every file and only plain names; a
save killed at each step of its commit leaves a checkpoint that loads; a conversion never
replaces its source; a directory that one rank does not see, or an I/O error on one rank, is
reported on every rank with the rank, the file and the cause."""

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch

from zeropp_hier.app.spec import ds_config
from zeropp_hier.deepspeed import checkpoint
from zeropp_hier.deepspeed.checkpoint import safe_load

from ..helpers import max_state_diff
from . import ranks_checkpoint as rc


def four_rank_config(preset="frontier", **kw):
    return ds_config(preset, gpus_per_node=2, gcds_per_gpu=2, **kw)  # 1 x 2 x 2


INT4_GRADIENTS = {"gradients": {"gpu": "int4", "node": "int4"}}  # "auto" feeds the int4 node stage back
CASES = {  # every preset, fp32 and bf16, and one that carries error-feedback state
    **{
        f"{preset}-{dtype}": four_rank_config(preset, dtype=dtype)
        for preset in ("zero3", "zeropp", "frontier")
        for dtype in ("fp32", "bf16")
    },
    "frontier-int4-fp32": four_rank_config("frontier", compression=INT4_GRADIENTS),
}


@pytest.fixture(scope="module")
def saved(world4, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("presets"))
    return root, world4.run(rc.save_and_reload, CASES, root)


def test_real_checkpoints_of_every_preset_need_only_the_allowlist_and_load_exactly(saved):
    root, out = saved
    allowed = set(safe_load.allowed_names())
    for name in CASES:
        found = set().union(*out[0][name]["globals"].values())
        # torch's own tensors-only set is not enough (the survey is not vacuous) ...
        assert found, name
        # ... and what it lacks is exactly what the allowlist adds, nothing else
        assert found <= allowed, (name, found - allowed)
        for rank, r in enumerate(out):
            assert os.path.basename(os.path.dirname(r[name]["path"])) == "t"
            assert r[name]["max_diff"] == 0.0, (name, rank)
    # the error-feedback residuals were in the checkpoint that loaded tensors-only
    with torch.serialization.safe_globals(safe_load.allowed_globals()):
        optim = torch.load(
            os.path.join(root, "frontier-int4-fp32", "t", "zero_pp_rank_0_mp_rank_00_optim_states.pt"),
            weights_only=True,
        )
    assert optim["optimizer_state_dict"]["zeropp_hier_error_feedback"]


def test_zero_to_fp32_runs_tensors_only_and_equals_the_saved_weights(saved):
    root, out = saved
    consolidated = checkpoint.to_fp32(os.path.join(root, "zero3-bf16"))
    ref = out[0]["zero3-bf16"]["saved"]
    assert set(consolidated) == set(ref)
    # bf16 weights are the fp32 master weights rounded: the consolidated fp32 rounds to them
    assert max_state_diff({k: v.to(torch.bfloat16).float() for k, v in consolidated.items()}, ref) == 0.0


# -- a pickle that would run code -----------------------------------------------------------------


class RunsCode:
    """Unpickling this object calls ``exec``: it writes ``marker``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('code ran')",))


def _rehash(tag_dir):
    """Rewrite the manifest to match the files (what a writer of the directory can do): one list
    of every file, the pieces' included."""
    path = os.path.join(tag_dir, checkpoint.MANIFEST)
    with open(path) as f:
        m = json.load(f)
    m["format"] = checkpoint.MANIFEST_FORMAT
    m.pop("ranks", None)
    m["files"] = {rel: checkpoint.file_digest(os.path.join(tag_dir, rel)) for rel in checkpoint.list_files(tag_dir)}
    with open(path, "w") as f:
        json.dump(m, f)


@pytest.fixture
def booby_trapped(saved, tmp_path):
    root, _ = saved
    dst = str(tmp_path / "trapped")
    shutil.copytree(os.path.join(root, "frontier-fp32"), dst)
    marker = str(tmp_path / "code_ran")
    victim = os.path.join(dst, "t", "zero_pp_rank_0_mp_rank_00_model_states.pt")
    sd = torch.load(victim, weights_only=True)
    sd["extra"] = RunsCode(marker)
    torch.save(sd, victim)
    _rehash(os.path.join(dst, "t"))
    assert checkpoint.verify_tag(dst, "t", trust_pickles=True) == []  # the manifest alone passes it
    return dst, victim, marker


def test_pickle_that_runs_code_is_refused_on_every_rank_and_never_runs(booby_trapped, world4):
    root, victim, marker = booby_trapped
    out = world4.run(rc.load_each, CASES["frontier-fp32"], {"checked": root})
    out_unverified = world4.run(rc.load_each, CASES["frontier-fp32"], {"unchecked": root}, verify=False)
    for rank, res in enumerate(out + out_unverified):
        e = next(iter(res.values()))
        assert e.get("type") == "UntrustedCheckpointError", (rank, e)
        assert e["path"] == victim
        assert "builtins.exec" in e["message"] and "trust_pickles" in e["message"], e["message"]
    assert not os.path.exists(marker)
    # the conversions refuse it too
    with pytest.raises(safe_load.UntrustedCheckpointError, match="builtins.exec"):
        checkpoint.to_universal(root, root + "_universal")
    with pytest.raises(safe_load.UntrustedCheckpointError, match="builtins.exec"):
        checkpoint.to_fp32(root)
    assert not os.path.exists(os.path.join(root + "_universal", "t"))
    # the restricted unpickler itself refuses it, even where the scan was skipped
    with pytest.raises(safe_load.UntrustedCheckpointError, match="builtins.exec"):
        safe_load.load(victim)
    with pytest.raises(safe_load.UntrustedCheckpointError), safe_load.tensors_only():
        torch.load(victim, weights_only=False)  # what DeepSpeed's tools call
    assert not os.path.exists(marker)
    # the opt-out is real: a trusted load unpickles anything (here: runs the code)
    safe_load.load(victim, trust=True)
    assert open(marker).read() == "code ran"


# -- the manifest covers every file; names are plain ---------------------------------------------


def _copy(saved, tmp_path, name):
    root, _ = saved
    dst = str(tmp_path / name)
    shutil.copytree(os.path.join(root, "zero3-fp32"), dst)
    return dst, os.path.join(dst, "t")


def _edit_manifest(tag_dir, fn):
    path = os.path.join(tag_dir, checkpoint.MANIFEST)
    with open(path) as f:
        m = json.load(f)
    fn(m)
    with open(path, "w") as f:
        json.dump(m, f)


def test_unlisted_files_links_and_unsafe_names_are_refused(saved, tmp_path, world4):
    cases, expect = {}, {}
    r, t = _copy(saved, tmp_path, "extra")
    extra = os.path.join(t, "mp_rank_01_model_states.pt")
    shutil.copy(os.path.join(t, "zero_pp_rank_0_mp_rank_00_model_states.pt"), extra)
    cases["extra"], expect["extra"] = r, (extra, "not listed in the manifest")

    r, t = _copy(saved, tmp_path, "empty_files")
    _edit_manifest(t, lambda m: m.update(files={}))
    cases["empty_files"], expect["empty_files"] = r, (os.path.join(t, checkpoint.MANIFEST), "lists no files")

    outside = str(tmp_path / "outside.pt")
    shutil.copy(os.path.join(saved[0], "zero3-fp32", "t", "zero_pp_rank_0_mp_rank_00_model_states.pt"), outside)
    for name, entry in (("dotdot", "../../outside.pt"), ("absolute", outside), ("glob", "zero_pp_rank_*.pt")):
        r, t = _copy(saved, tmp_path, name)
        _edit_manifest(t, lambda m, e=entry: m["files"].update({e: checkpoint.file_digest(outside)}))
        cases[name], expect[name] = r, (os.path.join(t, checkpoint.MANIFEST), "not a plain relative name")

    r, t = _copy(saved, tmp_path, "link")
    link = os.path.join(t, "zero_pp_rank_1_mp_rank_00_model_states.pt")
    os.remove(link)
    os.symlink(outside, link)
    cases["link"], expect["link"] = r, (link, "symbolic link")

    for name, content in (("latest_up", b"../zero3-fp32/t"), ("latest_glob", b"t*"), ("latest_binary", b"\xff\xfe")):
        r, _ = _copy(saved, tmp_path, name)
        with open(os.path.join(r, "latest"), "wb") as f:
            f.write(content)
        cases[name] = r
        words = "not UTF-8" if name == "latest_binary" else "not a valid checkpoint tag"
        expect[name] = (os.path.join(r, "latest"), words)

    r, _ = _copy(saved, tmp_path, "no_latest")
    os.remove(os.path.join(r, "latest"))
    cases["no_latest"], expect["no_latest"] = r, (os.path.join(r, "latest"), "nothing says which tag")
    cases["no_dir"] = str(tmp_path / "never_saved")
    expect["no_dir"] = (os.path.join(cases["no_dir"], "latest"), "does not exist")

    out = world4.run(rc.load_each, CASES["zero3-fp32"], cases)
    for rank, res in enumerate(out):
        for name, (path, words) in expect.items():
            e = res[name]
            assert "message" in e, f"rank {rank} loaded the {name} checkpoint"
            assert e["path"] == path and words in e["message"], (rank, name, e)
    # a fresh start is asked for explicitly
    fresh = world4.run(rc.load_each, CASES["zero3-fp32"], {"none": cases["no_dir"]}, missing_ok=True)
    assert all(r["none"]["path"] is None for r in fresh)
    for tag in ("../x", "a/b", "t*", ".hidden", "latest", ""):
        with pytest.raises(checkpoint.HierCheckpointError, match="not a valid checkpoint tag"):
            checkpoint.resolve_tag(saved[0], tag)


# -- conversions never replace a checkpoint -------------------------------------------------------


def test_to_universal_refuses_its_source_and_an_existing_tag(saved, tmp_path, capsys):
    src, t = _copy(saved, tmp_path, "src")
    before = {rel: checkpoint.file_digest(os.path.join(t, rel)) for rel in checkpoint.list_files(t)}
    for out in (src, t, os.path.join(src, "sub")):
        assert checkpoint.main(["to-universal", src, out]) == 1
        assert "overlaps the source" in capsys.readouterr().out
    out = str(tmp_path / "universal")
    os.makedirs(os.path.join(out, "t"))
    with pytest.raises(checkpoint.HierCheckpointError, match="exists already"):
        checkpoint.to_universal(src, out)
    assert checkpoint.verify_tag(src, "t") == []
    assert {rel: checkpoint.file_digest(os.path.join(t, rel)) for rel in checkpoint.list_files(t)} == before
    assert open(os.path.join(src, "latest")).read() == "t"


# -- a save killed at each step of its commit -----------------------------------------------------

_COMMIT = """
import json, os, sys
from zeropp_hier.deepspeed import checkpoint
root, tmp, manifest = sys.argv[1:4]
m = json.load(open(manifest))
meta = {k: v for k, v in m.items() if k not in ("format", "tag", "files")}
checkpoint.commit(root, tmp, "t", m["files"], meta, True)
"""


@pytest.fixture(scope="module")
def versions(world4, tmp_path_factory):
    base = tmp_path_factory.mktemp("versions")
    first, second = str(base / "first"), str(base / "second")
    out = world4.run(rc.two_versions, CASES["frontier-fp32"], first, second)
    return first, second, out[0]


def test_kill_at_every_commit_step_leaves_a_checkpoint_that_loads(versions, tmp_path, world4):
    first, second, states = versions
    assert max_state_diff(states["v1"], states["v2"]) > 0  # the two saves differ
    roots, after_crash = {}, {}
    for step in checkpoint.COMMIT_STEPS:
        root = str(tmp_path / step)
        shutil.copytree(first, root)
        tmp = os.path.join(root, ".tmp-t")
        shutil.copytree(os.path.join(second, "t"), tmp)
        manifest = str(tmp_path / f"{step}.json")
        shutil.move(os.path.join(tmp, checkpoint.MANIFEST), manifest)
        proc = subprocess.run(
            [sys.executable, "-c", _COMMIT, root, tmp, manifest],
            env={**os.environ, checkpoint.CRASH_ENV: step},
            capture_output=True,
            text=True,
        )
        assert proc.returncode == -9, (step, proc.returncode, proc.stderr[-2000:])  # killed there
        after_crash[step] = sorted(os.listdir(root))
        roots[step] = root
    # the crash that leaves no '<tag>' at all: only '.old-t' and '.tmp-t'
    assert "t" not in after_crash["old_moved_away"] and {".old-t", ".tmp-t"} <= set(after_crash["old_moved_away"])
    listed = {p for p, _ in checkpoint.leftovers(roots["old_moved_away"])}
    assert listed == {os.path.join(roots["old_moved_away"], d) for d in (".old-t", ".tmp-t")}
    out = world4.run(rc.load_each, CASES["frontier-fp32"], roots)
    new_from = checkpoint.COMMIT_STEPS.index("new_moved_in")
    for rank, res in enumerate(out):
        for i, step in enumerate(checkpoint.COMMIT_STEPS):
            assert "state" in res[step], (rank, step, res[step])
            want = states["v2"] if i >= new_from else states["v1"]
            assert max_state_diff(res[step]["state"], want) == 0.0, (rank, step)
    # the load restored the previous tag; the next save's clean-up leaves nothing behind
    assert checkpoint.verify_tag(roots["old_moved_away"], "t") == []
    for root in roots.values():
        checkpoint.clean_leftovers(root, "t")
        assert not [n for n in os.listdir(root) if n.startswith((".old-", ".tmp-"))], root


# -- what one rank cannot see ---------------------------------------------------------------------


def test_directory_one_rank_does_not_see_is_named_on_every_rank(world2, tmp_path):
    dirs = {0: str(tmp_path / "node0"), 1: str(tmp_path / "node1")}
    cfg = ds_config("frontier", gpus_per_node=1, gcds_per_gpu=2)  # 2 ranks: 1 node x 1 GPU x 2 GCDs
    out = world2.run(rc.save_load_in_own_dirs, cfg, dirs, str(tmp_path / "shared"))
    missing = os.path.join(dirs[1], "t", "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    for r in out:
        assert "rank 1 does not see the file rank 0 just wrote" in r["save"]["message"], r["save"]
        assert "every rank sees" in r["save"]["message"]
        assert r["load"]["path"] == missing and "missing on rank 1" in r["load"]["message"], r["load"]
        assert "every rank sees" in r["load"]["message"]
        assert math.isfinite(r["loss_after"])  # the world still trains


def test_io_error_while_hashing_on_one_rank_is_named_on_every_rank(world4, tmp_path):
    root = str(tmp_path / "eio")
    out = world4.run(rc.hash_error_on_one_rank, CASES["zero3-fp32"], root, 2)
    for r in out:
        for what in ("save", "load"):
            msg = r[what]["message"]
            assert "failed on rank 2" in msg or "cannot be read on rank 2" in msg, (what, msg)
            assert "Input/output error" in msg and r[what]["path"].startswith(root), (what, msg)
        # the failed save committed nothing
        assert r["latest"] == "good" and r["tags"] == ["good"]
