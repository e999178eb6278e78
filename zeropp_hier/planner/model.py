"""Predict one training step for each layout before spending an allocation.

Pure: no torch.distributed, no processes. The collectives a configuration issues come from
``plan.make_plan`` — the very plan the runtime executes — so prediction and implementation
cannot drift apart. A *candidate* is stock DeepSpeed (ZeRO-3, or ZeRO++ with the parts of it
that can run on the cluster) or one of our presets with a compression choice.

[Note: cost model]
One step = compute + every collective, one after another, less what overlap hides. Each phase
has an exposed fraction e (forward gathers, backward gathers, gradient reduce):
``step = compute + comm - min(sum((1 - e) * phase), compute)``. How much overlap hides is a
property of the machine (on GPUs the links run beside the SMs; on a CPU the collectives'
copies and quantization compete with compute for the same cores), so it is measured, not
derived. Every fraction is 1 (nothing hidden) unless a measurement says otherwise: the Frontier
model keeps 1, an upper bound. The emulated cluster with DeepSpeed's prefetch on uses
forward 1, backward 0, gradients 0.5 (``EMULATED_EXPOSED``): forward gathers did not hide there,
backward re-gathers (prefetched, from the kept copies) did, and half of the gradient stages ran
beside backward. That choice was read off the three runs in docs/benchmarks.md ("auto at
three link settings": all within 7.6% of the measured step with it; one fraction for all phases
left 15%), so it describes those runs; it is not a held-out validation. It changes predicted
steps and can change the ranking between layouts whose time sits in different phases.
A collective's time is
``max over links (bytes on the link / (capacity * efficiency)) + latency * steps``:

* links are the resources of the machine: the in-package link of each package (capacity
  gcds_per_gpu * gcd rate), each package's links to the rest of its node (out and in,
  gcds_per_gpu * gpu rate) and each node's network links (out and in, gcds_per_node * node rate).
  Rates are per GCD and per direction — what one GCD gets when every GCD of its enclosure sends,
  which is how docs/design.md#hardware-tiers states Frontier's numbers and how ``zeropp-hier probe`` measures them.
* the bytes on each link follow the algorithm the library uses: ring all-gather and
  reduce-scatter over the group in rank order (NCCL/RCCL; gloo's reduce-scatter sends as much as
  a ring all-reduce, measured on the emulated cluster), direct all-to-all. A flat ring crosses a
  slow link once per enclosure and so is already frugal with node bytes; a direct exchange sends
  a copy per receiving rank. This is why wire bytes differ from ``comm_stats``'s direct-algorithm
  accounting for flat collectives.
* quantized hops add (de)quantization time at the device's rate; payloads are counted at their
  packed size plus one fp32 scale per block.

Memory per GCD follows docs/design.md#memory-per-gcd: primary 2M/W + kept shard (secondary 2M/gcds_per_node for
ZeRO++, tertiary 2M/gcds_per_gpu for frontier) + optimizer 12M/W + gradient partition 2M/W
(bytes for 16-bit weights; other widths scale), plus the error-feedback residuals (one per
compressed stage that feeds back, the size of that stage's send buffer; fp32 or bf16), the fp32
staging of one reduce bucket, two gathered layers and activations.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from ..core import levels
from ..core.config import MAX_PIPELINE_CHUNKS
from ..core.plan import STREAM_CHUNK_ELEMS, CommPlan, make_plan
from ..core.policy import CompressionConfig, FixedPreset, parse_compression
from ..core.topology import Topology
from ..core.vocab import AXES, TIERS
from .tables import fmt_bytes

GB = 1e9


# --------------------------------------------------------------------------------------------
# descriptions
@dataclass(frozen=True)
class TierLink:
    bandwidth: float  # bytes/s per GCD per direction
    latency: float  # seconds per algorithm step (alpha)


# the phases of a step's communication, as Prediction.phase_s and ClusterModel.exposed name them
PHASES = ("forward_gather", "backward_gather", "grad_reduce")


@functools.lru_cache(maxsize=16)  # a Topology indexes every rank: build each one once
def _topology(nodes: int, gpus_per_node: int, gcds_per_gpu: int) -> Topology:
    return Topology(nodes, gpus_per_node, gcds_per_gpu)


@dataclass(frozen=True)
class ClusterModel:
    name: str
    nodes: int
    gpus_per_node: int
    gcds_per_gpu: int
    tiers: Mapping[str, TierLink]
    memory_per_gcd: float  # bytes
    device_flops: float  # achieved FLOP/s per GCD on the model's matmuls
    quant_rate: float  # elements/s per GCD for a quantize + dequantize round trip
    library: str = "rccl"  # "rccl" | "nccl" | "gloo": which collective algorithms run
    efficiency: float = 1.0  # fraction of link rate a collective gets (1.0 for probed rates)
    stock_quantization: bool = True  # whether DeepSpeed's qwZ/qgZ kernels run on this device
    compute_s: float | None = None  # measured compute per step; overrides device_flops
    source: str = ""  # where the numbers come from, printed beside predictions
    # fraction of each phase's communication left exposed by overlap ([Note: cost model]);
    # phases not named are fully exposed
    exposed: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self):
        for phase, e in self.exposed.items():
            if phase not in PHASES or not 0.0 <= e <= 1.0:
                raise ValueError(
                    f"ClusterModel.exposed[{phase!r}] = {e!r}: give a fraction in [0, 1] for a phase of {PHASES}"
                )

    @property
    def topology(self) -> Topology:
        return _topology(self.nodes, self.gpus_per_node, self.gcds_per_gpu)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node * self.gcds_per_gpu


@dataclass(frozen=True)
class Workload:
    params: float  # M
    tokens_per_gcd: int  # tokens each GCD processes per optimizer step
    weight_bytes: int = 2  # 2 for fp16/bf16 training, 4 for fp32
    gathers_per_pass: int = 1  # parameter groups gathered separately per pass (latency count)
    largest_layer_params: float = 0.0  # for the gathered-layer working memory
    activation_bytes: float = 0.0  # per GCD
    flops_per_token: float | None = None  # default 6 * params (forward + backward)
    reduce_bucket: float = 5e8  # DeepSpeed's reduce_bucket_size (elements)
    residual_bytes: int = 4  # error-feedback residual storage: 4 (fp32) or 2 (numerics.residual_dtype bf16)
    layers: int = 1  # equal layers the kept levels are chosen over ([Note: kept levels])
    # elements the backward's first layers still hold gathered from forward ([Note: the turn])
    kept_at_turn: float = 0.0

    @property
    def backward_share(self) -> float:
        """The part of the model the backward gathers again ([Note: the turn])."""
        return 1.0 - min(self.kept_at_turn, self.params) / self.params if self.params > 0 else 1.0

    @property
    def flops_per_step(self) -> float:
        return (self.flops_per_token or 6.0 * self.params) * self.tokens_per_gcd

    @property
    def optimizer_bytes_per_param(self) -> int:
        # Adam: fp32 m and v, plus an fp32 master copy when the weights are 16-bit
        return 8 + (4 if self.weight_bytes < 4 else 0)


def gpt_workload(
    params: float,
    layers: int,
    d_model: int,
    seq_len: int,
    micro_batch: int,
    weight_bytes: int = 2,
    activation_checkpointing: bool = True,
    vocab: int = 50257,
    prefetch_bucket: float = 0.0,
) -> Workload:
    """A GPT as the planner sees it: 6 parameter groups per layer (ln1, qkv, proj, ln2, fc, out)
    plus embeddings and final norm; activations ~ 34*s*b*d*L bytes (2*s*b*d*L with checkpointing).
    ``prefetch_bucket``: DeepSpeed's ``stage3_prefetch_bucket_size`` (0: no prefetch), which
    decides what backward need not gather again ([Note: the turn])."""
    per_layer_act = (2 if activation_checkpointing else 34) * seq_len * micro_batch * d_model
    return Workload(
        params=params,
        tokens_per_gcd=seq_len * micro_batch,
        weight_bytes=weight_bytes,
        gathers_per_pass=6 * layers + 3,
        largest_layer_params=max(4 * d_model * d_model, vocab * d_model),
        activation_bytes=per_layer_act * layers * weight_bytes / 2,
        layers=layers,
        kept_at_turn=min(float(prefetch_bucket), float(params)),
    )


# [Note: the turn]
# Where forward ends and backward begins, DeepSpeed (0.19's PartitionedParameterCoordinator)
# does not release everything forward gathered. Its prefetch walks the recorded trace, which runs
# on into backward; a parameter of backward's first modules that is still gathered is skipped by
# the walk and marked, and a marked parameter is not released after its forward use. So about
# one prefetch bucket (``stage3_prefetch_bucket_size`` elements, when prefetching) of backward's
# first layers is still gathered when backward starts, and backward gathers only the rest.
# Measured on the link-bound benchmark's model (3.68M parameters, 4 layers, bucket 2.36M
# elements): in the steady step, backward gathered the first layer's attention, layer 0 and the
# embedding (1.31M elements) and held the head, layers 3 and 2 and layer 1's MLP (2.36M, the
# bucket). With prefetch off (the job's ``regather``) nothing is held and backward gathers all.
# The planner charges backward ``Workload.backward_share`` of the model; the schedule
# ([Note: step schedule] in planner/schedule.py) runs backward's first layers without a gather.


class Candidate(NamedTuple):
    name: str
    stock: bool  # stock DeepSpeed (its collectives) or zeropp_hier (ours)
    preset: FixedPreset  # stock ZeRO++ is the zeropp layout
    compression: CompressionConfig
    note: str = ""
    kept_gb: float | None = None  # memory.kept_shards_gb: a budget for the kept copies per GCD
    fit: bool = False  # the budget is whatever memory the rest leaves ([Note: kept levels])
    chunks: int | None = None  # pipeline.chunks; None: the planner's choice ([Note: busiest-link bound])


def _compression(
    preset: FixedPreset, override: str | None = None, block: int = 256, schemes: dict | None = None
) -> CompressionConfig:
    """The compression the runtime would resolve for this preset (same parser as the config)."""
    section: dict = {"block_size": block}
    if override is not None:
        section.update(weights=override, gradients=override)
    if schemes:
        section.update(schemes)
    return parse_compression(section, preset, "planner.compression")


def _frontier_fit() -> Candidate:
    """frontier with a kept level per layer, within what memory leaves ([Note: kept levels])."""
    return Candidate(
        "frontier/fit",
        False,
        "frontier",
        _compression("frontier"),
        "package copies for the layers that fit, node copies for the rest",
        fit=True,
    )


def _frontier_int8(kept_gb: float | None = None) -> Candidate:
    schemes = {"weights": {"node": "int8"}, "gradients": {"gpu": "int8", "node": "int8"}}
    return Candidate(
        "frontier/int8",
        False,
        "frontier",
        _compression("frontier", schemes=schemes),
        "int8 gradients over the network, no error feedback",
        kept_gb=kept_gb,
    )


def default_candidates(cluster: ClusterModel) -> list[Candidate]:
    none = _compression("zero3")
    if cluster.stock_quantization:
        zpp, note = _compression("zeropp"), "hpZ + qwZ int8 + qgZ int4"
    else:
        zpp, note = none, "hpZ only: DeepSpeed's qwZ/qgZ kernels do not run on this device"
    return [
        Candidate("ds-zero3", True, "zero3", none, "stock DeepSpeed ZeRO-3"),
        Candidate("ds-zeropp", True, "zeropp", zpp, f"stock DeepSpeed ZeRO++ ({note})"),
        Candidate("zero3", False, "zero3", none),
        Candidate("zeropp", False, "zeropp", _compression("zeropp")),
        Candidate("zeropp/none", False, "zeropp", _compression("zeropp", "none")),
        Candidate("frontier", False, "frontier", _compression("frontier")),
        Candidate("frontier/none", False, "frontier", _compression("frontier", "none")),
        _frontier_fit(),
        _frontier_int8(),
    ]


# --------------------------------------------------------------------------------------------
# collectives and their cost
class Collective(NamedTuple):
    phase: str  # forward_gather | backward_gather | grad_reduce
    op: str  # all_gather | reduce_scatter | all_to_all
    axes: tuple[str, ...]
    scheme: str
    send_elems: float  # elements this rank contributes (all_gather) or holds (reduce ops)
    quant_elems: float  # elements (de)quantized on this rank for this collective


def collectives(
    cand: Candidate,
    topo: Topology,
    params: float,
    lp: levels.LevelPlan | None = None,
    backward_share: float = 1.0,
) -> tuple[CommPlan, list[Collective]]:
    """The collectives one step issues, whole model at once (per-layer calls add only latency).

    Stock DeepSpeed runs the same plan shapes (zero3: flat; ZeRO++: flat forward, hpZ backward
    inside the node) but reduces gradients with one flat reduce-scatter unless qgZ is on. With a
    level plan ``lp`` (equal layers), each level's share of the layers takes its own backward.
    Backward gathers ``backward_share`` of the model ([Note: the turn])."""
    plan = make_plan(cand.preset, cand.compression, topo)
    w = topo.world_size
    out: list[Collective] = []
    fwd, enc = _gather(plan.forward, "forward_gather", topo, params / w, params, None)
    out += fwd
    shares: dict[tuple[str, ...] | None, float]  # the axes of a kept copy (None: none) -> share
    if plan.kept_axes is None:
        shares = {None: 1.0}
    elif lp is None:
        shares = {plan.kept_axes: 1.0}
    else:
        n = len(lp.levels)
        shares = {}
        for lvl, count in lp.counts().items():
            if count:
                shares[levels.LEVEL_AXES[lvl]] = count / n
    for axes, share in shares.items():
        share *= backward_share
        if axes is None:  # no kept copy: the forward's gather again
            out += [
                c._replace(phase="backward_gather", send_elems=c.send_elems * share, quant_elems=c.quant_elems * share)
                for c in fwd
            ]
            continue
        # the kept copy is cut from the forward's result, encoded if the forward quantized
        kept = share * params / w * topo.axes_size(axes)
        bwd, _ = _gather(plan.backward_for(axes), "backward_gather", topo, kept, share * params, enc)
        out += bwd
    buf = float(params)  # full gradient on every rank
    flat_stock = cand.stock and not any(h.scheme in ("int8", "int4") for h in plan.reduce)
    if flat_stock:
        out.append(Collective("grad_reduce", "reduce_scatter", AXES, "none", buf, 0.0))
    else:
        for hop in plan.reduce:
            k = topo.axes_size(hop.axes)
            q = buf * 2 if hop.scheme in ("int8", "int4") else 0.0
            out.append(Collective("grad_reduce", "all_to_all", hop.axes, hop.scheme, buf, q))
            buf /= k
    return plan, out


def _gather(hops, phase: str, topo: Topology, held: float, total: float, enc: str | None):
    """One gather's collectives and the scheme it ends encoded in. ``held``: elements this rank
    contributes to the first hop; ``total``: elements it ends with; ``enc``: the scheme the
    input is already encoded in (a kept copy). A gather quantizes once and later hops carry
    the encoded rows ([Note: quantize once per gather] in comm/collectives.py): their bytes are
    the encoding's, and the only other (de)quantization is the decode of ``total`` at the end."""
    out = []
    for i, hop in enumerate(hops):
        q = 0.0
        if enc is None and hop.scheme in ("int8", "int4"):
            enc, q = hop.scheme, held + total
        elif enc is not None and i == 0:
            q = total  # a kept encoded copy: decode at the end
        out.append(Collective(phase, "all_gather", hop.axes, enc or hop.scheme, held, q))
        held *= topo.axes_size(hop.axes)
    return out, enc


def bytes_per_elem(scheme: str, width: int, block: int) -> float:
    return {"int8": 1 + 4 / block, "int4": 0.5 + 4 / block, "fp16": 2, "bf16": 2}.get(scheme, width)


# link kinds in the order a collective's first messages reach them (nearest rank first): ties
# between tiers go to the first
KINDS = ("gcd", "gpu_out", "gpu_in", "node_out", "node_in")


class KindLoad(NamedTuple):
    per_link: float  # bytes on each link of this kind that the collective uses
    links: int  # links of this kind in the cluster that carry them


def _tier_of(kind: str) -> str:
    return kind.split("_")[0]


@functools.lru_cache(maxsize=1 << 12)  # ranking re-costs the same sums many times
def summed(x: float, n: int) -> float:
    """``x`` added ``n`` times, one addition after another: n * x, rounded as running sums round
    ([Note: link loads per tier]). Sequential, as numpy's ``add.accumulate`` is."""
    if n <= 2:
        return n * x  # exact: 0 + x and x + x do not round
    return float(np.add.accumulate(np.full(n, x))[-1])


def link_loads(coll: Collective, topo: Topology, library: str, payload: float) -> dict[str, KindLoad]:
    """Bytes on the links of each kind for one collective; ``payload`` = bytes of this rank's
    contribution (all_gather) or of its whole buffer (reduce ops).

    [Note: link loads per tier]
    Computed per link kind in closed form, not per pair of ranks (an all-to-all over all of
    Frontier would be 5.7e9 pairs). The planner's clusters place ranks in coordinate order, so
    every group of the collective has the same shape and every link of a kind carries the same
    bytes. A group spans ``k`` ranks, ``m_pkg`` of them in any one package and ``m_node`` in any
    one node (the group's extent along gcd, and along gpu and gcd). In rank order a group's
    members in one package, and in one node, are consecutive, so a ring crosses the boundary of
    each such block once each way. Per package (node) there are G / m_pkg (P*G / m_node) groups.

    * ring (all_gather, reduce_scatter), ``e`` bytes per ring edge: the package link carries the
      block's m_pkg - 1 inner edges (all m_pkg when the group is the package: the ring closes
      inside); a package's link out (and in) one edge per group, G / m_pkg * e; a node's link
      out (and in) P*G / m_node * e.
    * all-to-all, ``x = payload / k`` per ordered pair: the package link m_pkg(m_pkg-1) x; the
      package's link out G (k - m_pkg) x (each of its G ranks sends to every member outside
      the package); the node's link out P*G (k - m_node) x.

    Each figure is summed as a walk over the messages would sum it (``summed``: the same
    addition repeated, not one multiplication), so the planner's figures match such a walk's to
    the last bit and no printed figure moves at a rounding edge. tests/unit/test_planner.py
    checks these against a walk over every pair of ranks."""
    if not topo.is_identity_map:
        raise ValueError("planner.link_loads: the planner's topologies place ranks in coordinate order (no rank_map)")
    nodes, per_node, per_pkg = topo.dims
    axes = set(coll.axes)
    s_node = nodes if "node" in axes else 1
    s_gpu = per_node if "gpu" in axes else 1
    m_pkg = per_pkg if "gcd" in axes else 1
    m_node = s_gpu * m_pkg
    k = s_node * m_node
    if k < 2:
        return {}
    packages = nodes * per_node
    if coll.op == "all_to_all":
        unit = payload / k  # bytes per ordered pair
        count = {
            "gcd": m_pkg * (m_pkg - 1),
            "gpu": per_pkg * (k - m_pkg),
            "node": per_node * per_pkg * (k - m_node),
        }
    else:
        if coll.op == "all_gather":
            unit = (k - 1) * payload  # bytes per ring edge
        elif library == "gloo":  # gloo's reduce-scatter moves an all-reduce's bytes
            unit = 2 * (k - 1) / k * payload
        else:
            unit = (k - 1) / k * payload
        count = {
            "gcd": m_pkg - 1 + (k == m_pkg),
            "gpu": per_pkg // m_pkg if k > m_pkg else 0,
            "node": per_node * per_pkg // m_node if k > m_node else 0,
        }
    per_link = {tier: summed(unit, n) for tier, n in count.items()}
    links = {"gcd": packages, "gpu": packages, "node": nodes}
    out: dict[str, KindLoad] = {}
    for kind in KINDS:
        tier = _tier_of(kind)
        if per_link[tier] > 0:
            out[kind] = KindLoad(per_link[tier], links[tier])
    return out


def capacity(cluster: ClusterModel, kind: str) -> float:
    t = cluster.tiers
    if kind == "gcd":
        return cluster.gcds_per_gpu * t["gcd"].bandwidth
    if kind.startswith("gpu"):
        return cluster.gcds_per_gpu * t["gpu"].bandwidth
    return cluster.gcds_per_gpu * cluster.gpus_per_node * t["node"].bandwidth


class CollectiveCost(NamedTuple):
    coll: Collective
    seconds: float
    bottleneck: str  # tier of the busiest link
    tier_bytes: dict  # bytes this collective puts on each tier, whole cluster
    quant_seconds: float
    latency_seconds: float
    link_seconds: dict = {}  # bytes on each link kind / its capacity ([Note: busiest-link bound])
    flow_rate: float = 0.0  # one rank's throughput alone on its busiest link ([Note: shared links])


def collective_cost(coll: Collective, cluster: ClusterModel, width: int, block: int, calls: int) -> CollectiveCost:
    topo = cluster.topology
    payload = coll.send_elems * bytes_per_elem(coll.scheme, width, block)
    loads = link_loads(coll, topo, cluster.library, payload)
    seconds = {kind: load.per_link / (capacity(cluster, kind) * cluster.efficiency) for kind, load in loads.items()}
    worst = max(seconds.values(), default=0.0)
    # the busiest link's tier; links of two tiers busy alike (to rounding): the faster tier
    bottleneck = next((_tier_of(kd) for kd, sec in seconds.items() if sec >= worst * (1 - 1e-12)), coll.axes[0])
    tier_bytes: dict[str, float] = {t: 0.0 for t in TIERS}
    for kind in ("gcd", "gpu_out", "node_out"):
        if kind in loads:
            tier_bytes[_tier_of(kind)] += summed(loads[kind].per_link, loads[kind].links)
    tier_bytes["gpu"] -= tier_bytes["node"]  # package-out bytes that stay inside the node
    k = topo.axes_size(coll.axes)
    steps = (2 if coll.op == "reduce_scatter" and cluster.library == "gloo" else 1) * (k - 1)
    # one collective per hop, payload and scales together ([Note: one collective per hop])
    alpha = cluster.tiers[coll.axes[0]].latency * steps * calls
    quant = coll.quant_elems / (2 * cluster.quant_rate)
    # a hop's flows (one per rank) run at its busiest tier's per-GCD rate when alone
    flow = cluster.tiers[bottleneck].bandwidth * cluster.efficiency
    return CollectiveCost(coll, worst + alpha + quant, bottleneck, tier_bytes, quant, alpha, seconds, flow)


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
# issuing lane (NCCL) or serial issue (RCCL) the hops do not overlap: use ``sequential_time``.


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


def best_chunks(hop_s: Sequence[float], latency_s: Sequence[float] | None = None, max_chunks: int = 64) -> int:
    """The chunk count in 1..``max_chunks`` with the shortest ``pipelined_time`` (the smallest on
    a tie)."""
    return min(range(1, max_chunks + 1), key=lambda c: (pipelined_time(hop_s, c, latency_s), c))


# --------------------------------------------------------------------------------------------
# memory
# gradient staging ([Note: streamed gradient stages] in comm/reduce.py): the packed fp32
# rows of two buckets (the one in flight beside backward and the next being packed), plus, per
# streamed chunk, its reordering, stage layout, wire and receive buffers
STAGED_BUCKETS = 2
CHUNK_STAGING_COPIES = 4


class Memory(NamedTuple):
    parts: dict  # name -> bytes per GCD
    total: float
    fits: bool


def level_plan(cand: Candidate, cluster: ClusterModel, wl: Workload) -> levels.LevelPlan | None:
    """The kept level of each of the workload's (equal) layers under the candidate's budget."""
    if cand.kept_gb is None and not cand.fit:
        return None
    topo = cluster.topology
    if cand.kept_gb is not None:
        budget = cand.kept_gb * 1e9
    else:  # what the other parts leave
        budget = max(0.0, cluster.memory_per_gcd - sum(memory(cand, cluster, wl, kept=0.0).parts.values()))
    share = wl.params / wl.layers / topo.world_size
    layers = [(f"layer {i}", share) for i in range(wl.layers)]
    per_elem = levels.kept_bytes_per_elem(make_plan(cand.preset, cand.compression, topo), wl.weight_bytes)
    return levels.assign(layers, cand.preset, topo, per_elem, budget)


def pipeline_staging(wl: Workload, chunks: int, stages: int) -> float:
    """Bytes per GCD that ``chunks`` pipelined chunks hold beyond the unchunked jobs
    ([Note: busiest-link bound]; [Note: chunked gathers] in comm/gather.py): one more gathered
    bucket (the assembly copies the chunks into one buffer beside them), one more fp32 copy of a
    gradient bucket's rows (the chunks waiting between stages hold at most the rows together)
    and, per stage, one running chunk's staging copies. 0 for one chunk."""
    if chunks <= 1:
        return 0.0
    bucket = min(wl.reduce_bucket, wl.params)
    chunk = min(STREAM_CHUNK_ELEMS, bucket / chunks)
    return wl.weight_bytes * wl.largest_layer_params + 4 * bucket + 4 * CHUNK_STAGING_COPIES * stages * chunk


def memory(cand: Candidate, cluster: ClusterModel, wl: Workload, kept: float | None = None, chunks: int = 1) -> Memory:
    """Bytes per GCD by part; ``kept``: the kept copies' bytes (default: the preset's copy of
    every layer); ``chunks``: pipelined chunks per job (their extra staging, ``pipeline_staging``)."""
    w, m, b = cluster.world_size, wl.params, wl.weight_bytes
    parts = {"primary": b * m / w, "optimizer": wl.optimizer_bytes_per_param * m / w, "gradients": b * m / w}
    plan = make_plan(cand.preset, cand.compression, cluster.topology)
    if plan.kept_axes is not None:
        name = "secondary (node copy)" if cand.preset == "zeropp" else "tertiary (package copy)"
        if kept is None:
            kept = levels.kept_bytes_per_elem(plan, b) * m / w * cluster.topology.axes_size(plan.kept_axes)
        elif cand.kept_gb is not None or cand.fit:
            name = "kept copies (per-layer levels)"
        if kept:
            parts[name] = kept
    # error feedback keeps, per compressed stage that feeds back, a residual the size of that
    # stage's send buffer: the rank's gradient rows not yet reduced by earlier stages
    residual_elems, rows = 0.0, w
    for hop in plan.reduce:
        if hop.error_feedback:
            residual_elems += m / w * rows
        rows //= cluster.topology.axes_size(hop.axes)
    if residual_elems:
        parts["error-feedback residuals"] = wl.residual_bytes * residual_elems
    bucket = min(wl.reduce_bucket, m)
    parts["gradient staging"] = 4 * (STAGED_BUCKETS * bucket + CHUNK_STAGING_COPIES * min(STREAM_CHUNK_ELEMS, bucket))
    parts["gathered layers"] = 2 * b * wl.largest_layer_params + 4 * wl.largest_layer_params
    if chunks > 1:
        parts["pipeline staging"] = pipeline_staging(wl, chunks, len(plan.reduce))
    parts["activations"] = wl.activation_bytes
    total = sum(parts.values())
    return Memory(parts, total, total <= cluster.memory_per_gcd)


# --------------------------------------------------------------------------------------------
# prediction
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
    # chunks per job chosen (or given), and communication with the jobs pipelined in that many
    link_s: dict = field(default_factory=dict)
    chunks: int = 1
    pipelined_comm_s: float = 0.0

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


def predict(cand: Candidate, cluster: ClusterModel, wl: Workload) -> Prediction:
    topo = cluster.topology
    lp = level_plan(cand, cluster, wl)
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
        cost = collective_cost(c, cluster, wl.weight_bytes, cand.compression.block_size, calls)
        costs.append(cost)
        phase_s[c.phase] += cost.seconds
        tier_s[cost.bottleneck] += cost.seconds
        for t in TIERS:
            tier_bytes[t] += cost.tier_bytes[t]
        for kind, sec in cost.link_seconds.items():
            link_s[kind] = link_s.get(kind, 0.0) + sec
    jobs = phase_jobs(costs, wl)
    chunks = cand.chunks if cand.chunks is not None else choose_chunks(jobs, cluster)
    pipelined = max(max(link_s.values(), default=0.0), _jobs_time(jobs, chunks))
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
    )


# [Note: busiest-link bound]
# With lanes (gloo), hops of different jobs and, pipelined, of one job's chunks run on their links
# at once, so a step's communication tends to its busiest link's time: the bytes every collective
# puts on that link over its capacity (``Prediction.link_s``, per link kind; a package's links
# out and in, ``gpu_out``/``gpu_in``, carry the gpu tier's bytes and the node tier's, since a
# node's traffic leaves through its packages). No schedule beats that bound; a job's hops still
# run in sequence within a chunk, so the estimate is the larger of the bound and every phase's
# jobs pipelined in ``chunks`` chunks ([Note: pipelined hops]): ``pipelined_comm_s``.
# ``choose_chunks`` takes the chunk count that minimises the pipelined jobs (each chunk pays
# every hop's latency again); with one issuing lane (NCCL) or serial issue (RCCL) nothing
# overlaps and chunking only adds latency, so there it is 1. ``auto`` ranks by the bound where
# lanes run (``rank_key``), so compression is chosen for the busiest link: int4 gradients on the
# package links when those bind, fewer in-package bytes when the package link does (flat links).
# The chunks' extra staging (``pipeline_staging``) enters the memory check.


class PhaseJob(NamedTuple):
    phase: str
    hop_s: tuple[float, ...]  # each hop's time for one job (bandwidth and quantization)
    latency_s: tuple[float, ...]  # each hop's fixed cost per collective
    calls: int  # jobs of this phase per step
    lanes: tuple[tuple[str, ...], ...] = ()  # each hop's group (its axes): the executor's lane
    # each hop's (link kind, seconds busy) for one job, and its flows' rate ([Note: shared links])
    links: tuple[tuple[tuple[str, float], ...], ...] = ()
    rates: tuple[float, ...] = ()


def phase_jobs(costs: Sequence[CollectiveCost], wl: Workload) -> list[PhaseJob]:
    """The step's jobs per phase: one gather per parameter group and pass, one job per gradient
    bucket, each running its phase's hops in order."""
    out = []
    for phase in PHASES:
        cs = [c for c in costs if c.coll.phase == phase]
        if not cs:
            continue
        calls = wl.gathers_per_pass if phase != "grad_reduce" else max(1, math.ceil(wl.params / wl.reduce_bucket))
        out.append(
            PhaseJob(
                phase,
                tuple((c.seconds - c.latency_seconds) / calls for c in cs),
                tuple(c.latency_seconds / calls for c in cs),
                calls,
                tuple(c.coll.axes for c in cs),
                tuple(tuple((k, sec / calls) for k, sec in c.link_seconds.items()) for c in cs),
                tuple(c.flow_rate for c in cs),
            )
        )
    return out


def _jobs_time(jobs: Sequence[PhaseJob], chunks: int) -> float:
    return sum(j.calls * pipelined_time(j.hop_s, chunks, j.latency_s) for j in jobs)


def choose_chunks(jobs: Sequence[PhaseJob], cluster: ClusterModel, max_chunks: int = MAX_PIPELINE_CHUNKS) -> int:
    """[Note: busiest-link bound]: the chunk count (1..``max_chunks``, smallest on a tie) that
    minimises the step's pipelined jobs where lanes overlap hops (gloo); 1 elsewhere."""
    if cluster.library != "gloo" or not jobs:
        return 1
    return min(range(1, max_chunks + 1), key=lambda c: (_jobs_time(jobs, c), c))


def rank_key(p: Prediction, cluster: ClusterModel) -> float:
    """What ``auto`` minimises: the pipelined estimate, at least the busiest link's time, where
    lanes overlap hops (gloo); the collectives in sequence where one lane issues them."""
    return p.pipelined_comm_s if cluster.library == "gloo" else p.comm_s


def auto_candidates(kept_gb: float | None = None, chunks: int | None = None) -> list[Candidate]:
    """What ``"preset": "auto"`` chooses among: our presets with the policy's compression (no
    int4 weights: the policy never picks them unasked), frontier with int8 gradients on both
    hops (for links where the package links do not bind; int4 on the node hop alone costs
    accuracy, [Note: preset compression defaults]), and frontier with
    per-layer kept levels (within ``kept_gb`` when the config gives a budget, else within what
    memory leaves). ``chunks``: pipeline chunks, None for the planner's choice
    ([Note: busiest-link bound]); 1 where the job's hops do not run on lanes."""
    cands = [
        Candidate("zero3", False, "zero3", _compression("zero3")),
        Candidate("zeropp", False, "zeropp", _compression("zeropp"), kept_gb=kept_gb),
        Candidate("frontier", False, "frontier", _compression("frontier"), kept_gb=kept_gb),
        _frontier_int8(kept_gb),
    ] + (
        []
        if kept_gb is not None  # the budget already applies to every candidate above
        else [_frontier_fit()]
    )
    return [c._replace(chunks=chunks) for c in cands]


def rank(cluster: ClusterModel, wl: Workload, candidates: Sequence[Candidate] | None = None) -> list[Prediction]:
    """Every candidate, fitting ones first, fastest first."""
    preds = [predict(c, cluster, wl) for c in (candidates or default_candidates(cluster))]
    return sorted(preds, key=lambda p: (not p.memory.fits, p.step_s))


def rank_auto(cluster: ClusterModel, wl: Workload, candidates: Sequence[Candidate]) -> list[Prediction]:
    """``auto``'s ranking: fitting first, then by ``rank_key`` ([Note: busiest-link bound])."""
    preds = [predict(c, cluster, wl) for c in candidates]
    return sorted(preds, key=lambda p: (not p.memory.fits, rank_key(p, cluster)))


def explain(preds: Sequence[Prediction], cluster: ClusterModel) -> list[str]:
    """Plain-language reasons: the choice, the tier that dominates it, what does not fit."""
    lines = []
    fitting = [p for p in preds if p.memory.fits]
    if not fitting:
        lines.append(
            f"nothing fits in {cluster.memory_per_gcd / GB:.0f} GB per GCD: add nodes (primary, "
            "optimizer and gradient partitions shrink with the world) or reduce activations"
        )
    else:
        best = fitting[0]
        comm_share = best.comm_s / best.step_s
        lines.append(
            f"best: {best.candidate.name} at {best.step_s:.3g} s/step ({comm_share:.0%} communication; "
            f"the {best.dominant_tier} tier takes {best.tier_s[best.dominant_tier]:.3g} s of it)"
        )
        for p in fitting[1:3]:
            lines.append(
                f"  {p.candidate.name}: {p.step_s / best.step_s:.2f}x slower; its {p.dominant_tier} "
                f"tier takes {p.tier_s[p.dominant_tier]:.3g} s, node bytes/step "
                f"{fmt_bytes(p.tier_bytes['node'])} vs {fmt_bytes(best.tier_bytes['node'])}"
            )
        if comm_share < 0.2:
            lines.append(
                "  compute dominates: layouts differ little here; hierarchy pays off with fewer "
                "tokens per GCD or slower links (the 'no speedup from ZeRO++' case)"
            )
    for p in preds:
        if not p.memory.fits:
            big = max(p.memory.parts, key=lambda part: p.memory.parts[part])
            lines.append(
                f"does not fit: {p.candidate.name} needs {p.memory.total / GB:.1f} GB per GCD of "
                f"{cluster.memory_per_gcd / GB:.0f} GB; largest part: {big} "
                f"{p.memory.parts[big] / GB:.1f} GB. " + _relax(p)
            )
    return lines


def level_lines(p: Prediction) -> list[str]:
    """A budgeted candidate's kept level per layer and its memory per GCD by part."""
    lp = p.kept_levels
    if lp is None:
        return []
    assert lp.budget_bytes is not None  # level_plan always gives assign a budget
    budget = "what the rest leaves" if p.candidate.fit else f"{p.candidate.kept_gb:g} GB"
    lines = [
        f"{p.candidate.name}: kept copies within {budget} per GCD ({lp.budget_bytes / GB:.1f} GB), "
        f"{lp.kept_bytes / GB:.1f} GB used; {p.candidate.note}".rstrip("; "),
        "",
        "| layers | kept level | backward gathers over |",
        "|---|---|---|",
    ]
    over = {
        "package": "gcd (in the package)",
        "node": "gpu, gcd (in the node)",
        "none": "node, gpu, gcd (the network)",
    }
    for run, lvl in levels.summarize(lp, list(lp.levels)):
        lines.append(f"| {run} | {lvl} | {over[lvl]} |")
    lines += ["", "| memory part | GB per GCD |", "|---|---|"]
    lines += [f"| {k} | {v / GB:.2f} |" for k, v in p.memory.parts.items()]
    lines.append(f"| total | {p.memory.total / GB:.2f} ({'fits' if p.memory.fits else 'does not fit'}) |")
    return lines


def _relax(p: Prediction) -> str:
    if p.candidate.preset == "frontier":
        return (
            'Keep package copies only for the layers that fit ("memory": {"kept_shards_gb": ...}, '
            "the frontier/fit row), relax the kept shard to the node (preset zeropp: a node-sized "
            "secondary shard, 1/4 of it on Frontier), or drop it (zero3)."
        )
    if p.candidate.preset == "zeropp":
        return "Drop the secondary shard (zero3), or add nodes."
    return "Add nodes, or enable activation checkpointing / optimizer offload."


# --------------------------------------------------------------------------------------------
# built-in clusters
def frontier(nodes: int = 48) -> ClusterModel:
    """Frontier as docs/design.md#hardware-tiers states it (per-GCD, per-direction link rates); latencies and the
    achieved FLOP rate are assumptions, printed with every prediction."""
    return ClusterModel(
        name=f"Frontier ({nodes} nodes, {nodes * 8} GCDs)",
        nodes=nodes,
        gpus_per_node=4,
        gcds_per_gpu=2,
        tiers={"gcd": TierLink(200 * GB, 5e-6), "gpu": TierLink(50 * GB, 10e-6), "node": TierLink(12.5 * GB, 20e-6)},
        memory_per_gcd=64 * GB,
        device_flops=70e12,
        quant_rate=2e11,
        library="rccl",
        source="docs/design.md#hardware-tiers link rates; assumed: 70 TFLOP/s achieved per GCD (~37% of the "
        "MI250X GCD's 191.5 bf16 peak), alpha 5/10/20 us, no compute/communication overlap",
    )


# Exposed fractions per phase on the emulated cluster with DeepSpeed's prefetch on
# ([Note: cost model]); with prefetch off every phase is exposed.
EMULATED_EXPOSED = {"forward_gather": 1.0, "backward_gather": 0.0, "grad_reduce": 0.5}


def emulated(
    node_mbit: float = 10.0,
    nodes: int = 2,
    gpus_per_node: int = 2,
    gcds_per_gpu: int = 2,
    efficiency: float = 0.75,
    compute_s: float | None = None,
    quant_rate: float = 2e7,
    device_flops: float = 1.5e9,
    exposed: Mapping[str, float] | None = None,
) -> ClusterModel:
    """The emulated cluster of benchmarks/cluster (tbf rates in Frontier's 16:4:1 per-GCD ratio,
    gloo over TCP). ``efficiency``: gloo all-gathers got ~75% of the tbf rate on the node and
    gpu tiers in ``zeropp-hier probe`` runs here (62-67% with other settings,
    docs/benchmarks.md#emulated-cluster-notes);
    probed tiers replace it. Compute on 2 shared CPU cores is a
    measurement (``compute_s``) whenever one is available."""
    bps = node_mbit * 1e6 / 8
    return ClusterModel(
        name=f"emulated {nodes}x{gpus_per_node}x{gcds_per_gpu} (node {node_mbit:g} Mbit/s per GCD)",
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        gcds_per_gpu=gcds_per_gpu,
        tiers={"gcd": TierLink(16 * bps, 2e-4), "gpu": TierLink(4 * bps, 5e-4), "node": TierLink(bps, 1e-3)},
        memory_per_gcd=24 * GB / (nodes * gpus_per_node * gcds_per_gpu),
        device_flops=device_flops,
        quant_rate=quant_rate,
        library="gloo",
        efficiency=efficiency,
        stock_quantization=False,
        compute_s=compute_s,
        source="tbf rates of benchmarks/cluster; gloo algorithms measured there"
        + ("; overlap as measured with prefetch on" if exposed else ""),
        exposed=dict(exposed or {}),
    )


def with_probed_tiers(cluster: ClusterModel, probe: Mapping) -> ClusterModel:
    """Replace tier bandwidths and latencies by ``zeropp-hier probe`` output (efficiency 1:
    probed rates are what collectives achieve)."""
    tiers = dict(cluster.tiers)
    for t, v in probe["tiers"].items():
        tiers[t] = TierLink(float(v["bandwidth"]), float(v["latency"]))
    return replace(cluster, tiers=tiers, efficiency=1.0, source=cluster.source + "; tiers probed")


def ratio(preds: Iterable[Prediction], slow: str, fast: str) -> float:
    by = {p.candidate.name: p for p in preds}
    return by[slow].step_s / by[fast].step_s


def table(preds: Sequence[Prediction]) -> list[str]:
    rows = [
        "| rank | configuration | step s | compute s | fwd s | bwd s | grad s | node bytes/step | "
        "gpu bytes/step | dominant tier | memory/GCD | fits |",
        "|" + "---|" * 12,
    ]
    for i, p in enumerate(preds, 1):
        ph = p.phase_s
        rows.append(
            f"| {i} | {p.candidate.name} | {p.step_s:.3g} | {p.compute_s:.3g} | "
            f"{ph['forward_gather']:.3g} | {ph['backward_gather']:.3g} | {ph['grad_reduce']:.3g} | "
            f"{fmt_bytes(p.tier_bytes['node'])} | {fmt_bytes(p.tier_bytes['gpu'])} | "
            f"{p.dominant_tier} | {p.memory.total / GB:.1f} GB | {'yes' if p.memory.fits else 'NO'} |"
        )
    return rows


__all__ = [
    "TierLink",
    "ClusterModel",
    "Workload",
    "Candidate",
    "Prediction",
    "gpt_workload",
    "default_candidates",
    "predict",
    "rank",
    "explain",
    "frontier",
    "emulated",
    "with_probed_tiers",
    "ratio",
    "table",
    "collectives",
    "link_loads",
    "memory",
    "pipeline_staging",
    "choose_chunks",
    "rank_auto",
]
