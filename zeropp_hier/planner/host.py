"""The host's work per step of a candidate: what the one issuing thread issues (collective calls,
or in ticks point-to-point ops in grouped calls), counted from the planner's own jobs, and its
seconds at measured per-op rates; and how ``auto`` weighs it beside the links' time. Pure.

[Note: host term]
Where the links are fast, a step is bound by what the issuing thread does, not by the wire. Per
step it issues, for every job of the schedule ([Note: step schedule] in schedule.py: a job per
layer and pass, backward's held layers excepted, one per gradient bucket) and every chunk:

* one collective per hop (one lane, lanes): ``collectives``;
* in ticks, every hop's point-to-point ops (a send and a receive per peer of each sub-hop,
  ``tick_latency.sub_hops``) posted in the tick's grouped call: ``p2p_ops``; ``ticks`` is
  ``chunks + sub-hops - 1`` per job (what a stream of one piece pays; fused streams pay less);
* in ticks, the elements every hop touches (``tick_elems``: a gather hop's output, a reduce
  hop's input, whole model per step): the tick mode assembles each hop's rows from its
  transfers itself (the slot copies, the concatenations, the coordinate reorder), work a
  library collective does inside its call, where the link probe's measured rates carry it.

Each costs the host a measured time (``HostRates``: seconds per collective call and per
point-to-point op, measured at initialize on the ranks themselves, all at once, the slowest
rank's: deepspeed/auto_host.py), so ``host_s = collectives * collective_s + p2p_ops * p2p_op_s +
tick_elems * tick_elem_s``;
on gloo, whose ring runs its steps on the calling thread, a collective over ``k`` ranks costs
``k - 1`` steps at the probe's seconds per step (``collective_steps``).
(De)quantization is not here: it is the device's work, already in the link term at the device's
rate (cost.py), which ``auto`` measures with the host probe. On gloo a collective's fixed cost
per step is the calling thread's own work, which the host term measures on the ranks as they
run; the link probe's latency (a tiny all-gather's time per ring step, [Note: latency from a tiny
message] in detect/links.py) holds that same work, and would count it again, so there the link
term is priced without latency (``without_latency``) and keeps the bytes and the
(de)quantization.

How the host's time meets the links' (``combine``) follows how the issue modes run
(comm/issue.py, comm/executor.py, comm/tick/executor.py):

* gloo: a collective and a tick's grouped call run on the calling host thread and return when
  the bytes have moved (``work.wait()`` waits on the host), so the thread's own work and the
  transfers alternate: ``"sum"`` (gloo's lanes are a thread per hop group, but they share the
  interpreter's lock and the cores, so their ops are counted as one thread's);
* RCCL in one lane is serial: the thread issues a collective only after the previous one has
  completed on the device (a host wait), so again ``"sum"``;
* NCCL/RCCL otherwise (ticks, NCCL's one lane): the thread enqueues and moves on (``wait()``
  makes the stream wait, not the host), so host and device work overlap: ``"max"``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import NamedTuple, Sequence

from .clusters import PHASES, ClusterModel, TierLink
from .cost import Collective, CollectiveCost
from .tick_latency import sub_hops
from .workload import Workload

COMBINE = ("sum", "max")


class HostRates(NamedTuple):
    """Host seconds per issued op, measured (or declared); ``source`` says which."""

    collective_s: float  # one collective call on a hop group, issued and (gloo) completed
    p2p_op_s: float  # one point-to-point op of a grouped call (a tick's send or receive)
    source: str = ""
    # gloo: the ring steps of the collective ``collective_s`` timed (the probe's group size less
    # one), whose messages the calling thread runs one by one; 0: one launch per collective
    ring_steps: int = 0
    # the tick mode's local work per element a hop touches, beyond the (de)quantization the link
    # term charges ([Note: host probe] in deepspeed/auto_host.py, 4.); 0: not measured
    tick_elem_s: float = 0.0


class HostWork(NamedTuple):
    """What one rank's issuing thread issues per step ([Note: host term])."""

    collectives: int
    p2p_ops: int
    ticks: int
    jobs: int
    collective_steps: int = 0  # the collectives' ring steps (gloo's reduce-scatter: two rings)
    tick_elems: float = 0.0  # in ticks: elements the hops touch per step (gather out, reduce in)


def jobs_per_phase(wl: Workload) -> dict[str, int]:
    """Jobs per step and phase as the schedule lays them out ([Note: step schedule] in
    schedule.py): a job per layer in forward, per layer not held at the turn in backward
    ([Note: the turn] in workload.py), per gradient bucket."""
    layers = max(1, wl.layers)
    held = min(layers, round(wl.kept_at_turn / (wl.params / layers))) if wl.params > 0 else 0
    return {
        "forward_gather": layers,
        "backward_gather": layers - held,
        "grad_reduce": max(1, math.ceil(wl.params / wl.reduce_bucket)),
    }


def host_work(
    costs: Sequence[CollectiveCost], chunks: int, mode: str, cluster: ClusterModel, wl: Workload
) -> HostWork:
    """The ops one step issues for a prediction's collectives (``Prediction.costs``) in ``chunks``
    chunks and issue mode ``mode`` ([Note: host term])."""
    jobs = jobs_per_phase(wl)
    collectives = p2p = ticks = n_jobs = steps = 0
    touched = 0.0
    for phase in PHASES:
        hops = [c.coll for c in costs if c.coll.phase == phase]
        if not hops:
            continue
        n = jobs[phase]
        n_jobs += n
        if mode != "ticks":
            collectives += n * chunks * len(hops)
            for coll in hops:  # as cost.py counts a collective's steps
                k = cluster.topology.axes_size(coll.axes)
                steps += n * chunks * (2 if coll.op == "reduce_scatter" and cluster.library == "gloo" else 1) * (k - 1)
            continue
        subs = 0
        ops = 0
        for coll in hops:
            kind = "exchange" if coll.op != "all_gather" else "gather"
            members = cluster.topology.axes_size(coll.axes)
            parts = sub_hops(members, kind, cluster.library, cluster.hop_steps)
            subs += len(parts)
            ops += sum(s.ops for s in parts)
            touched += touched_elems(coll, members)
        p2p += n * chunks * ops
        ticks += n * (chunks + subs - 1)
    return HostWork(collectives, p2p, ticks, n_jobs, steps, touched)


def touched_elems(coll: Collective, members: int) -> float:
    """Elements a tick hop touches for ``coll`` over ``members`` ranks ([Note: host term]): a
    gather hop's output, a reduce hop's input; whole model per step, whatever the jobs and
    chunks. The host probe's local pieces are counted the same way (deepspeed/auto_host.py)."""
    return coll.send_elems * members if coll.op == "all_gather" else coll.send_elems


def host_seconds(work: HostWork, rates: HostRates) -> float:
    """The issuing thread's seconds per step at ``rates`` ([Note: host term]): on gloo each
    collective costs its ring steps at the probe's seconds per step, elsewhere one call each."""
    if rates.ring_steps:
        coll = work.collective_steps * rates.collective_s / rates.ring_steps
    else:
        coll = work.collectives * rates.collective_s
    return coll + work.p2p_ops * rates.p2p_op_s + work.tick_elems * rates.tick_elem_s


def without_latency(cluster: ClusterModel) -> ClusterModel:
    """``cluster`` with no per-collective latency on its links: on gloo the host term's measured
    seconds per ring step and per op are that cost, taken on the ranks as they run ([Note: host
    term]), so the link term keeps the bytes and the (de)quantization alone."""
    return replace(cluster, tiers={t: TierLink(v.bandwidth, 0.0) for t, v in cluster.tiers.items()})


def combine_of(library: str, mode: str) -> str:
    """How host and link time add up in issue mode ``mode`` on ``library`` ([Note: host term])."""
    if library == "gloo" or (library == "rccl" and mode == "one_lane"):
        return "sum"
    return "max"


def combined(link_s: float, host_s: float, how: str) -> float:
    if how not in COMBINE:
        raise ValueError(f"planner.host: combine {how!r}: use one of {list(COMBINE)}")
    return link_s + host_s if how == "sum" else max(link_s, host_s)


__all__ = [
    "COMBINE",
    "HostRates",
    "HostWork",
    "combine_of",
    "combined",
    "host_seconds",
    "host_work",
    "jobs_per_phase",
    "touched_elems",
    "without_latency",
]
