"""The job's checkpoints: every ``save_every`` steps and after the last, through the engine's
transactional ``save_checkpoint``; ``resume=latest`` (or a tag) continues a run, at the same or
at another number of ranks.

[Note: what a job checkpoint holds]
The engine's checkpoint holds the model, the optimizer (fp32 master weights and Adam moments)
and the learning-rate scheduler. The job adds, as DeepSpeed client state: the number of steps
done, the data position (the next global sample, [Note: sample order] in app/data/tokens.py), the RNG state
of rank 0 (torch, CUDA, Python's ``random``) and a record of its settings
(``resume_rules.record``: world, micro-batch, preset, dtype, seed, model, the token files'
sha256). Every rank of the job draws the same numbers (one seed; the data order is a function of
the seed and the sample position, dropout is 0), so rank 0's state stands for all, and every
rank of the resumed run is given it.

[Note: resuming at another world size]
Before any rank builds a model, rank 0 reads the record of the tag to resume (its rank-0 model
states file, checked against the manifest, loaded tensors-only) and ``resume_rules.decide``
answers for every rank: the same world loads DeepSpeed's partitions as they are (another
topology or preset included); another world goes through DeepSpeed's universal format. The job
converts the tag itself into ``<checkpoint_dir>_universal/<tag>``, every rank its share of the
files and parameters ([Note: a conversion in shares] in deepspeed/checkpoint/universal.py: no rank
waits in a collective for the whole conversion, only for one share of it), says how long it took
and how many bytes it read and wrote, and builds its engine with ``checkpoint.load_universal``. A
conversion already there is used when its manifest names the source tag's manifest (same
sha256), so ``zeropp-hier checkpoint to-universal DIR DIR_universal`` ahead of the job (one
process) gives the job its input; a conversion of
another save of the same tag name is refused. Weights, fp32 master weights and Adam moments
load exactly (the universal files are the full fp32 tensors, cut again for the new world);
error-feedback residuals are per rank and start empty; the scheduler and step count come from
rank 0's model states file.

The data position is the number of global samples consumed; the resumed run's first micro-batch
starts at that sample whatever its world and micro-batch (``Loader.resume_at``), so the
samples seen before and after the resume are exactly the positions 0, 1, 2, ... with no gap and
no repeat, and a resumed run sees the same global batches as a run started at this world size
(with the same global batch) would. Which rank reads which sample follows the new world. The
RNG state is per process: rank r of the new world has no counterpart in the old one, so every
rank gets rank 0's saved state (exact for this job, whose ranks draw identical numbers; a model
drawing different random numbers per rank would continue on other streams than an uninterrupted
run). Synthetic batches have no global sample order (each is a function of step and rank): they
continue by step. What a resume cannot change (model, seed, dtype, data, stock <-> zeropp_hier)
is refused before any model is built, naming the field.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist

from ...core.errors import HierConfigError
from ...deepspeed.checkpoint import pieces, safe_load
from ...deepspeed.checkpoint import universal as universal_shared
from ...deepspeed.checkpoint.files import (
    MANIFEST,
    check_files,
    file_digest,
    list_files,
    raise_problems,
    read_manifest,
    resolve_tag,
)
from ...deepspeed.engine import HierEngine
from ..spec import JobSpec
from . import io_cost, resume_rules

KEY = "zeropp_hier_job"


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = list(state["cuda"])[: torch.cuda.device_count()]  # a node may see fewer devices
        for i, s in enumerate(cuda):
            torch.cuda.set_rng_state(s, i)


def tag_for(step_done: int) -> str:
    return f"step{step_done}"


def save(
    engine, ckpt_dir: str, step_done: int, data_state: dict, record: dict | None = None, monitor: dict | None = None
) -> str:
    """Collective: every rank calls it after step ``step_done - 1``. ``monitor``: the run's
    monitor directory and wandb id, which a resume continues ([Note: one run in the monitor])."""
    tag = tag_for(step_done)
    job = {"step": step_done, "data": data_state, "rng": rng_state(), "record": record or {}}
    client = {KEY: {**job, "monitor": monitor} if monitor else job}
    engine.save_checkpoint(ckpt_dir, tag=tag, client_state=client)
    return tag


def saved_sizes(ckpt_dir: str, tag: str) -> dict[str, int]:
    """The file sizes of a saved tag (relative path -> bytes): its manifest's, or (a stock
    DeepSpeed save has none) the files' own."""
    tag_dir = os.path.join(ckpt_dir, tag)
    manifest, _ = read_manifest(tag_dir)
    if manifest is not None:
        out = {rel: int(f["bytes"]) for rel, f in manifest["files"].items()}
        for r in range(1, int(manifest["world_size"]) if "ranks" in manifest else 0):  # in pieces: each read
            out.update({rel: int(f["bytes"]) for rel, f in pieces.read_piece(tag_dir, r)[1].items()})
        return out
    return {rel: os.path.getsize(os.path.join(tag_dir, rel)) for rel in list_files(tag_dir)}


def saved_totals(ckpt_dir: str, tag: str) -> tuple[int, int, int]:
    """(the largest rank's bytes, the bytes in all, the ranks) of a saved tag, from its top
    manifest alone when it is in pieces ([Note: a manifest in pieces]): what rank 0 reports after
    each save, without reading a piece per rank."""
    manifest, _ = read_manifest(os.path.join(ckpt_dir, tag))
    if manifest is not None and "ranks" in manifest:
        ranks = manifest["ranks"]
        own = sum(int(f["bytes"]) for f in manifest["files"].values())
        return max(own, int(ranks["largest_bytes"])), own + int(ranks["bytes"]), 1 + int(ranks["pieces"])
    per_rank = io_cost.bytes_by_rank(saved_sizes(ckpt_dir, tag))
    return max(per_rank.values(), default=0), sum(per_rank.values()), len(per_rank)


@dataclass(frozen=True)
class Plan:
    """How this run loads its checkpoint: ``<load_dir>/<tag>``, universal or not."""

    tag: str
    load_dir: str
    universal: bool
    saved_world: int
    convert: bool = False  # the universal conversion is still to be made (``plan`` makes it, every rank a share)
    conversion: universal_shared.Conversion | None = None  # what that conversion did, once made
    # the tag's step and its run in the monitor (app/monitoring/monitor_run.py): read with the record, for
    # the monitors, which are set up before the engine loads the tag
    step: int = field(default=0, compare=False)
    monitor: dict | None = field(default=None, compare=False)


def _job_state(tag_dir: str, manifest: dict | None) -> dict:
    """The job's client state from rank 0's model states file (checked against the manifest when
    there is one; loaded tensors-only)."""

    name = "zero_pp_rank_0_mp_rank_00_model_states.pt"
    path = os.path.join(tag_dir, name)
    if not os.path.isfile(path):
        raise HierConfigError(
            "resume", tag_dir, f"no {name} there: resume a checkpoint written by zeropp-hier train (ZeRO-3)"
        )
    if manifest is not None:
        if name not in manifest["files"]:
            raise HierConfigError("resume", tag_dir, f"its manifest does not list {name}: the tag is damaged")
        raise_problems(check_files(tag_dir, manifest, [name]), os.path.dirname(tag_dir), os.path.basename(tag_dir))
    state = safe_load.load(path, map_location="cpu")
    job = state.get(KEY) if isinstance(state, dict) else None
    if job is None:
        raise HierConfigError(
            "resume", tag_dir, "not written by zeropp-hier train (no job state): resume a job's checkpoint"
        )
    job = dict(job)
    job["dp_world_size"] = state.get("dp_world_size")
    return job


def _plan_on_rank0(spec: JobSpec, world: int, data_sha256: str | None) -> Plan:

    root = spec.ckpt_dir
    assert root is not None  # JobSpec.check: resume needs a directory
    tag = resolve_tag(root, None if spec.resume == "latest" else spec.resume)
    if tag is None or not os.path.isdir(os.path.join(root, tag)):
        raise HierConfigError(
            "resume", spec.resume, f"no checkpoint found in {root}: set checkpoint_dir to the saved run's directory"
        )
    tag_dir = os.path.join(root, tag)
    manifest, _ = read_manifest(tag_dir)  # None: stock DeepSpeed's save (no manifest)
    job = _job_state(tag_dir, manifest)
    rec = job.get("record") or {}
    saved_world = rec.get("world") or (manifest or {}).get("world_size") or job.get("dp_world_size") or world
    mode = resume_rules.decide(rec, int(saved_world), spec, world, data_sha256, tag)
    step, mon = int(job.get("step") or 0), job.get("monitor")
    if mode == "native":
        return Plan(tag, root, False, int(saved_world), step=step, monitor=mon)
    out = resume_rules.universal_dir(root)
    source_digest = file_digest(os.path.join(tag_dir, MANIFEST))["sha256"]
    done, _ = read_manifest(os.path.join(out, tag))
    if done is None and os.path.lexists(os.path.join(out, tag)):
        raise HierConfigError(
            "resume",
            spec.resume,
            f"{os.path.join(out, tag)} exists but is not a complete conversion: remove it (the job converts again)",
        )
    if done is not None and done.get("source_manifest_sha256") != source_digest:
        raise HierConfigError(
            "resume",
            spec.resume,
            f"{os.path.join(out, tag)} was converted from another save of tag {tag}: remove it (the job converts "
            "again), or resume another tag",
        )
    return Plan(tag, out, True, int(saved_world), convert=done is None, step=step, monitor=mon)


def plan(spec: JobSpec, world: int, data_sha256: str | None) -> Plan:
    """Collective over the world: rank 0 reads the checkpoint's record, decides, converts when
    the world changed; every rank returns the same plan or raises the same error."""

    result: list = [None]
    if dist.get_rank() == 0:
        try:
            result[0] = _plan_on_rank0(spec, world, data_sha256)
        except (ValueError, RuntimeError, OSError) as e:  # HierConfigError, HierCheckpointError
            result[0] = e
    dist.broadcast_object_list(result, src=0)
    if isinstance(result[0], BaseException):
        raise result[0]
    p = result[0]
    if p.convert:  # every rank its share, before any model is built ([Note: a conversion in shares])
        assert spec.ckpt_dir is not None
        p = replace(p, convert=False, conversion=universal_shared.convert(spec.ckpt_dir, p.load_dir, p.tag))
    return p


def load(engine, p: Plan) -> dict:
    """Collective: restore ``p``'s tag into ``engine``; returns the job's state (step, data
    position, record) after setting the RNG state."""

    # our engine refuses a missing tag unless asked not to; the job names its own field instead
    extra = {"missing_ok": True} if isinstance(engine, HierEngine) else {}
    path, client = engine.load_checkpoint(p.load_dir, tag=p.tag, **extra)
    if path is None:
        raise HierConfigError("resume", p.tag, f"no checkpoint {p.tag} in {p.load_dir}")
    job = (client or {}).get(KEY)
    if job is None:
        raise HierConfigError(
            "resume", p.tag, f"{path} was not written by zeropp-hier train (no job state): resume a job's checkpoint"
        )
    set_rng_state(job["rng"])
    return job
