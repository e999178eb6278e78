"""The world of a dry run: one rank of ``nodes x gpus x gcds`` on PyTorch's fake process group,
with the launcher's variables a rank of that job would see.

The fake backend (``torch.testing._internal.distributed.fake_pg``) takes any world size and sends
nothing: group construction, ranks and sizes are the real job's; collectives are answered by the
mirror ([Note: the SPMD mirror] in dryrun/mirror.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..core.config import TopologySection
from ..core.errors import HierConfigError


@dataclass(frozen=True)
class DryWorld:
    """The job a dry run stands in for, and the rank it runs."""

    nodes: int
    rank: int = 0
    gpus: int = 4  # packages per node (Frontier: 4 MI250X)
    gcds: int = 2  # GCDs per package

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus * self.gcds

    @property
    def per_node(self) -> int:
        return self.gpus * self.gcds

    def check(self) -> None:
        for name, v in (("nodes", self.nodes), ("gpus", self.gpus), ("gcds", self.gcds)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise HierConfigError(f"dryrun.{name}", v, "use a positive integer (e.g. dryrun.nodes=9408)")
        if not isinstance(self.rank, int) or not 0 <= self.rank < self.world_size:
            raise HierConfigError(
                "dryrun.rank",
                self.rank,
                f"use a rank of the job, 0 .. {self.world_size - 1} ({self.nodes} nodes x {self.gpus} x {self.gcds})",
            )

    def env(self) -> dict[str, str]:
        """The variables torchrun or the job's srun path would set for this rank."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.rank % self.per_node),
            "LOCAL_SIZE": str(self.per_node),
            "LOCAL_WORLD_SIZE": str(self.per_node),
            "MASTER_ADDR": "localhost",
            "MASTER_PORT": "29500",
        }

    def topology(self) -> TopologySection:
        """The zeropp_hier section's declared topology for this world (rank = gcd + gcds *
        (gpu + gpus * node))."""
        return TopologySection(gpus_per_node=self.gpus, gcds_per_gpu=self.gcds)


def init_fake_world(world: DryWorld) -> None:
    """``init_process_group`` on the fake backend as ``world.rank`` (once per process), and the
    launcher's variables in ``os.environ`` (DeepSpeed and the job read them)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    world.check()
    _check_device(world)
    if dist.is_initialized():
        if dist.get_backend() != "fake" or dist.get_world_size() != world.world_size or dist.get_rank() != world.rank:
            raise RuntimeError(
                "zeropp_hier dry run: torch.distributed is already initialised with another world; "
                "a dry run needs a fresh process"
            )
        return
    os.environ.update(world.env())
    dist.init_process_group("fake", store=FakeStore(), rank=world.rank, world_size=world.world_size)
    _no_shared_memory_op()


# [Note: subnormals in a CPU dry run]
# The mirror fills every peer's slots with this rank's values, so at a large world a gathered
# weight is this rank's few values repeated, and the activations and gradients computed from it
# can fall into fp32's subnormal range. x86 cores compute with subnormal operands many times
# slower than with normal ones (on this project's build machine a multiply of 4 M subnormals took
# 4.3x the time of the same multiply flushed). Measured: a `zero3` step of the 3.24M GPT at 9,408
# nodes took 0.86 CPU s with them and 0.49 s flushed, where 48 nodes took 0.39 s either way. The
# values are the mirror's, not the job's, and the CPU stands in for the device's arithmetic, so a
# dry run whose engine is on the CPU flushes subnormals to zero (``torch.set_flush_denormal``,
# x86's FTZ/DAZ modes, which the threads it starts inherit) and restores them after; the report
# says so (``subnormals_flushed``). With a GPU nothing changes: the device computes.


def flush_subnormals() -> bool:
    """Flush subnormals to zero on this thread (and the threads it starts) when the engine will
    be on the CPU ([Note: subnormals in a CPU dry run]). Returns whether it did."""
    import torch

    from ..app import launch

    return not launch.visible_gpus() and bool(torch.set_flush_denormal(True))


def keep_subnormals() -> None:
    """Undo ``flush_subnormals`` (torch's default: subnormals kept)."""
    import torch

    torch.set_flush_denormal(False)


def _check_device(world: DryWorld) -> None:
    """On a machine with GPUs the engine takes the device of the rank's ``LOCAL_RANK`` (as a GPU
    job does: DeepSpeed binds it); one that this machine lacks is refused before anything runs."""
    import torch

    if not torch.cuda.is_available():
        return
    local, have = world.rank % world.per_node, torch.cuda.device_count()
    if local >= have:
        raise HierConfigError(
            "dryrun.rank",
            world.rank,
            f"its local rank is {local} and this machine has {have} GPU(s) (devices 0 .. {have - 1}): run a rank "
            f"whose local rank (rank % {world.per_node}) is below {have}, or the dry run on the CPU "
            "(CUDA_VISIBLE_DEVICES= with no device)",
        )


def _no_shared_memory_op() -> None:
    """DeepSpeed's CPU backend builds (JIT) and maps a shared-memory all-reduce for the ranks of
    one host; a dry run has no other rank on this host, so it gets none (``build_shm_op`` returns
    None, as where the op cannot be built)."""
    import importlib

    try:  # by name: ``deepspeed.comm``'s attribute ``torch`` is torch itself
        ds_torch = importlib.import_module("deepspeed.comm.torch")
    except ImportError:
        return
    setattr(ds_torch, "build_shm_op", lambda: None)  # noqa: B010 - the module is untyped


__all__ = ["DryWorld", "init_fake_world"]
