"""Pipelined hops: a job's hops cut into chunks that the executor's lanes run as a pipeline
([Note: pipelined hops]), the step's jobs per phase, and the chunk count that minimises them
([Note: busiest-link bound]). Pure arithmetic over the collectives' costs."""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

from ..core.config import MAX_PIPELINE_CHUNKS
from .clusters import PHASES, ClusterModel
from .cost import CollectiveCost
from .tick_latency import sends, sub_hops
from .workload import Workload

# [Note: pipelined hops]
# A job (one gather, one gradient bucket's stages) runs its hops in sequence: unpipelined it costs
# the sum of its hops' times. Cut into ``c`` chunks that the executor's lanes run as a pipeline
# ([Note: chunked gathers] in comm/gather.py), hop t of chunk i starts once hop t of chunk i-1
# and hop t-1 of chunk i are done: a flow shop of identical jobs, whose makespan is
# ``sum(tau) + (c - 1) * max(tau)`` with ``tau_t = T_t / c + alpha_t`` (``T_t`` the hop's time
# for the whole job, ``alpha_t`` its fixed cost per collective, paid once per chunk). That is
# the slowest hop's time plus fill and drain (every other hop's time for one chunk), and each
# chunk pays every hop's latency again, so more chunks shorten fill and drain but add
# latency; ``best_chunks`` takes the minimum. The model holds where each hop has its own link
# and its own lane (gloo's lanes): hops that share a physical link (the gpu and node tiers both
# cross a package's links) are one resource and should be passed as one stage, and with one
# issuing lane (``one_lane``, serial on RCCL) the hops do not overlap: use ``sequential_time``.
# In the tick mode ([Note: ticks] in comm/tick/plan.py) chunk ``c``'s hop ``h`` runs in tick
# ``c + h`` and a tick lasts as long as its slowest hop, or longer where its hops share a link:
# ``ticked_time``.
#
# [Note: tick latency]
# A ring collective over ``k`` ranks pays its fixed cost ``alpha`` once per step, ``k - 1`` times
# (``CollectiveCost.latency_seconds``). A tick sends each hop's rows to every member of its group
# at once, in one grouped point-to-point call: one exchange step, so a hop in a tick pays
# ``alpha`` once (``CollectiveCost.step_latency_seconds``, ``PhaseJob.tick_latency_s``), and
# the hops of one tick pay it together. Counting ring steps instead would price frontier's node
# hop at 48 nodes 47 times too high and make the planner refuse chunks where they pay. How many
# times a tick pays it follows how the library runs the grouped call and the hop's log steps
# ([Note: grouped-call rounds] in tick_latency.py): with ``cluster`` given, ``phase_jobs`` lays
# each hop out as its sub-hops, each with its rounds' alphas and its share of the hop's link time.


def sequential_time(hop_s: Sequence[float], latency_s: Sequence[float] | None = None) -> float:
    """A job's hops one after another ([Note: pipelined hops]): the sum of their times."""
    lat = latency_s if latency_s is not None else [0.0] * len(hop_s)
    return float(sum(hop_s) + sum(lat))


def pipelined_time(hop_s: Sequence[float], chunks: int, latency_s: Sequence[float] | None = None) -> float:
    """A job of hops taking ``hop_s`` seconds each (whole job, in hop order; ``latency_s`` per
    collective) cut into ``chunks`` pipelined chunks ([Note: pipelined hops]): the slowest
    chunk-hop ``chunks`` times, plus every other hop once (fill and drain)."""
    if chunks < 1:
        raise ValueError(f"chunks = {chunks}: a job is cut into at least one chunk")
    if len(hop_s) == 0:
        return 0.0
    lat = latency_s if latency_s is not None else [0.0] * len(hop_s)
    if len(lat) != len(hop_s):
        raise ValueError(f"{len(hop_s)} hop times but {len(lat)} latencies")
    tau = [t / chunks + a for t, a in zip(hop_s, lat)]
    return float(sum(tau) + (chunks - 1) * max(tau))


def ticked_time(
    hop_s: Sequence[float],
    chunks: int,
    latency_s: Sequence[float] | None = None,
    links: Sequence[Sequence[tuple[str, float]]] = (),
    frame_links: Sequence[Sequence[tuple[str, float]]] = (),
) -> float:
    """A job of hops taking ``hop_s`` seconds each (whole job; ``latency_s`` per collective) in
    ``chunks`` chunks run in ticks ([Note: pipelined hops]): ``chunks + len(hop_s) - 1`` ticks,
    tick ``t`` holding hop ``h`` of chunk ``t - h``, each as long as the longest of its hops
    (``hop_s[h] / chunks + latency_s[h]``) and at least the load of every link its hops share
    (``links[h]``: the hop's (link kind, seconds busy) for the whole job, [Note: shared links]
    in schedule.py; a closed form, where the schedule fills the links flow by flow), each chunk's
    messages' framing on them included (``frame_links[h]``: (link kind, seconds per chunk))."""
    if chunks < 1:
        raise ValueError(f"chunks = {chunks}: a job is cut into at least one chunk")
    lat = latency_s if latency_s is not None else [0.0] * len(hop_s)
    if len(lat) != len(hop_s):
        raise ValueError(f"{len(hop_s)} hop times but {len(lat)} latencies")
    total = 0.0
    for t in range(chunks + len(hop_s) - 1):
        inside = [h for h in range(len(hop_s)) if 0 <= t - h < chunks]
        longest = max(hop_s[h] / chunks + lat[h] for h in inside)
        load: dict[str, float] = {}
        for h in inside:
            for kind, sec in links[h] if h < len(links) else ():
                load[kind] = load.get(kind, 0.0) + sec / chunks
            for kind, sec in frame_links[h] if h < len(frame_links) else ():
                load[kind] = load.get(kind, 0.0) + sec
        total += max(longest, max(load.values(), default=0.0))
    return float(total)


def best_chunks(hop_s: Sequence[float], latency_s: Sequence[float] | None = None, max_chunks: int = 64) -> int:
    """The chunk count in 1..``max_chunks`` with the shortest ``pipelined_time`` (the smallest on
    a tie)."""
    return min(range(1, max_chunks + 1), key=lambda c: (pipelined_time(hop_s, c, latency_s), c))


# [Note: busiest-link bound]
# With lanes (gloo), hops of different jobs and, pipelined, of one job's chunks run on their links
# at once, so a step's communication tends to its busiest link's time: the bytes every collective
# puts on that link over its capacity (``Prediction.link_s``, per link kind; a package's links out
# and in, ``gpu_out``/``gpu_in``, carry the gpu tier's bytes and the node tier's, since a node's
# traffic leaves through its packages). No schedule beats that bound; a job's hops still run in
# sequence within a chunk, so the estimate is the larger of the bound and every phase's jobs
# pipelined in ``chunks`` chunks ([Note: pipelined hops]): ``pipelined_comm_s``. ``choose_chunks``
# takes the chunk count that minimises the pipelined jobs (each chunk pays every hop's latency
# again); with one issuing lane (``one_lane``, serial on RCCL) nothing overlaps and chunking only
# adds latency, so there it is 1; in the tick mode it minimises the jobs in ticks, one job after
# another (``ticked_time``): ``jobs_time`` in the cluster's mode. ``auto`` ranks by the bound where
# lanes or ticks run (``rank_key``), so compression is chosen for the busiest link: int4 gradients
# on the package links when those bind, fewer in-package bytes when the package link does (flat
# links). The chunks' extra staging (``pipeline_staging``) enters the memory check.


class PhaseJob(NamedTuple):
    phase: str
    hop_s: tuple[float, ...]  # each hop's time for one job (bandwidth and quantization)
    latency_s: tuple[float, ...]  # each hop's fixed cost per collective
    calls: int  # jobs of this phase per step
    lanes: tuple[tuple[str, ...], ...] = ()  # each hop's group (its axes): the executor's lane
    # each hop's (link kind, seconds busy) for one job, and its flows' rate ([Note: shared links])
    links: tuple[tuple[tuple[str, float], ...], ...] = ()
    rates: tuple[float, ...] = ()
    # each hop's fixed cost in a tick, one exchange step ([Note: tick latency]); () : latency_s
    tick_latency_s: tuple[float, ...] = ()
    # each hop's framing per collective on its busiest link, paid by every chunk as latency is
    # ([Note: per-message framing] in clusters.py); () : none
    frame_s: tuple[float, ...] = ()
    # each hop's framing per collective and chunk on each link kind it uses
    frame_links: tuple[tuple[tuple[str, float], ...], ...] = ()

    def fixed_s(self, ticks: bool = False) -> tuple[float, ...]:
        """Each hop's cost per chunk that chunking does not divide: its latency (in a tick, one
        exchange step's) and its messages' framing."""
        lat = self.tick_latency_s if ticks and self.tick_latency_s else self.latency_s
        return tuple(a + f for a, f in zip(lat, self.frame_s or (0.0,) * len(lat)))


def phase_jobs(costs: Sequence[CollectiveCost], wl: Workload, ticks: ClusterModel | None = None) -> list[PhaseJob]:
    """The step's jobs per phase: one gather per parameter group and pass, one job per gradient
    bucket, each running its phase's hops in order. ``ticks``: the cluster whose tick mode lays
    each hop out as its sub-hops ([Note: tick latency])."""
    out = []
    for phase in PHASES:
        cs = [c for c in costs if c.coll.phase == phase]
        if not cs:
            continue
        calls = wl.gathers_per_pass if phase != "grad_reduce" else max(1, math.ceil(wl.params / wl.reduce_bucket))
        if ticks is not None:
            out.append(_tick_job(phase, cs, calls, ticks))
            continue
        out.append(
            PhaseJob(
                phase,
                tuple((c.seconds - c.latency_seconds - c.frame_seconds) / calls for c in cs),
                tuple(c.latency_seconds / calls for c in cs),
                calls,
                tuple(c.coll.axes for c in cs),
                tuple(tuple((k, sec / calls) for k, sec in c.link_seconds.items()) for c in cs),
                tuple(c.flow_rate for c in cs),
                tuple(c.step_latency_seconds / calls for c in cs),
                tuple(c.frame_seconds / calls for c in cs),
                tuple(tuple((k, sec / calls) for k, sec in c.frame_link_seconds.items()) for c in cs),
            )
        )
    return out


def _tick_job(phase: str, cs: Sequence[CollectiveCost], calls: int, cluster: ClusterModel) -> PhaseJob:
    """One job of ``phase`` in ticks: each hop as its sub-hops, each paying its rounds' alphas
    and its share of the hop's link time; quantization with the first ([Note: tick latency])."""
    hop_s, lat, lanes, links, rates, frame, frame_links = [], [], [], [], [], [], []
    for c in cs:
        kind = "exchange" if c.coll.op != "all_gather" else "gather"
        alpha = cluster.tiers[c.coll.axes[0]].latency
        moving = (c.seconds - c.latency_seconds - c.quant_seconds - c.frame_seconds) / calls
        n = cluster.topology.axes_size(c.coll.axes)
        for i, sh in enumerate(sub_hops(n, kind, cluster.library, cluster.hop_steps)):
            hop_s.append(moving * sh.share + (c.quant_seconds / calls if i == 0 else 0.0))
            lat.append(alpha * sh.alphas)
            lanes.append(c.coll.axes)
            links.append(tuple((k, sec / calls * sh.share) for k, sec in c.link_seconds.items()))
            rates.append(c.flow_rate)
            # a tick transfer is one message per receiver: a direct hop's n - 1, a log step's one
            fewer = sends(sh) / (n - 1) if n > 1 else 0.0
            frame.append(c.frame_seconds / calls * fewer)
            frame_links.append(tuple((k, sec / calls * fewer) for k, sec in c.frame_link_seconds.items()))
    return PhaseJob(
        phase,
        tuple(hop_s),
        tuple(lat),
        calls,
        tuple(lanes),
        tuple(links),
        tuple(rates),
        tuple(lat),
        tuple(frame),
        tuple(frame_links),
    )


def jobs_time(jobs: Sequence[PhaseJob], chunks: int, mode: str = "lanes") -> float:
    """The step's jobs one after another, each in ``chunks`` chunks as the issue mode runs them:
    pipelined on lanes ([Note: pipelined hops]), in ticks, or hop after hop on one lane."""
    if mode == "ticks":
        return sum(j.calls * ticked_time(j.hop_s, chunks, j.fixed_s(ticks=True), j.links, j.frame_links) for j in jobs)
    if mode == "one_lane":
        return sum(j.calls * sequential_time(j.hop_s, [a * chunks for a in j.fixed_s()]) for j in jobs)
    return sum(j.calls * pipelined_time(j.hop_s, chunks, j.fixed_s()) for j in jobs)


def choose_chunks(jobs: Sequence[PhaseJob], mode: str, max_chunks: int = MAX_PIPELINE_CHUNKS) -> int:
    """[Note: busiest-link bound]: the chunk count (1..``max_chunks``, smallest on a tie) that
    minimises the step's jobs in issue mode ``mode`` where its chunks overlap hops (lanes,
    ticks); 1 on one lane, where they overlap nothing."""
    if mode == "one_lane" or not jobs:
        return 1
    return min(range(1, max_chunks + 1), key=lambda c: (jobs_time(jobs, c, mode), c))
