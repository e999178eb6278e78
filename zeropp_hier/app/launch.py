"""Starting the job: under a launcher (``srun``, ``torchrun``) this process is one rank; without
one it spawns ``spec.local_world`` ranks on this machine (``LocalWorld``). Before any rank builds a
model, the spec is checked and the planner's memory table printed (a layout that cannot fit is
refused here, on every rank alike).

torch is imported once the job runs, not when the Hydra face (``app/train.py``) imports this
module; DeepSpeed and the rank's code (``app/run.py``) only by the ranks.
"""

from __future__ import annotations

import logging
import os
from typing import Mapping

from ..core.config import hier_config_from_ds
from ..core.errors import HierConfigError
from ..detect.hardware import fp16_unsupported_reason
from ..detect.slurm_env import expand_hostlist, slurm_task
from ..launch.ports import job_port
from ..launch.rendezvous import init_distributed
from ..launch.shm_hygiene import release_deepspeed_shm
from ..launch.world import NEOX_MODULE, RANK_MODULES, LocalWorld, import_frozen
from . import memory_check
from .job_vocab import with_data_vocab
from .recipe import toy_settings_warning
from .spec import JobSpec


def launcher_env(env: Mapping[str, str], gpus_visible: int) -> dict | None:
    """Variables torch.distributed and DeepSpeed need, for a process started by a launcher;
    None when no launcher started it (then the job spawns its own ranks).

    torchrun sets them all. Under ``srun`` they come from Slurm: the rank from SLURM_PROCID,
    MASTER_ADDR from the first host of the step's node list, a port derived from the job id (two
    jobs sharing a node do not collide), and LOCAL_RANK 0 when the task sees a single GPU
    (``--gpus-per-task=1``: the device it must use is its device 0, whatever its local id).
    """
    if "RANK" in env and "WORLD_SIZE" in env:
        return {}
    task = slurm_task(env)
    if task is None or task.ntasks < 2:
        return None
    nodes = task.nodelist or expand_hostlist(env.get("SLURM_JOB_NODELIST", "localhost"))
    job = int(env.get("SLURM_JOB_ID", "0") or 0)
    out = {
        "RANK": str(task.procid),
        "WORLD_SIZE": str(task.ntasks),
        "LOCAL_RANK": str(0 if gpus_visible == 1 else task.localid),
        "LOCAL_SIZE": str(task.tasks_per_node[task.nodeid]),
    }
    if "MASTER_ADDR" not in env:
        out["MASTER_ADDR"] = nodes[0]
    if "MASTER_PORT" not in env:
        out["MASTER_PORT"] = str(job_port(job))  # [Note: ports below the ephemeral range]
    return out


def visible_gpus() -> int:
    """The GPUs torch sees here (0 on a CPU machine): the job's ranks take one each."""
    import torch  # the Hydra face imports this module: torch only once the job runs

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_memory(gpus: int) -> tuple[str | None, float | None]:
    """The first GPU's name and memory in bytes, what the memory check holds a rank to; (None,
    None) without GPUs (a CPU rank's budget is its share of the RAM)."""
    if not gpus:
        return None, None
    import torch

    return torch.cuda.get_device_name(0), float(torch.cuda.get_device_properties(0).total_memory)


def memory_lines(spec: JobSpec, env: Mapping[str, str] | None, gpus: int) -> list[str]:
    """The planner's memory table for this job (printed by rank 0, or by the process that spawns
    the ranks); raises ``HierConfigError`` when the layout cannot fit. ``env``: ``launcher_env``'s."""
    if env is None:  # this process spawns spec.local_world ranks on this machine
        world, per_node, rank = spec.local_world, spec.local_world, 0
    else:
        merged = {**os.environ, **env}
        world, rank = int(merged["WORLD_SIZE"]), int(merged["RANK"])
        per_node = int(merged.get("LOCAL_SIZE") or merged.get("LOCAL_WORLD_SIZE") or world)
    name, total = gpu_memory(gpus)
    notes: list[str] = []
    # the user's DeepSpeed keys, and the section they leave: refused here, before any rank builds
    hier_config_from_ds(spec.ds_config(world=world, notes=notes))
    lines = memory_check.check(spec, world, per_node, name, total)
    warning = toy_settings_warning(spec) if gpus else None
    if rank == 0:
        print("\n".join(([warning] if warning else []) + notes + lines), flush=True)
    return lines


def _rank(spec: JobSpec) -> dict:
    """One rank of the job (``run.rank_main``), imported by the rank itself: the process that
    spawns the ranks never loads DeepSpeed."""
    from .run import rank_main

    return rank_main(spec)


def launch(spec: JobSpec) -> dict:
    """Run the job: as one rank under a launcher, or on ``spec.local_world`` spawned ranks.
    Returns this process's rank result (rank 0's when it spawned the ranks)."""
    spec.check()
    spec = with_data_vocab(spec)  # before any rank starts: the memory table uses the vocabulary
    import torch.distributed as dist  # once the job runs, not when the Hydra face loads

    gpus = visible_gpus()
    if spec.dtype == "fp16":
        # before any rank starts: otherwise every rank dies in deepspeed.initialize with a
        # ValueError that names neither the CPU feature nor the way out ([Note: fp16 on CPUs])
        reason = fp16_unsupported_reason(uses_gpu=gpus > 0)
        if reason:
            raise HierConfigError(
                "dtype",
                "fp16",
                f"{reason}; use dtype=bf16 (same memory and wire size; no loss scaling needed) or dtype=fp32",
            )
    env = launcher_env(os.environ, gpus)
    memory_lines(spec, env, gpus)  # refuses here, before any rank builds a model
    if env is not None:
        os.environ.update(env)
        from deepspeed.utils import logger as ds_logger

        ds_logger.setLevel(logging.WARNING)  # one rank's INFO lines times thousands of ranks
        init_distributed(None if gpus else "gloo", gpus)  # [Note: a bounded join]
        if not gpus:
            release_deepspeed_shm()  # [Note: DeepSpeed shm leak]
        # once joined, what the rank imports anyway, at once and frozen ([Note: frozen start-up
        # objects]); a rank that cannot join has not paid for them
        neox = [NEOX_MODULE] if spec.model.arch == "neox" else []
        import_frozen([*RANK_MODULES, *neox, "zeropp_hier.app.run"])
        out = _rank(spec)
        dist.destroy_process_group()
        return out
    if gpus:
        # NCCL refuses two ranks of one communicator on one GPU; gloo takes CUDA tensors (through
        # host memory: right for checking a workstation, not for timing)
        print(f"starting {spec.local_world} local ranks on {gpus} GPU(s), gloo...", flush=True)
    else:
        print(f"starting {spec.local_world} local CPU ranks (gloo)...", flush=True)
    with LocalWorld(spec.local_world, timeout=1800, gpus=gpus, preload=True) as w:
        out = w.run(_rank, spec)
    return out[0]
