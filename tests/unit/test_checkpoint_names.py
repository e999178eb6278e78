"""Checkpoint tags, ``latest`` and manifest entries are plain relative names; ``checkpoint
verify`` names an absent directory and lists unfinished saves (pure file logic, no ranks; real
checkpoints are in tests/dist/test_checkpoint_trust.py)."""

import json
import os

import pytest

from zeropp_hier.deepspeed import checkpoint


@pytest.mark.parametrize(
    "name, why",
    [
        ("", "empty"),
        ("../x", "'..'"),
        ("a/../b", "'..'"),
        ("/etc/passwd", "absolute"),
        ("a//b", "empty path"),
        ("x*.pt", "glob"),
        ("x?.pt", "glob"),
        ("[ab].pt", "glob"),
        ("a\\b", "backslash"),
        ("a\nb", "control"),
    ],
)
def test_unsafe_names(name, why):
    assert why in checkpoint.name_problem(name)


@pytest.mark.parametrize("name", ["zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero/blocks.0.fc.weight/fp32.pt"])
def test_plain_names(name):
    assert checkpoint.name_problem(name) is None


@pytest.mark.parametrize("tag", ["a/b", ".tmp-x", "latest", "latest_universal", "..", "t*"])
def test_tags_must_be_plain_directory_names(tag):
    with pytest.raises(checkpoint.HierCheckpointError, match="not a valid checkpoint tag"):
        checkpoint.check_tag_name(tag)


def test_latest_is_validated_like_a_tag(tmp_path):
    latest = tmp_path / "latest"
    latest.write_bytes(b"../elsewhere/global_step3")
    with pytest.raises(checkpoint.HierCheckpointError) as e:
        checkpoint.resolve_tag(str(tmp_path), None)
    assert e.value.path == str(latest) and "'..'" in e.value.problem
    latest.write_bytes(b"\xff\xfeglobal")
    with pytest.raises(checkpoint.HierCheckpointError, match="not UTF-8"):
        checkpoint.resolve_tag(str(tmp_path), None)
    latest.write_bytes(b"global_step3\n")
    assert checkpoint.resolve_tag(str(tmp_path), None) == "global_step3"
    latest.unlink()
    assert checkpoint.resolve_tag(str(tmp_path), None) is None


def test_manifest_entries_must_be_plain_and_present(tmp_path):
    tag_dir = tmp_path / "t"
    tag_dir.mkdir()
    (tag_dir / "a.pt").write_bytes(b"x")
    digest = checkpoint.file_digest(str(tag_dir / "a.pt"))
    for files, words in (({"../a.pt": digest}, "not a plain relative name"), ({}, "lists no files")):
        (tag_dir / checkpoint.MANIFEST).write_text(json.dumps({"format": checkpoint.MANIFEST_FORMAT, "files": files}))
        [(path, problem)] = checkpoint.verify_tag(str(tmp_path), "t", trust_pickles=True)
        assert path.endswith(checkpoint.MANIFEST) and words in problem


def test_verify_names_an_absent_directory_and_lists_leftovers(tmp_path, capsys):
    absent = str(tmp_path / "nope")
    assert checkpoint.main(["verify", absent]) == 1
    assert f"the checkpoint directory '{absent}' does not exist" in capsys.readouterr().out
    os.makedirs(tmp_path / "ck" / ".tmp-t")
    os.makedirs(tmp_path / "ck" / ".old-u")
    assert checkpoint.main(["verify", str(tmp_path / "ck"), "--tag", "u"]) == 1
    out = capsys.readouterr().out
    assert "LEFTOVER" in out and ".tmp-t" in out and ".old-u" in out and "restores it" in out
