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
world; the coordinator reads the manifest and lists the directory once.
"""

from __future__ import annotations

import os

import torch.distributed as dist

from ...comm import _coordinator as coordinator
from .files import (
    check_share,
    raise_problems,
    read_manifest,
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
    head = {
        "problem": None,
        "meta": {k: manifest.get(k) for k in META_KEYS},
        "own": [list(p) for p in unlisted_problems(tag_dir, manifest)],
    }
    names = sorted(files)  # once: each rank's share is a slice of it (share_of, dealt round-robin)
    return head, [{n: files[n] for n in names[r::world]} for r in range(world)]


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
