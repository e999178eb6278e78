"""One step predicted per candidate (time per phase and tier, busiest link, memory per GCD), and
the candidates ranked: fitting first, then fastest (``rank``), or by what ``auto`` minimises
(``rank_auto``, [Note: busiest-link bound] in pipeline.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence

from ..comm.issue import IssueMode, one_tier_hops, resolve_issue_mode
from ..core import levels
from ..core.config import MAX_PIPELINE_CHUNKS
from ..core.plan import make_plan
from ..core.vocab import TIERS
from .candidates import Candidate, default_candidates
from .clusters import PHASES, ClusterModel
from .cost import collective_cost, collectives
from .host import HostRates, HostWork, combine_of, combined, host_seconds, host_work, without_latency
from .memory_per_gcd import Memory, level_plan, memory
from .pipeline import choose_chunks, jobs_time, phase_jobs
from .tick_latency import exchange_factor, sends, sub_hops
from .workload import Workload


@dataclass(frozen=True)
class Prediction:
    candidate: Candidate
    step_s: float
    compute_s: float
    phase_s: dict
    tier_s: dict  # communication seconds whose bottleneck is each tier
    tier_bytes: dict  # bytes per step on each tier, whole cluster
    memory: Memory
    costs: list = field(default_factory=list, repr=False)
    kept_levels: levels.LevelPlan | None = None  # kept level per layer, under a budget
    # [Note: busiest-link bound]: seconds each link kind is busy per step (bytes / capacity), the
    # chunks per job chosen (or given), and communication with the jobs in that many chunks as the
    # cluster's issue mode runs them (pipelined on lanes, in ticks, hop after hop on one lane)
    link_s: dict = field(default_factory=dict)
    chunks: int = 1
    pipelined_comm_s: float = 0.0
    mode: str = "lanes"  # the issue mode modelled (``issue_mode_of``)
    # messages per step on each tier, whole cluster, every chunk (``comm_stats``' link_messages)
    tier_messages: dict = field(default_factory=dict)
    # [Note: host term] in host.py: what the issuing thread issues per step, its seconds at the
    # rates ``rank_auto`` was given (0 without), and how they meet the links' time
    host_work: HostWork | None = None
    host_s: float = 0.0
    combine: str = "max"

    @property
    def busiest_link(self) -> str:
        """The link kind that is busy longest per step (``gpu_out``: a package's links out)."""
        return max(self.link_s, key=lambda k: self.link_s[k]) if self.link_s else ""

    @property
    def link_bound_s(self) -> float:
        """No schedule moves a step's bytes faster than its busiest link can."""
        return max(self.link_s.values(), default=0.0)

    @property
    def dominant_tier(self) -> str:
        return max(self.tier_s, key=lambda t: self.tier_s[t])

    @property
    def comm_s(self) -> float:
        return sum(self.phase_s.values())

    @property
    def latency_s(self) -> float:
        return sum(c.latency_seconds for c in self.costs)


def one_tier_plan(cand: Candidate, cluster: ClusterModel) -> bool:
    """Whether every hop of ``cand``'s plan on ``cluster`` (every kept level's backward hops
    included) spans one tier: where ``overlap: true`` runs ticks on NCCL/RCCL (comm/issue.py)."""
    plan = make_plan(cand.preset, cand.compression, cluster.topology)
    backward = [h for _, hops in plan.by_level for h in hops] or list(plan.backward)
    return one_tier_hops(h.axes for h in (*plan.forward, *backward, *plan.reduce))


def resolved_issue_mode(cand: Candidate, cluster: ClusterModel) -> IssueMode:
    """What ``overlap: true`` resolves to for ``cand``'s plan on ``cluster``'s library, as the
    runtime resolves it ([Note: one issuing thread on GPUs] in comm/issue.py): lanes on gloo; on
    NCCL/RCCL ticks where every hop of the plan spans one tier, one lane otherwise."""
    backend = "gloo" if cluster.library == "gloo" else "nccl"
    return resolve_issue_mode(True, backend, cluster.library == "rccl", one_tier_plan(cand, cluster))


def issue_mode_of(cand: Candidate, cluster: ClusterModel) -> str:
    """The issue mode ``cand`` runs in on ``cluster``: ``cluster.issue_mode`` where set;
    otherwise ``resolved_issue_mode``'s. Stock DeepSpeed issues its own collectives: the
    library's default (``cluster.mode``)."""
    if cluster.issue_mode is not None or cand.stock:
        return cluster.mode
    return resolved_issue_mode(cand, cluster).schedule


def predict(cand: Candidate, cluster: ClusterModel, wl: Workload) -> Prediction:
    topo = cluster.topology
    mode = issue_mode_of(cand, cluster)
    # the kept levels take what memory leaves beside the chunks' staging: at the chunks given, or
    # where the planner chooses them (after this, from the costs) at 2, the most staging any
    # count above 1 holds (``pipeline_staging`` falls as chunks grow)
    reserve = cand.chunks if cand.chunks is not None else (1 if mode == "one_lane" else 2)
    lp = level_plan(cand, cluster, wl, reserve)
    _, colls = collectives(cand, topo, wl.params, lp, wl.backward_share)
    phase_s = dict.fromkeys(PHASES, 0.0)
    tier_s: dict[str, float] = {t: 0.0 for t in TIERS}
    tier_bytes: dict[str, float] = {t: 0.0 for t in TIERS}
    costs = []
    link_s: dict[str, float] = {}
    for c in colls:
        # gradients travel in the training dtype (DeepSpeed's communication_data_type)
        # one gather per parameter group and pass; DeepSpeed reduces gradients in buckets of
        # reduce_bucket_size (5e8 elements by default)
        calls = wl.gathers_per_pass if c.phase != "grad_reduce" else max(1, math.ceil(wl.params / wl.reduce_bucket))
        cost = collective_cost(c, cluster, wl.weight_bytes, cand.compression.block_size, calls, mode == "ticks")
        costs.append(cost)
        phase_s[c.phase] += cost.seconds
        tier_s[cost.bottleneck] += cost.seconds
        for t in TIERS:
            tier_bytes[t] += cost.tier_bytes[t]
        for kind, sec in cost.link_seconds.items():
            link_s[kind] = link_s.get(kind, 0.0) + sec
    jobs = phase_jobs(costs, wl, cluster if mode == "ticks" else None)
    chunks = cand.chunks if cand.chunks is not None else choose_chunks(jobs, mode)
    if mode == "ticks":  # a log-step all-to-all forwards blocks: more bytes on its links
        for cc in costs:
            n = topo.axes_size(cc.coll.axes)
            extra = exchange_factor(n, cluster.hop_steps) - 1 if cc.coll.op != "all_gather" else 0.0
            for kind, sec in cc.link_seconds.items():
                link_s[kind] += sec * extra
    # every chunk's messages bring their framing ([Note: per-message framing] in clusters.py);
    # a log-step hop sends fewer, larger messages: its sub-hops' sends over a direct hop's
    tier_messages = dict.fromkeys(TIERS, 0.0)
    for cc in costs:
        n = topo.axes_size(cc.coll.axes)
        fewer = _log_messages(n, cc.coll.op, cluster) if mode == "ticks" else 1.0
        for kind, sec in cc.frame_link_seconds.items():
            link_s[kind] = link_s.get(kind, 0.0) + sec * chunks * fewer
        for t in TIERS:
            tier_messages[t] += cc.tier_messages[t] * chunks * fewer
    pipelined = max(max(link_s.values(), default=0.0), jobs_time(jobs, chunks, mode))
    compute = cluster.compute_s if cluster.compute_s is not None else wl.flops_per_step / cluster.device_flops
    comm = sum(phase_s.values())
    hidden = sum((1.0 - cluster.exposed.get(ph, 1.0)) * t for ph, t in phase_s.items())
    return Prediction(
        cand,
        compute + comm - min(hidden, compute),
        compute,
        phase_s,
        tier_s,
        tier_bytes,
        memory(cand, cluster, wl, None if lp is None else lp.kept_bytes, chunks),
        costs,
        lp,
        link_s,
        chunks,
        pipelined,
        mode,
        tier_messages,
    )


def _log_messages(members: int, op: str, cluster: ClusterModel) -> float:
    """A tick hop's messages per rank over a direct hop's ``members - 1``: 1 direct, fewer in
    log steps (``tick_latency.sub_hops``' peers per sub-hop)."""
    if members < 2:
        return 1.0
    kind = "exchange" if op != "all_gather" else "gather"
    return sum(sends(h) for h in sub_hops(members, kind, cluster.library, cluster.hop_steps)) / (members - 1)


def rank_key(p: Prediction) -> float:
    """What ``auto`` minimises: the jobs as the prediction's issue mode runs them (pipelined on
    lanes, in ticks), at least the busiest link's time; the collectives in sequence where one
    lane issues them hop after hop."""
    return p.comm_s if p.mode == "one_lane" else p.pipelined_comm_s


def auto_key(p: Prediction) -> float:
    """What ``auto`` minimises with a host term ([Note: host term] in host.py): ``rank_key`` (the
    links) and the issuing thread's seconds, added where the thread waits for each transfer,
    the longer of the two where it issues ahead; ``rank_key`` where no host rates were given."""
    return combined(rank_key(p), p.host_s, p.combine)


def with_host(p: Prediction, cluster: ClusterModel, wl: Workload, rates: HostRates) -> Prediction:
    """``p`` with its host work, seconds and combination at ``rates`` ([Note: host term])."""
    work = host_work(p.costs, p.chunks, p.mode, cluster, wl)
    return replace(p, host_work=work, host_s=host_seconds(work, rates), combine=combine_of(cluster.library, p.mode))


def rank(cluster: ClusterModel, wl: Workload, candidates: Sequence[Candidate] | None = None) -> list[Prediction]:
    """Every candidate, fitting ones first, fastest first."""
    preds = [predict(c, cluster, wl) for c in (candidates or default_candidates(cluster))]
    return sorted(preds, key=lambda p: (not p.memory.fits, p.step_s))


def rank_auto(
    cluster: ClusterModel,
    wl: Workload,
    candidates: Sequence[Candidate],
    clusters: Mapping[str, ClusterModel] | None = None,
    host: HostRates | None = None,
) -> list[Prediction]:
    """``auto``'s ranking: fitting first, then by ``rank_key`` ([Note: busiest-link bound] in
    pipeline.py), each candidate in its issue mode (``issue_mode_of``); with ``host`` rates by
    ``auto_key``, the links' time and the issuing thread's ([Note: host term] in host.py).
    ``clusters``: a cluster per candidate name (its issue mode resolved from the job's
    ``overlap``), in place of ``cluster``."""
    on = {c.name: (clusters or {}).get(c.name, cluster) for c in candidates}
    if host is not None:  # on gloo the host term holds the per-step fixed costs ([Note: host term])
        on = {n: without_latency(cl) if combine_of(cl.library, "ticks") == "sum" else cl for n, cl in on.items()}
    if host is None:
        preds = [predict(c, on[c.name], wl) for c in candidates]
    else:
        preds = [_with_host_chunks(c, on[c.name], wl, host) for c in candidates]
    return sorted(preds, key=lambda p: (not p.memory.fits, auto_key(p)))


def _with_host_chunks(cand: Candidate, cluster: ClusterModel, wl: Workload, host: HostRates) -> Prediction:
    """``cand`` with its host term; where the planner chooses its chunks and they overlap hops
    (lanes, ticks), the count that minimises ``auto_key`` (fitting first, smallest on a tie):
    each chunk is more ops for the issuing thread ([Note: host term] in host.py), which the
    links' own choice (``choose_chunks``) does not see."""
    if cand.chunks is not None or issue_mode_of(cand, cluster) == "one_lane":
        return with_host(predict(cand, cluster, wl), cluster, wl, host)
    tries = [
        with_host(predict(cand._replace(chunks=c), cluster, wl), cluster, wl, host)
        for c in range(1, MAX_PIPELINE_CHUNKS + 1)
    ]
    best = min(tries, key=lambda p: (not p.memory.fits, auto_key(p), p.chunks))
    return replace(best, candidate=cand)


def ratio(preds: Iterable[Prediction], slow: str, fast: str) -> float:
    by = {p.candidate.name: p for p in preds}
    return by[slow].step_s / by[fast].step_s
