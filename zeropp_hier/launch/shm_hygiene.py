"""Stop DeepSpeed's CPU shared-memory all-reduce from leaking /dev/shm.

[Note: DeepSpeed shm leak]
On the CPU accelerator, ``deepspeed.init_distributed`` sets up a shared-memory all-reduce: each
rank creates ``/dev/shm/deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>``
(69 MB in DeepSpeed 0.19.8) and maps every peer's buffer before it returns. Nothing ever
unlinks them, so every CPU world leaves world_size x 69 MB of RAM behind in /dev/shm; on this
project's test machine a day of runs filled it and the OOM killer took training ranks.
Once every rank has mapped every buffer (a barrier after initialisation), each rank unlinks
its own name: the mappings stay valid until the processes exit, and the memory is then freed.
"""

from __future__ import annotations

import os

PREFIX = "deepspeed_allreduce_buffer"


def buffer_name(uid: int, master_addr: str, master_port: str, rank: int) -> str:
    """Name DeepSpeed's shm.cpp gives a rank's buffer (pure)."""
    return f"{PREFIX}_{uid}_{master_addr}_{master_port}_{rank}"


def release_deepspeed_shm(shm_dir: str = "/dev/shm") -> bool:
    """Collective over the default group: unlink this rank's buffer once every peer mapped it.
    Returns whether a buffer was unlinked (False off the CPU accelerator: no buffer exists)."""
    import torch.distributed as dist

    dist.barrier()  # every rank returned from init_distributed: all buffers are mapped
    name = buffer_name(
        os.getuid(), os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", ""), dist.get_rank()
    )
    try:
        os.unlink(os.path.join(shm_dir, name))
        return True
    except FileNotFoundError:
        return False
