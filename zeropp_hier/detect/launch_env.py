"""The launcher's environment variables that this package and DeepSpeed read as numbers, checked
before any of them is used. Pure: an environment in, a named error out."""

from __future__ import annotations

import re
from typing import Mapping

from ..core.errors import HierTopologyError
from .slurm_env import slurm_task

_WHOLE = re.compile(r"[0-9]+")  # str.isdigit accepts digits int() does not ("²")
# name -> what it is (for the fix); each, when set, must be a whole number >= 0
NUMERIC = {
    "RANK": "this process's rank in the job",
    "WORLD_SIZE": "the number of ranks in the job",
    "LOCAL_RANK": "this process's index on its node",
    "LOCAL_WORLD_SIZE": "the number of ranks on this node",
    "LOCAL_SIZE": "the number of ranks on this node",
}


def check_launch_env(env: Mapping[str, str]) -> None:
    """Raise ``HierTopologyError`` naming the first variable that is set but unusable."""
    for name, what in NUMERIC.items():
        v = env.get(name)
        if v is None:
            continue
        if not _WHOLE.fullmatch(v.strip()):
            raise HierTopologyError(
                name, v, f"set it to {what}, a whole number >= 0 (as torchrun, srun wrappers or mpirun set it)"
            )
    ws, r = env.get("WORLD_SIZE"), env.get("RANK")
    if ws is not None and r is not None and int(r) >= int(ws):
        raise HierTopologyError("RANK", r, f"must be below WORLD_SIZE = {ws}; check the launcher")
    slurm_task(env)  # Slurm's variables, when under srun (raises naming the variable)
