"""A ZeRO-3 checkpoint converted to DeepSpeed's universal format by every rank of the job at
once, each rank its own share ([Note: a conversion in shares]).

[Note: a conversion in shares]
A job resumed at another world size loads DeepSpeed's universal format (app/longrun/resume.py). One
process converting a 20B checkpoint reads and writes hundreds of GB while the other ranks wait
in a collective, so the conversion would be bounded by the collective timeout. Here every rank
does 1/world of each phase of ``ds_to_universal``'s ZeRO-3 path, and the ranks meet only between
phases, so each wait is one share of the work (about one rank's save, which the job already
does between collectives):

1. verify the source tag: each rank hashes its share of the manifest's files (``verify_tag``);
2. extract: each rank cuts the old ranks' optimizer files of its share into per-parameter
   fragments (``extract_zero_shards_stage3``);
3. merge: each rank joins the fragments of its share of the parameters into the full fp32
   tensors (``merge_zero3_slices``);
4. rank 0 writes the small common files (the optimizer's param groups, the model states files);
5. each rank hashes its share of the output; rank 0 commits it like a save (manifest, rename,
   ``latest_universal``).

After each phase the ranks exchange their failures (``all_gather_object``) and all raise the
first one, naming the rank and file. The output is what ``checkpoint.to_universal`` writes in
one process, so a conversion made ahead with ``zeropp-hier checkpoint to-universal`` and one made
by the job are interchangeable. Tensor-parallel (AutoTP) and AutoEP checkpoints, which the job
never writes, are refused.
"""

from __future__ import annotations

import glob
import os
import shutil
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch.distributed as dist

from ..core.errors import HierCheckpointError
from .checkpoint_files import (
    MANIFEST,
    TMP_PREFIX,
    _rank_error,
    commit,
    file_digest,
    list_files,
    raise_problems,
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


def _gather(obj: Any) -> list:
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _phase(rank: int, where: str, what: str, work: Callable[[], Any]) -> Any:
    """Run this rank's ``work``; then every rank raises the first rank's failure (collective)."""
    result, failure = None, None
    try:
        result = work()
    except Exception as e:  # any failure: the other ranks must not wait for this one in the next phase
        failure = _rank_error(rank, where, e if isinstance(e, OSError) else f"{type(e).__name__}: {e}")
    raise_rank_errors(_gather(failure), f"the universal conversion ({what})")
    return result


def _source_layout(src: str) -> tuple[list, list, int]:
    """(optimizer files grid row, per-file parameter shapes, old world) of a ZeRO-3 tag."""
    from deepspeed.checkpoint import ds_to_universal as u

    optim = u._filter_zero3_optim_files(u._get_optim_files(src))
    if not optim or u._get_zero_stage(optim) < 3:
        raise HierCheckpointError(src, "not a ZeRO-3 checkpoint", "resume at the world size it was saved at")
    model_files = u._get_zero3_model_state_files(src)
    names, _ = u._autoep_expert_param_names_by_rank(model_files)
    _, tp, dp = u._build_zero3_rank_grid(model_files)
    optim_grid, tp_o, dp_o = u._build_zero3_rank_grid(optim)
    if names or tp != 1 or tp_o != 1 or dp_o != dp:
        raise HierCheckpointError(
            src,
            f"a tensor-parallel or expert-parallel ZeRO-3 checkpoint (tp={tp}, dp={dp})",
            "convert it ahead with DeepSpeed's ds_to_universal, then resume",
        )
    return optim_grid, [u._parse_model_states_stage3(model_files)], dp


def convert(src_dir: str, out_dir: str, tag: str, trust_pickles: bool = False) -> Conversion:
    """Collective over the world: ``<src_dir>/<tag>`` (verified) into ``<out_dir>/<tag>``,
    committed with ``latest_universal``. ``<out_dir>/<tag>`` must not exist."""
    from deepspeed.checkpoint import ds_to_universal as u

    from . import safe_load
    from .checkpoint_files import verify_tag

    rank, world = dist.get_rank(), dist.get_world_size()
    t0 = time.perf_counter()
    src = os.path.join(src_dir, tag)
    scratch = os.path.join(out_dir, TMP_PREFIX + tag)
    built = os.path.join(scratch, tag)  # ds_to_universal's layout: <output>/zero/<param>/<state>.pt
    temp = os.path.join(built, "tmp")
    zero = os.path.join(built, "zero")

    mine = _phase(rank, src, "verifying the source", lambda: verify_tag(src_dir, tag, rank, world, trust_pickles))
    problems = _gather(mine)
    raise_problems([p for part in problems for p in part], src_dir, tag)
    manifest, _ = read_manifest(src)
    assert manifest is not None  # verified above
    bytes_read = sum(int(f["bytes"]) for f in manifest["files"].values())

    def prepare():
        shutil.rmtree(scratch, ignore_errors=True)  # an earlier attempt's
        os.makedirs(temp)

    _phase(rank, scratch, "preparing", prepare if rank == 0 else lambda: None)

    def layout():  # rank 0 reads every old rank's model states file once; the others get its answer
        with safe_load.tensors_only(trust_pickles):
            return _source_layout(src)

    optim_grid, shapes_grid, old_world = _gather(
        _phase(rank, src, "reading the layout", layout if rank == 0 else lambda: None)
    )[0]

    def extract():
        with safe_load.tensors_only(trust_pickles):
            for dp in share(list(range(old_world)), rank, world):
                u.extract_zero_shards_stage3(optim_grid, shapes_grid, old_world, temp, (0, dp))

    _phase(rank, temp, "extracting each old rank's fragments", extract)
    params = sorted({name for group in shapes_grid[0] for name in group})

    def merge():
        with safe_load.tensors_only(trust_pickles):  # the fragments just written: tensors, like everything read
            for name in share(params, rank, world):
                u.merge_zero3_slices(old_world, zero, temp, name)

    _phase(rank, zero, "merging each parameter's fragments", merge)

    def common():
        with safe_load.tensors_only(trust_pickles):
            u._save_optimizer_state_stage3(
                _Args(built),
                [f for row in optim_grid for f in row],  # optimizer_state.pt from rank 0's file
            )
        shutil.rmtree(temp)
        for f in glob.glob(os.path.join(src, "*model_states.pt")):
            shutil.copy2(f, built)

    _phase(rank, built, "writing the common files", common if rank == 0 else lambda: None)
    names = _gather(list_files(built) if rank == 0 else None)[0]  # one listing: a rank missing a file names it

    def digest():
        return {rel: file_digest(os.path.join(built, rel), sync=True) for rel in share(names, rank, world)}

    parts = _gather(_phase(rank, built, "hashing the output", digest))
    files = {k: v for part in parts for k, v in part.items()}

    def finish():
        meta = {k: manifest.get(k) for k in ("world_size", "preset", "topology", "global_steps")}
        meta["universal_from"] = os.path.abspath(src)
        meta["source_manifest_sha256"] = file_digest(os.path.join(src, MANIFEST))["sha256"]
        commit(out_dir, built, tag, files, meta, True, latest_name="latest_universal")
        shutil.rmtree(scratch, ignore_errors=True)

    _phase(rank, out_dir, "committing", finish if rank == 0 else lambda: None)
    written = sum(int(f["bytes"]) for f in files.values())
    return Conversion(os.path.join(out_dir, tag), old_world, world, bytes_read, written, time.perf_counter() - t0)


@dataclass(frozen=True)
class _Args:
    """The one field of ds_to_universal's arguments its common-files step reads."""

    output_folder: str
