"""A checkpoint's manifest in pieces ([Note: a manifest in pieces] in
zeropp_hier/deepspeed/checkpoint/pieces.py): each rank's part of a save and of a load's checks,
run rank by rank in one process on real files (the all-reduce of the sums is the plain sum of
what each rank's part hands it), and what one rank holds at 75,264 ranks, by pure code."""

import json
import math
import os
import sys

import pytest
import torch

from zeropp_hier.core.errors import HierCheckpointError
from zeropp_hier.deepspeed.checkpoint import pieces
from zeropp_hier.deepspeed.checkpoint.atomic import own_and_rest
from zeropp_hier.deepspeed.checkpoint.files import (
    MANIFEST,
    MANIFEST_FORMAT_2,
    commit,
    file_digest,
    list_files,
    read_manifest,
)
from zeropp_hier.deepspeed.checkpoint.shares import check_pieces, plan_shares, verify_tag
from zeropp_hier.deepspeed.engine import OwnOnly

WORLD_SMALL = 4
FRONTIER = 9408 * 4 * 2


def _names(rank: int) -> list[str]:
    return [f"zero_pp_rank_{rank}_mp_rank_00_{k}_states.pt" for k in ("model", "optim")]


def _save(root: str, world: int = WORLD_SMALL, extra: str | None = None) -> str:
    """A save of ``world`` ranks done rank by rank: each writes and hashes its two files, every
    rank but 0 its piece; rank 0 lists the directory once and commits. Returns the tag."""
    tmp = os.path.join(root, ".tmp-t")
    os.makedirs(os.path.join(tmp, pieces.PIECES_DIR))
    total = pieces.ZERO + [0, 0]
    mine0: dict = {}
    for r in range(world):
        mine = {}
        for n in _names(r):
            torch.save({"rank": torch.tensor([r])}, os.path.join(tmp, n))
            mine[n] = file_digest(os.path.join(tmp, n), sync=True)
        if r == 0:
            mine0 = mine
            continue
        data = pieces.write_piece(tmp, r, mine)
        total = pieces.add(total, pieces.piece_sums(data, mine) + pieces.name_sums(mine))
    if extra is not None:  # written outside DeepSpeed's checkpoint engine: nobody hashed it
        with open(os.path.join(tmp, extra), "w") as f:
            f.write("x")
    files, error, rest = own_and_rest(tmp, mine0, total, list_files(tmp), world)
    assert error is None
    for rel in rest:
        files[rel] = file_digest(os.path.join(tmp, rel))
    largest = max(sum(d["bytes"] for d in mine0.values()), 0)
    ranks = pieces.totals_record(total[: len(pieces.SUM_FIELDS)], largest)
    commit(root, tmp, "t", files, {"world_size": world, "ranks": ranks}, True)
    return "t"


def _load_checks(root: str, tag: str, world: int = WORLD_SMALL) -> list[list]:
    """Every rank's problems at a load: rank 0's head (broadcast), each rank's pieces, the sums
    all-reduced (summed here), then each rank's verdict."""
    head, shares = plan_shares(root, tag, world, True)
    assert head["problem"] is None and shares == []
    tag_dir = os.path.join(root, tag)
    parts = []
    for r in range(world):  # first pass: what each rank hands the all-reduce
        check_pieces(tag_dir, head, r, world, False, lambda v: parts.append(v) or v)
    total = [sum(col) for col in zip(*parts)]
    return [check_pieces(tag_dir, head, r, world, False, lambda v: total) for r in range(world)]


def _all(problems: list[list]) -> list:
    return [p for part in problems for p in part]


def test_a_save_in_pieces_lists_rank_0s_files_and_the_others_sums(tmp_path):
    tag = _save(str(tmp_path))
    manifest, problem = read_manifest(str(tmp_path / tag))
    assert problem is None and manifest is not None
    assert manifest["format"] == MANIFEST_FORMAT_2 and sorted(manifest["files"]) == _names(0)
    assert manifest["ranks"]["pieces"] == WORLD_SMALL - 1 and manifest["ranks"]["files"] == 2 * (WORLD_SMALL - 1)
    assert _all(_load_checks(str(tmp_path), tag)) == []
    assert verify_tag(str(tmp_path), tag) == []  # the offline check reads every piece


def test_a_file_nobody_hashed_is_found_by_name_and_hashed_by_rank_0(tmp_path):
    tag = _save(str(tmp_path), extra="extra.json")
    manifest, _ = read_manifest(str(tmp_path / tag))
    assert "extra.json" in manifest["files"]
    assert _all(_load_checks(str(tmp_path), tag)) == []


def test_a_file_a_rank_wrote_that_rank_0_does_not_see_is_named_with_the_rank(tmp_path):
    tmp = tmp_path / ".tmp-t"
    (tmp / pieces.PIECES_DIR).mkdir(parents=True)
    mine = {n: {"bytes": 1, "sha256": "0" * 64} for n in _names(2)}
    data = pieces.write_piece(str(tmp), 2, mine)
    for r in (1, 3):
        pieces.write_piece(str(tmp), r, {})
    total = pieces.piece_sums(data, mine) + pieces.name_sums(mine)
    total[0] = 3
    _, error, _ = own_and_rest(str(tmp), {}, total, list_files(str(tmp)), 4)
    assert error is not None and error[0] == 2 and "rank 0 does not see it" in error[2]
    # a rank's piece rank 0 cannot read: named with that rank
    os.remove(tmp / pieces.piece_rel(3))
    _, error, _ = own_and_rest(str(tmp), {}, total, list_files(str(tmp)), 4)
    assert error is not None and error[0] == 3 and pieces.piece_rel(3) in error[1]


def test_a_damaged_file_is_named_by_the_rank_that_checks_it(tmp_path):
    tag = _save(str(tmp_path))
    path = tmp_path / tag / _names(2)[1]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other contents
    path.write_bytes(bytes(data))
    problems = _load_checks(str(tmp_path), tag)
    assert [p for p, _ in problems[2]] == [str(path)] and "sha256" in problems[2][0][1]
    assert _all(problems[:2] + problems[3:]) == []


def test_a_missing_piece_is_named_by_its_reader_and_by_the_sums(tmp_path):
    tag = _save(str(tmp_path))
    os.remove(tmp_path / tag / pieces.piece_rel(3))
    problems = _load_checks(str(tmp_path), tag)
    assert "cannot be read on rank 3" in problems[3][0][1] and pieces.piece_rel(3) in problems[3][0][0]
    assert any("2 pieces were read, but the save recorded 3" in q for _, q in problems[0])


def test_a_piece_changed_with_its_file_is_caught_by_the_recorded_sums(tmp_path):
    tag = _save(str(tmp_path))
    tag_dir = str(tmp_path / tag)
    name = _names(1)[0]
    torch.save({"rank": torch.tensor([99])}, os.path.join(tag_dir, name))  # replaced, and its piece with it
    files = pieces.read_piece(tag_dir, 1)[1]
    files[name] = file_digest(os.path.join(tag_dir, name))
    with open(os.path.join(tag_dir, pieces.piece_rel(1)), "wb") as f:
        f.write(pieces.piece_bytes(1, files))
    problems = _all(_load_checks(str(tmp_path), tag))
    assert len(problems) == 1 and problems[0][0].endswith(MANIFEST)
    assert "a piece was changed" in problems[0][1]


def test_a_piece_naming_another_rank_or_a_bad_name_is_refused(tmp_path):
    tag = _save(str(tmp_path))
    tag_dir = str(tmp_path / tag)
    with open(os.path.join(tag_dir, pieces.piece_rel(2)), "wb") as f:
        f.write(pieces.piece_bytes(1, {}))
    problems = _load_checks(str(tmp_path), tag)
    assert "records rank 1, but its name is rank 2's" in problems[2][0][1]
    with pytest.raises(ValueError, match="not a plain relative name"):
        pieces.parse_piece(pieces.piece_bytes(1, {"../x": {"bytes": 1, "sha256": "0"}}), 1)


def test_a_file_no_piece_lists_is_named_by_rank_0(tmp_path):
    tag = _save(str(tmp_path))
    added = tmp_path / tag / "zero_pp_rank_9_mp_rank_00_optim_states.pt"
    added.write_bytes(b"x")
    stray = tmp_path / tag / pieces.PIECES_DIR / "rank_7.json"
    stray.write_bytes(b"{}")
    problems = _load_checks(str(tmp_path), tag)
    named = {p: q for p, q in problems[0]}
    assert "not listed in the manifest" in named[str(added)]
    assert "not a piece of the manifest of a 4-rank save" in named[str(stray)]
    assert _all(problems[1:]) == []
    assert {p for p, _ in verify_tag(str(tmp_path), tag)} == {str(added), str(stray)}


def test_a_malformed_ranks_record_is_an_unreadable_manifest(tmp_path):
    tag = _save(str(tmp_path))
    path = tmp_path / tag / MANIFEST
    m = json.loads(path.read_text())
    m["ranks"]["pieces"] = -1
    path.write_text(json.dumps(m))
    manifest, problem = read_manifest(str(tmp_path / tag))
    assert manifest is None and problem is not None and "ranks.pieces" in problem[1]


# -- pure, at 9,408 nodes x 4 x 2 -----------------------------------------------------------------


def test_one_rank_reads_one_piece_and_sums_a_few_numbers_at_75264_ranks():
    assert len(pieces.my_pieces(FRONTIER, 0, FRONTIER)) == 0  # rank 0's files are in the top manifest
    for r in (1, 2, FRONTIER // 2, FRONTIER - 1):
        assert list(pieces.my_pieces(FRONTIER, r, FRONTIER)) == [r]
    # a load on fewer ranks (a universal load's source is checked whole): at most ceil(pieces / world)
    assert max(len(pieces.my_pieces(FRONTIER, r, 1000)) for r in range(1000)) == math.ceil(FRONTIER / 1000)
    # every piece 1..world-1 is read by exactly one rank
    seen = sorted(p for r in range(1000) for p in pieces.my_pieces(FRONTIER, r, 1000))
    assert seen == list(range(1, FRONTIER))
    # a piece: two entries, whatever the world
    entries = {n: {"bytes": 1 << 40, "sha256": "f" * 64} for n in _names(FRONTIER - 1)}
    data = pieces.piece_bytes(FRONTIER - 1, entries)
    assert len(data) < 512
    # the sums of 75,263 pieces of 2 TiB each, and of their names' digests, fit an int64
    one = pieces.piece_sums(data, entries) + pieces.name_sums(entries)
    assert all(x * FRONTIER < 2**63 for x in one)
    # what rank 0 broadcasts at a load: its own files and a few numbers
    head = {"ranks": pieces.totals_record([FRONTIER - 1, 2 * FRONTIER, 1 << 62, 1 << 47, 1 << 47], 1 << 41)}
    head["top"] = {n: {"bytes": 1 << 40, "sha256": "f" * 64} for n in _names(0)}
    head["walk"] = [2 * FRONTIER, 1 << 48, 1 << 48]
    assert len(json.dumps(head)) < 1024


def test_a_rank_names_only_its_own_optimizer_file_at_75264_ranks():
    names = OwnOnly(FRONTIER, FRONTIER - 1, "mine.pt")
    assert len(names) == FRONTIER and names[FRONTIER - 1] == "mine.pt" and names[-1] == "mine.pt"
    assert names[0] is None and names[FRONTIER - 2] is None and names[:3] == [None] * 3
    assert sys.getsizeof(names.__dict__) < 1024  # three fields, not a list of the world
    with pytest.raises(IndexError):
        names[FRONTIER]
    del names[FRONTIER - 1]  # DeepSpeed's serial loading frees the entry it loaded
    assert names[FRONTIER - 1] is None
    with pytest.raises(HierCheckpointError, match="not one of the 8 ranks"):
        OwnOnly(8, 8, "x")
