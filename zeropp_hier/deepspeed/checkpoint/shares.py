"""A tag's checks across ranks: the coordinator reads the manifest, each rank checks only its
own share of the files ([Note: checks in shares]).

[Note: checks in shares]
A load (and the universal conversion) checks a tag before DeepSpeed reads it. Every rank reading
the whole manifest (about 2 x world entries) and stat'ing every file it lists is world^2 file
operations over the job; instead, as PyTorch DCP's load, rank 0 of the group (the coordinator)
reads and validates the manifest and walks the tag directory once (files the manifest does not
list, links), and sends each rank only its share of the entries (``share_of``: the sorted names
dealt round-robin, at most ceil(files / world) each) in one fixed-size ``scatter``; each rank
checks the size, sha256 and pickled types of its share in its own view of the directory (so a
rank that sees another directory, or lacks a file there, is named by its share). The problems are
agreed by one flag all-reduce; only when one is set are they gathered to rank 0, which sends the
first one back ([Note: a coordinator, not a world gather] in comm/_coordinator.py). A rank thus
opens at most ceil(files / world) files and receives a constant number of bytes, whatever the
world; the coordinator reads the manifest and lists the directory once. That is a manifest of
format ``/1`` (every file in one list: older saves, the universal conversions), which the
coordinator still reads whole and deals out; a save's manifest is in pieces ([Note: a manifest in
pieces] in checkpoint/pieces.py): there each rank's share is its own piece, which it reads itself,
and the coordinator sends only the recorded totals.
"""

from __future__ import annotations

import os

import torch.distributed as dist

from ...comm import _coordinator as coordinator
from . import pieces
from .files import (
    MANIFEST,
    MANIFEST_FORMAT_2,
    SHARED_FIX,
    check_share,
    raise_problems,
    read_manifest,
    share_of,
    tag_entries,
    unlisted_problems,
)

META_KEYS = ("world_size", "preset", "topology", "global_steps")


def _pairs(problems) -> list[tuple[str, str]]:
    return [(str(p), str(q)) for p, q in problems]


def plan_shares(root: str, tag: str, world: int, check: bool) -> tuple[dict, list[dict]]:
    """The coordinator's part, pure of collectives: (head, one share per rank). ``head`` holds
    a problem that stops every rank (an unreadable manifest), the manifest's small fields, and
    the coordinator's own problems (unlisted files, links); each share maps names to their
    manifest entries (None when unchecked: only the pickles are scanned)."""
    tag_dir = os.path.join(root, tag)
    if not check:  # unverified, but still never a pickle that could run code: every .pt scanned
        pts = sorted(n for n in tag_entries(tag_dir)[0] if n.endswith(".pt"))
        return {"problem": None, "meta": {}, "own": []}, [dict.fromkeys(pts[r::world]) for r in range(world)]
    manifest, problem = read_manifest(tag_dir)
    if problem is not None:
        return {"problem": list(problem), "meta": {}, "own": []}, [{} for _ in range(world)]
    assert manifest is not None
    files = manifest["files"]
    if manifest["format"] == MANIFEST_FORMAT_2:  # in pieces: no share to send ([Note: a manifest in pieces])
        return pieces_head(tag_dir, manifest), []
    head = {
        "problem": None,
        "meta": {k: manifest.get(k) for k in META_KEYS},
        "own": [list(p) for p in unlisted_problems(tag_dir, manifest)],
    }
    names = sorted(files)  # once: each rank's share is a slice of it (share_of, dealt round-robin)
    return head, [{n: files[n] for n in names[r::world]} for r in range(world)]


def verify_tag(
    root: str, tag: str, rank: int = 0, world: int = 1, trust_pickles: bool = False
) -> list[tuple[str, str]]:
    """This rank's share of the checks of ``<root>/<tag>`` in one process (all of them with the
    defaults): the manifest, the files it does not list (rank 0), each of the share's files' size
    and hash and, unless ``trust_pickles``, the types its pickle names ([Note: tensors-only
    loading]). Across ranks a load runs ``checkpoint.shares.verify_across`` instead, where only
    the coordinator reads the manifest."""
    tag_dir = os.path.join(root, tag)
    manifest, problem = read_manifest(tag_dir)
    if problem is not None:
        return [problem]
    assert manifest is not None  # read_manifest returns a manifest or a problem
    if manifest["format"] == MANIFEST_FORMAT_2:  # in pieces: this rank's pieces, totals summed here
        head = pieces_head(tag_dir, manifest) if rank == 0 else {"own": [], **manifest, "top": manifest["files"]}
        return check_pieces(tag_dir, head, rank, world, trust_pickles, (lambda v: v) if world == 1 else None)
    problems = unlisted_problems(tag_dir, manifest) if rank == 0 else []
    names = share_of(manifest["files"], rank, world)
    return problems + check_share(tag_dir, {n: manifest["files"][n] for n in names}, rank, trust_pickles)


def verify_across(
    root: str, tag: str, group: dist.ProcessGroup | None = None, *, check: bool = True, trust_pickles: bool = False
) -> dict:
    """Collective over ``group``: check ``<root>/<tag>`` ([Note: checks in shares]); every rank
    raises the same error on any problem. Returns the manifest's small fields (empty unchecked)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    head, shares = plan_shares(root, tag, world, check) if rank == 0 else (None, None)
    head = coordinator.broadcast_from_root(head, group)
    if head["problem"] is not None:
        path, problem = head["problem"]
        raise_problems([(path, problem)], root, tag)
    if head.get("ranks") is not None:
        problems = check_pieces(os.path.join(root, tag), head, rank, world, trust_pickles, coordinator_sums(group))
    else:
        mine = coordinator.scatter_from_root(shares, group) or {}
        problems = _pairs(head["own"]) if rank == 0 else []
        problems += check_share(os.path.join(root, tag), mine, dist.get_rank(), trust_pickles, scan_only=not check)
    if coordinator.any_rank(bool(problems), group):
        from .files import first_problem

        parts = coordinator.gather_to_root([list(p) for p in problems], group)
        first = list(first_problem([tuple(p) for part in parts for p in part])) if parts is not None else None
        path, problem = coordinator.broadcast_from_root(first, group)
        raise_problems([(path, problem)], root, tag)
    return head["meta"]


# -- a manifest in pieces ([Note: a manifest in pieces] in checkpoint/pieces.py) -------------------


def pieces_head(tag_dir: str, manifest: dict) -> dict:
    """The coordinator's part for a manifest in pieces: its one walk of the tag (links, entries
    of the pieces directory that are no piece, and the count and names' sums of the files neither
    the top manifest nor a piece's name covers), the recorded totals, and its own files' entries."""
    files, links = tag_entries(tag_dir)
    own = [
        [
            os.path.join(tag_dir, rel),
            "a symbolic link: a checkpoint holds plain files only (a link can point anywhere)",
        ]
        for rel in links
    ]
    world = manifest["world_size"]
    others = []
    for rel in files:
        if rel.split("/")[0] == pieces.PIECES_DIR:
            r = pieces.piece_rank(rel)
            if r is None or not 1 <= r < world:
                own.append(
                    [os.path.join(tag_dir, rel), f"not a piece of the manifest of a {world}-rank save (remove it)"]
                )
        elif rel not in manifest["files"]:
            others.append(rel)
    return {
        "problem": None,
        "meta": {k: manifest.get(k) for k in META_KEYS},
        "own": own,
        "ranks": manifest["ranks"],
        "world_size": world,
        "top": manifest["files"],  # rank 0's own files (a few): checked by rank 0
        "walk": [len(others), *pieces.name_sums(others)],
    }


def coordinator_sums(group):
    return lambda values: coordinator.sums(values, group)


def check_pieces(tag_dir: str, head: dict, rank: int, world: int, trust_pickles: bool, sums) -> list[tuple[str, str]]:
    """This rank's checks of a manifest in pieces: (rank 0) the top manifest's files and the
    problems of its walk, and the pieces this rank reads (``pieces.my_pieces``) with their files;
    then ``sums`` (an all-reduce SUM, every rank) of what every rank read, compared with the
    recorded totals and rank 0's walk, the same on every rank. Only when the walk's files and the
    pieces' names differ does rank 0 read every piece to name the files no piece lists."""
    problems = _pairs(head["own"]) if rank == 0 else []
    if rank == 0:
        problems += check_share(tag_dir, head["top"], rank, trust_pickles)
    mine = pieces.ZERO + [0, 0]
    for p in pieces.my_pieces(head["world_size"], rank, world):
        path = os.path.join(tag_dir, pieces.piece_rel(p))
        try:
            data, files = pieces.read_piece(tag_dir, p)
        except OSError as e:
            problems.append(
                (
                    path,
                    f"cannot be read on rank {rank} ({e.strerror or e}): a piece of the manifest written at "
                    f"save; {SHARED_FIX}",
                )
            )
            continue
        except ValueError as e:
            problems.append((path, f"unreadable manifest piece ({e})"))
            continue
        clash = sorted(set(files) & set(head["top"]))
        if clash:
            problems.append((path, f"it lists {clash[:3]}, which the top manifest lists: a piece was changed"))
        mine = pieces.add(mine, pieces.piece_sums(data, files) + pieces.name_sums(files))
        problems += check_share(tag_dir, files, rank, trust_pickles)
    if sums is None:  # one rank's share in one process: the totals are the whole job's to check
        return problems
    total = sums(mine)
    n = len(pieces.SUM_FIELDS)
    why = pieces.sums_problem(total[:n], head["ranks"])
    if why is not None and rank == 0:  # every rank found the same; one says it
        problems.append((os.path.join(tag_dir, MANIFEST), why))
    if why is None and [total[1], *total[n:]] != head["walk"] and rank == 0:
        problems += _unlisted_in_pieces(tag_dir, head)
    return problems


def _unlisted_in_pieces(tag_dir: str, head: dict) -> list[tuple[str, str]]:
    """Rank 0, on a failure only: the files of the tag no piece and not the top manifest lists
    (every piece read to name them)."""
    listed = set(head["top"])
    for r in range(1, head["world_size"]):
        try:
            listed.update(pieces.read_piece(tag_dir, r)[1])
        except (OSError, ValueError):
            pass  # named by the rank that reads it
    files, _ = tag_entries(tag_dir)
    extra = [rel for rel in files if rel not in listed and rel.split("/")[0] != pieces.PIECES_DIR]
    return [
        (
            os.path.join(tag_dir, rel),
            "not listed in the manifest written at save: it was added afterwards, and DeepSpeed would "
            "load it (remove it)",
        )
        for rel in extra
    ] or [(os.path.join(tag_dir, pieces.PIECES_DIR), "the pieces list files that are not in the tag")]
