"""A ZeRO-3 checkpoint converted to DeepSpeed's universal format by every rank of the job at
once, each rank its own share ([Note: a conversion in shares]).

[Note: a conversion in shares]
A job resumed at another world size loads DeepSpeed's universal format (app/longrun/resume.py). One
process converting a 20B checkpoint reads and writes hundreds of GB while the other ranks wait
in a collective, so the conversion would be bounded by the collective timeout. Here every rank
does 1/world of each phase of ``ds_to_universal``'s ZeRO-3 path, and the ranks meet only between
phases, so each wait is one share of the work (about one rank's save, which the job already
does between collectives):

1. verify the source tag: each rank checks its share of the manifest's files, the manifest read
   by rank 0 only ([Note: checks in shares] in checkpoint/shares.py);
2. rank 0 reads the small layout (the old world, old rank 0's file names, the parameter shapes)
   and broadcasts it; every rank derives the names of the old ranks' files of its share from it
   (pure: ``old_rank_file``), so no rank lists the source;
3. extract: each rank cuts the old ranks' optimizer files of its share into per-parameter
   fragments (``extract_zero_shards_stage3``);
4. merge: each rank joins the fragments of its share of the parameters into the full fp32
   tensors (``merge_zero3_slices``) and removes those fragments;
5. each rank copies its share of the model states files (rank 0 also writes the optimizer's
   param groups), then hashes what it wrote, and only that; the digests (a few entries per
   rank) are gathered to rank 0, which lists the output once and commits it like a save
   (manifest, rename, ``latest_universal``).

After each phase one flag all-reduce says whether a rank failed; only then are the failures
gathered to rank 0 and the first one raised on every rank, naming the rank and file ([Note: a
coordinator, not a world gather] in comm/_coordinator.py). The output is what ``checkpoint.to_universal`` writes in
one process, so a conversion made ahead with ``zeropp-hier checkpoint to-universal`` and one made
by the job are interchangeable. Tensor-parallel (AutoTP) and AutoEP checkpoints, which the job
never writes, are refused.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch.distributed as dist

from ...comm import _coordinator as coordinator
from ...core.errors import HierCheckpointError
from .files import (
    MANIFEST,
    SHARED_FIX,
    TMP_PREFIX,
    _rank_error,
    commit,
    file_digest,
    list_files,
    raise_rank_errors,
    read_manifest,
)


@dataclass(frozen=True)
class Conversion:
    """What a conversion did: its output, the bytes read and written, the seconds it took."""

    out: str
    source_world: int
    world: int
    bytes_read: int
    bytes_written: int
    seconds: float


def share(items: list, rank: int, world: int) -> list:
    """Rank ``rank``'s share of ``items`` (pure: every rank computes every share alike)."""
    return sorted(items)[rank::world]


def _phase(rank: int, where: str, what: str, work: Callable[[], Any]) -> Any:
    """Run this rank's ``work``; then every rank raises the first rank's failure (collective: one
    flag all-reduce, the failures gathered to rank 0 only when one is set)."""
    result, failure = None, None
    try:
        result = work()
    except Exception as e:  # any failure: the other ranks must not wait for this one in the next phase
        failure = _rank_error(rank, where, e if isinstance(e, OSError) else f"{type(e).__name__}: {e}")
    found = coordinator.failures_everywhere(list(failure) if failure else None)
    if found is not None:
        first, others = found
        raise_rank_errors([tuple(first), *[(r, "", "") for r in others]], f"the universal conversion ({what})")
    return result


def _source_layout(src: str) -> dict:
    """The small layout of a ZeRO-3 tag every rank derives its work from (rank 0 reads it; JSON):
    the old world, the file names of old rank 0 (the others' differ only in the rank) and the
    per-group parameter shapes."""
    from deepspeed.checkpoint import ds_to_universal as u

    optim = u._filter_zero3_optim_files(u._get_optim_files(src))
    if not optim or u._get_zero_stage(optim) < 3:
        raise HierCheckpointError(src, "not a ZeRO-3 checkpoint", "resume at the world size it was saved at")
    model_files = u._get_zero3_model_state_files(src)
    names, _ = u._autoep_expert_param_names_by_rank(model_files)
    model_grid, tp, dp = u._build_zero3_rank_grid(model_files)
    optim_grid, tp_o, dp_o = u._build_zero3_rank_grid(optim)
    if names or tp != 1 or tp_o != 1 or dp_o != dp:
        raise HierCheckpointError(
            src,
            f"a tensor-parallel or expert-parallel ZeRO-3 checkpoint (tp={tp}, dp={dp})",
            "convert it ahead with DeepSpeed's ds_to_universal, then resume",
        )
    shapes = [[[n, list(s)] for n, s in group.items()] for group in u._parse_model_states_stage3(model_files)]
    return {
        "old_world": dp,
        "optim0": os.path.basename(optim_grid[0][0]),
        "model0": os.path.basename(model_grid[0][0]),
        "shapes": shapes,
    }


def old_rank_file(first: str, dp: int) -> str:
    """The name of old rank ``dp``'s file, from old rank 0's (pure: DeepSpeed names them
    ``[bf16_]zero_pp_rank_<dp>_mp_rank_00_<kind>_states.pt``)."""
    out, n = re.subn(r"zero_pp_rank_0_", f"zero_pp_rank_{dp}_", first, count=1)
    if n != 1:
        raise HierCheckpointError(first, "not a ZeRO-3 rank file name", "convert it ahead with ds_to_universal")
    return out


def _own_files(top: str, rels: list[str]) -> list[str]:
    """Every file under each of ``rels`` (relative to ``top``), relative to ``top``."""
    out = []
    for rel in rels:
        path = os.path.join(top, rel)
        if os.path.isfile(path):
            out.append(rel)
            continue
        for d, _, names in os.walk(path):
            out += [os.path.relpath(os.path.join(d, n), top) for n in names]
    return sorted(out)


def convert(src_dir: str, out_dir: str, tag: str, trust_pickles: bool = False) -> Conversion:
    """Collective over the world: ``<src_dir>/<tag>`` (verified) into ``<out_dir>/<tag>``,
    committed with ``latest_universal``. ``<out_dir>/<tag>`` must not exist."""
    from collections import OrderedDict

    import torch
    from deepspeed.checkpoint import ds_to_universal as u

    from . import safe_load
    from .shares import verify_across

    rank, world = dist.get_rank(), dist.get_world_size()
    t0 = time.perf_counter()
    src = os.path.join(src_dir, tag)
    scratch = os.path.join(out_dir, TMP_PREFIX + tag)
    built = os.path.join(scratch, tag)  # ds_to_universal's layout: <output>/zero/<param>/<state>.pt
    temp = os.path.join(built, "tmp")
    zero = os.path.join(built, "zero")

    verify_across(src_dir, tag, trust_pickles=trust_pickles)  # each rank its share ([Note: checks in shares])

    def prepare():
        shutil.rmtree(scratch, ignore_errors=True)  # an earlier attempt's
        os.makedirs(temp)
        with safe_load.tensors_only(trust_pickles):
            layout = _source_layout(src)
        manifest, _ = read_manifest(src)
        assert manifest is not None  # verified above
        # a manifest in pieces records the other ranks' bytes as one total
        layout["bytes_read"] = sum(int(f["bytes"]) for f in manifest["files"].values()) + int(
            (manifest.get("ranks") or {}).get("bytes", 0)
        )
        return layout

    layout = _phase(rank, scratch, "reading the layout", prepare if rank == 0 else lambda: None)
    # the layout is small (the old world, two names, the parameter shapes): one broadcast
    layout = coordinator.broadcast_from_root(layout)
    old_world = int(layout["old_world"])
    shapes_grid = [[OrderedDict((n, torch.Size(s)) for n, s in group) for group in layout["shapes"]]]

    def extract():
        with safe_load.tensors_only(trust_pickles):
            for dp in share(list(range(old_world)), rank, world):
                grid = [{dp: os.path.join(src, old_rank_file(layout["optim0"], dp))}]
                u.extract_zero_shards_stage3(grid, shapes_grid, old_world, temp, (0, dp))

    _phase(rank, temp, "extracting each old rank's fragments", extract)
    params = sorted({name for group in shapes_grid[0] for name in group})
    mine = share(params, rank, world)

    def merge():
        with safe_load.tensors_only(trust_pickles):  # the fragments just written: tensors, like everything read
            for name in mine:
                u.merge_zero3_slices(old_world, zero, temp, name)
                shutil.rmtree(os.path.join(temp, name))  # the merging rank removes its fragments

    _phase(rank, zero, "merging each parameter's fragments", merge)
    copies = [old_rank_file(layout["model0"], dp) for dp in share(list(range(old_world)), rank, world)]

    def common():
        for name in copies:  # the model states files, each rank its share
            shutil.copy2(os.path.join(src, name), built)
        if rank == 0:
            with safe_load.tensors_only(trust_pickles):
                u._save_optimizer_state_stage3(
                    _Args(built),
                    [os.path.join(src, layout["optim0"])],  # optimizer_state.pt from rank 0's file
                )
        # this rank's own output, hashed by it ([Note: a conversion in shares])
        own = _own_files(built, [os.path.join("zero", n) for n in mine] + copies)
        if rank == 0:
            own.append(os.path.join("zero", "optimizer_state.pt"))
        return {rel: file_digest(os.path.join(built, rel), sync=True) for rel in own}

    parts = coordinator.gather_to_root(_phase(rank, built, "writing and hashing the output", common))

    def finish():
        assert parts is not None
        shutil.rmtree(temp)  # empty by now: each rank removed the fragments it merged
        files = {k: v for part in parts for k, v in (part or {}).items()}
        listed = list_files(built)
        unseen = sorted(set(files) - set(listed))
        if unseen:
            raise OSError(f"rank 0 does not see {unseen[:3]} that other ranks wrote: {SHARED_FIX}")
        for rel in sorted(set(listed) - set(files)):  # written outside the shares: hashed here
            files[rel] = file_digest(os.path.join(built, rel), sync=True)
        manifest, _ = read_manifest(src)
        assert manifest is not None
        meta = {k: manifest.get(k) for k in ("world_size", "preset", "topology", "global_steps")}
        meta["universal_from"] = os.path.abspath(src)
        meta["source_manifest_sha256"] = file_digest(os.path.join(src, MANIFEST))["sha256"]
        commit(out_dir, built, tag, files, meta, True, latest_name="latest_universal")
        shutil.rmtree(scratch, ignore_errors=True)
        return sum(int(f["bytes"]) for f in files.values())

    written = _phase(rank, out_dir, "committing", finish if rank == 0 else lambda: None)
    written = coordinator.broadcast_from_root(written)
    return Conversion(
        os.path.join(out_dir, tag), old_world, world, int(layout["bytes_read"]), int(written), time.perf_counter() - t0
    )


@dataclass(frozen=True)
class _Args:
    """The one field of ds_to_universal's arguments its common-files step reads."""

    output_folder: str


def kept_slice(numel: int, world: int, rank: int) -> tuple[int, int, int]:
    """(first element, elements, partition width) of a parameter of ``numel`` elements that
    rank ``rank`` of ``world`` keeps under ZeRO-3's even split (the width is ceil(numel /
    world); the last ranks' rows are padding past the end). Pure ([Note: universal rows]).

    [Note: universal rows]
    DeepSpeed's universal load reads each parameter's whole fp32 tensor and both Adam moments on
    every rank, then keeps one 1/world slice of each: at 20B parameters about 247 GB read per
    rank. ``HierZeroOptimizer_Stage3.load_hp_checkpoint_state`` maps each file instead
    (``torch.load(mmap=True)``) and copies only the slice this function gives, so a rank reads
    the file's header and the pages of its own rows: 3 x 4 x ceil(params / world) bytes of
    tensor data in all, as PyTorch DCP reads only a rank's own byte ranges."""
    width = -(-numel // world)
    start = min(rank * width, numel)
    return start, max(0, min(width, numel - start)), width
