"""Counting one rank's share of a checkpoint's save and load at any world size, in one process,
through PyTorch's fake process-group backend (no peer runs; what a collective hands this rank is
what the fake backend leaves, so only the coordinator's, rank 0's, counts are measured here and
another rank's are computed by the pure share functions). Run as a child process by
tests/unit/test_checkpoint_at_scale.py: ``python -m tests.unit.scale_counts NODES RANK DIR``.

Counted: the files this process opens, stats and lists under the checkpoint directory, the
collectives it issues (by name), the bytes it receives in them, and the object collectives
(``all_gather_object`` and friends), while it runs the coordinator's side of a save
(the all-reduced sums of the other ranks' pieces, ``own_and_rest``) and the whole of a load's
checks (``checkpoint.shares.verify_across``) on a synthetic tag in pieces for that world,
DeepSpeed's naming and loading of this rank's optimizer file (``HierEngine``'s), and the start-up
agreements (``agree_same`` of a plan holding a world-sized rank map, ``agree_local``).
"""

from __future__ import annotations

import builtins
import json
import os
import sys
from collections import Counter

import torch
import torch.distributed as dist

GPUS, GCDS = 4, 2
OBJECT_COLLECTIVES = ("all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list")
TENSOR_COLLECTIVES = ("all_reduce", "gather", "scatter", "broadcast", "all_gather", "all_gather_into_tensor")


def ds_names(world: int) -> list[str]:
    """DeepSpeed's ZeRO-3 files of a tag (two per rank)."""
    return [f"zero_pp_rank_{r}_mp_rank_00_{k}_states.pt" for r in range(world) for k in ("model", "optim")]


class Counts:
    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.c: Counter = Counter()

    def _mine(self, path) -> bool:
        try:
            return os.path.abspath(os.fspath(path)).startswith(self.root)
        except TypeError:
            return False

    def install(self) -> None:
        real_open, real_stat, real_lstat, real_walk = builtins.open, os.stat, os.lstat, os.walk
        real_scandir = os.scandir

        def counted_open(path, *a, **k):
            if self._mine(path):
                self.c["open"] += 1
            return real_open(path, *a, **k)

        def counted_stat(path, *a, **k):
            if self._mine(path):
                self.c["stat"] += 1
            return real_stat(path, *a, **k)

        def counted_lstat(path, *a, **k):
            if self._mine(path):
                self.c["stat"] += 1
            return real_lstat(path, *a, **k)

        def counted_scandir(path="."):
            if self._mine(path):
                self.c["list"] += 1
            return real_scandir(path)

        builtins.open = counted_open
        os.stat, os.lstat, os.scandir = counted_stat, counted_lstat, counted_scandir
        del real_walk  # os.walk lists through os.scandir: counted there
        for name in OBJECT_COLLECTIVES + TENSOR_COLLECTIVES:
            real = getattr(dist, name)

            def counted(*a, _name=name, _real=real, **k):
                self.c[f"call:{_name}"] += 1
                out = _real(*a, **k)
                self.c[f"bytes:{_name}"] += _received(_name, a, k)
                return out

            setattr(dist, name, counted)


def _received(name: str, a: tuple, k: dict) -> int:
    """Bytes this rank receives in one call (its output buffers; the input's for in-place ones)."""

    def nbytes(t) -> int:
        return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0

    if name in ("all_reduce", "broadcast"):
        return nbytes(a[0])
    if name == "gather":
        out = a[1] if len(a) > 1 else k.get("gather_list")
        return sum(nbytes(t) for t in out or [])
    if name == "scatter":
        return nbytes(a[0])
    if name in ("all_gather",):
        return sum(nbytes(t) for t in a[0])
    if name == "all_gather_into_tensor":
        return nbytes(a[0])
    return 0


def synthetic_tag(root: str, world: int, rank: int) -> None:
    """``<root>/t``: a save in pieces of DeepSpeed's files for ``world`` ranks as rank ``rank``
    sees it ([Note: a manifest in pieces]): the top manifest (rank 0's two files) and this rank's
    own files and piece exist (tiny torch files, so the pickle scan reads real ones) with their
    true digests. The fake backend hands rank 0 its own sums back (nothing, rank 0 having no
    piece), so the tag records those totals: the checks pass, and what rank 0 opens, lists and
    receives does not depend on the totals' values."""
    from zeropp_hier.deepspeed.checkpoint import pieces
    from zeropp_hier.deepspeed.checkpoint.files import MANIFEST, MANIFEST_FORMAT_2, file_digest

    tag_dir = os.path.join(root, "t")
    os.makedirs(os.path.join(tag_dir, pieces.PIECES_DIR), exist_ok=True)

    def write(r: int) -> dict:
        out = {}
        for n in ds_names(world)[2 * r : 2 * r + 2]:
            torch.save({"optimizer_state_dict": {"x": torch.zeros(4)}}, os.path.join(tag_dir, n))
            out[n] = file_digest(os.path.join(tag_dir, n))
        return out

    top = write(0) if rank == 0 else {n: {"bytes": 0, "sha256": "0" * 64} for n in ds_names(1)}
    if rank != 0:
        pieces.write_piece(tag_dir, rank, write(rank))
    ranks = pieces.totals_record(pieces.ZERO, 0)
    manifest = {"format": MANIFEST_FORMAT_2, "tag": "t", "world_size": world, "ranks": ranks, "files": top}
    with open(os.path.join(tag_dir, MANIFEST), "w") as f:
        json.dump(manifest, f)


class _Engine:
    """What ``HierEngine``'s optimizer-file naming and loading read of an engine (DeepSpeed's
    own naming methods), for a ``world``-rank save."""

    def __init__(self, world: int) -> None:
        from types import SimpleNamespace

        from deepspeed.runtime.engine import DeepSpeedEngine

        from zeropp_hier.deepspeed.checkpoint.safe_load import TensorsOnlyCheckpointEngine

        self.optimizer = SimpleNamespace(dp_process_group=None)
        self.checkpoint_mp_rank = 0
        self.loaded_checkpoint_dp_world_size = world
        self.checkpoint_engine = TensorsOnlyCheckpointEngine()
        self._get_rank_zero_ckpt_name = DeepSpeedEngine._get_rank_zero_ckpt_name.__get__(self)
        self._get_zero_ckpt_prefix = DeepSpeedEngine._get_zero_ckpt_prefix.__get__(self)

    def zero_elastic_checkpoint(self) -> bool:
        return False


def main(nodes: int, rank: int, root: str) -> dict:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from zeropp_hier.comm import _coordinator as coordinator
    from zeropp_hier.deepspeed.checkpoint import atomic, pieces
    from zeropp_hier.deepspeed.checkpoint import shares as checkpoint_shares
    from zeropp_hier.deepspeed.engine import HierEngine

    world = nodes * GPUS * GCDS
    synthetic_tag(root, world, rank)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    out: dict = {"world": world}
    counts = Counts(root)
    counts.install()
    # a load's checks: the coordinator reads the top manifest, each rank its piece, the sums
    checkpoint_shares.verify_across(root, "t", check=True, trust_pickles=False)
    out["load"] = dict(counts.c)
    counts.c.clear()
    # DeepSpeed's part of the load: the optimizer file this rank names, stats and opens
    engine = _Engine(world)
    names = HierEngine._get_all_zero_checkpoint_names(engine, root, "t", False)  # type: ignore[arg-type]
    states = HierEngine._get_all_zero_checkpoint_state_dicts(engine, names)  # type: ignore[arg-type]
    out["ds_load"] = {**counts.c, "names": len(names), "states": len(states), "mine": states[rank] is not None}
    counts.c.clear()
    # a save's coordinator side: the sums of the other ranks' pieces, rank 0's one listing
    tag_dir = os.path.join(root, "t")
    total = coordinator.sums(pieces.ZERO + [0, 0])
    coordinator.maxima([1 << 30])
    mine = {n: {"bytes": 1, "sha256": "0"} for n in ds_names(1)} if rank == 0 else {}
    files, error, rest = atomic.own_and_rest(tag_dir, mine, total, atomic.list_files(tag_dir), world)
    out["save"] = {**counts.c, "error": error, "rest": rest}
    counts.c.clear()
    # start-up agreements: the plan's summary holds the (world-sized) rank map
    from zeropp_hier.comm.agree import agree_local, agree_same

    agree_same("plan", {"preset": "frontier", "rank_map": list(reversed(range(world)))})
    agree_local("a local check", lambda: None)
    out["start"] = dict(counts.c)
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])))
