"""The planner: predicts one training step (time per phase and tier, memory per GCD) of every
layout and compression before any process starts, and ranks them. Pure arithmetic over ``core``
(no torch.distributed, no DeepSpeed, no printing, no files), one concern per module, each
building on the ones before it:

* ``clusters``: the machines (link rates per tier, memory, device rates), Frontier and the
  emulated cluster built in;
* ``workload``: what one step asks of them;
* ``candidates``: the configurations compared (stock DeepSpeed, our presets);
* ``cost``: the collectives a candidate issues and their time on the links;
* ``pipeline``: hops pipelined in chunks, and the chunk count;
* ``memory_per_gcd``: memory per GCD by part;
* ``host``: the issuing thread's work per step and how it meets the links' time;
* ``ranking``: one predicted step per candidate, and the ranking;
* ``schedule``: the step replayed as its dependencies and lanes allow;
* ``tables``: every table printed for people (the job's and the planner's).

The names below are the planner's public face: ``from zeropp_hier import planner`` and use
``planner.rank(...)``. The ``zeropp-hier plan`` command (``zeropp_hier/tools/cli.py``) and the
``auto`` preset (``zeropp_hier/deepspeed/auto.py``) are its users."""

from .candidates import Candidate, auto_candidates, compression_for, default_candidates
from .clusters import (
    EMULATED_EXPOSED,
    GB,
    PHASES,
    ClusterModel,
    ProbedTiers,
    TierLink,
    emulated,
    frontier,
    with_probed_tiers,
)
from .cost import Collective, CollectiveCost, collective_cost, collectives, link_loads
from .host import (
    HostRates,
    HostWork,
    combine_of,
    host_seconds,
    host_work,
    jobs_per_phase,
    touched_elems,
    without_latency,
)
from .memory_per_gcd import CHUNK_STAGING_COPIES, Memory, fit_advice, level_plan, memory, pipeline_staging
from .pipeline import (
    PhaseJob,
    best_chunks,
    choose_chunks,
    jobs_time,
    phase_jobs,
    pipelined_time,
    sequential_time,
    ticked_time,
)
from .ranking import (
    Prediction,
    auto_key,
    issue_mode_of,
    one_tier_plan,
    predict,
    rank,
    rank_auto,
    rank_key,
    ratio,
    resolved_issue_mode,
    with_host,
)
from .workload import Workload, gpt_workload

__all__ = [
    "CHUNK_STAGING_COPIES",
    "EMULATED_EXPOSED",
    "GB",
    "PHASES",
    "Candidate",
    "ClusterModel",
    "ProbedTiers",
    "Collective",
    "HostRates",
    "HostWork",
    "CollectiveCost",
    "Memory",
    "PhaseJob",
    "Prediction",
    "TierLink",
    "Workload",
    "auto_candidates",
    "auto_key",
    "combine_of",
    "host_seconds",
    "touched_elems",
    "host_work",
    "jobs_per_phase",
    "with_host",
    "without_latency",
    "best_chunks",
    "choose_chunks",
    "collective_cost",
    "collectives",
    "compression_for",
    "default_candidates",
    "emulated",
    "fit_advice",
    "frontier",
    "gpt_workload",
    "jobs_time",
    "level_plan",
    "link_loads",
    "memory",
    "phase_jobs",
    "pipeline_staging",
    "pipelined_time",
    "ticked_time",
    "predict",
    "rank",
    "rank_auto",
    "issue_mode_of",
    "one_tier_plan",
    "resolved_issue_mode",
    "rank_key",
    "ratio",
    "sequential_time",
    "with_probed_tiers",
]
