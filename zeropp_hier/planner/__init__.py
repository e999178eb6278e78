"""The planner: predicts one training step (time per phase and tier, memory per GCD) of every
layout and compression before any process starts, and ranks them. Pure arithmetic over ``core``
(no torch.distributed, no DeepSpeed, no printing, no files): ``model`` is the cost and memory
model and the ranking, ``tables`` the plain-text tables that the job and the command print.
The ``zeropp-hier plan`` command (``zeropp_hier/tools/cli.py``) and the ``auto`` preset
(``zeropp_hier/deepspeed/auto.py``) are its users."""

from .model import (
    Candidate,
    ClusterModel,
    Prediction,
    TierLink,
    Workload,
    auto_candidates,
    collectives,
    default_candidates,
    emulated,
    explain,
    frontier,
    gpt_workload,
    level_lines,
    link_loads,
    memory,
    predict,
    rank,
    ratio,
    table,
    with_probed_tiers,
)

__all__ = [
    "TierLink",
    "ClusterModel",
    "Workload",
    "Candidate",
    "Prediction",
    "gpt_workload",
    "default_candidates",
    "auto_candidates",
    "predict",
    "rank",
    "explain",
    "level_lines",
    "frontier",
    "emulated",
    "with_probed_tiers",
    "ratio",
    "table",
    "collectives",
    "link_loads",
    "memory",
]
