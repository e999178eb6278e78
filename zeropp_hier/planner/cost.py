"""The collectives one step issues and their time on the cluster's links.

Pure: no torch.distributed, no processes. The collectives a configuration issues come from
``plan.make_plan`` — the very plan the runtime executes — so prediction and implementation
cannot drift apart.

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
``max over links ((bytes + messages * overhead) on the link / (capacity * efficiency)) + latency * steps``:

* links are the resources of the machine: the in-package link of each package (capacity
  gcds_per_gpu * gcd rate), each package's links to the rest of its node (out and in,
  gcds_per_gpu * gpu rate) and each node's network links (out and in, gcds_per_node * node rate).
  Rates are per GCD and per direction — what one GCD gets when every GCD of its enclosure sends,
  which is how docs/design.md#hardware-tiers states Frontier's numbers and how ``zeropp-hier probe`` measures them.
* the bytes on each link follow the algorithm the library uses: ring all-gather and
  reduce-scatter over the group in rank order (NCCL/RCCL; gloo's reduce-scatter sends as much as
  a ring all-reduce, measured on the emulated cluster), direct all-to-all. A flat ring crosses a
  slow link once per enclosure and so is already frugal with node bytes; a direct exchange sends
  a copy per receiving rank. ``comm_stats``' link view counts the same
  messages per rank ([Note: bytes per link] in core/wire.py); its payload view does not.
* the messages on each link are counted by the same model (``wire.messages``: a gloo ring step
  is two messages, an NCCL/RCCL one; a direct exchange and a tick transfer one per peer), once
  per call and chunk; ``overhead`` is the transport's framing per message
  (``ClusterModel.message_overhead_bytes``, [Note: per-message framing] in clusters.py; 0 on
  Frontier). Like latency it is paid again by every chunk (``PhaseJob.frame_s`` in pipeline.py).
* quantized hops add (de)quantization time at the device's rate; payloads are counted at their
  packed size plus one fp32 scale per block.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from ..core import levels, wire
from ..core.plan import CommPlan, make_plan
from ..core.topology import Topology
from ..core.vocab import AXES, TIERS
from .candidates import Candidate
from .clusters import ClusterModel


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
    Backward gathers ``backward_share`` of the model ([Note: the turn] in workload.py)."""
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
    messages: int = 0  # messages on each such link ([Note: per-message framing] in clusters.py)


def _tier_of(kind: str) -> str:
    return kind.split("_")[0]


@functools.lru_cache(maxsize=1 << 12)  # ranking re-costs the same sums many times
def summed(x: float, n: int) -> float:
    """``x`` added ``n`` times, one addition after another: n * x, rounded as running sums round
    ([Note: link loads per tier]). Sequential, as numpy's ``add.accumulate`` is."""
    if n <= 2:
        return n * x  # exact: 0 + x and x + x do not round
    return float(np.add.accumulate(np.full(n, x))[-1])


def link_loads(
    coll: Collective, topo: Topology, library: str, payload: float, ticks: bool = False
) -> dict[str, KindLoad]:
    """Bytes on the links of each kind for one collective; ``payload`` = bytes of this rank's
    contribution (all_gather) or of its whole buffer (reduce ops); ``ticks``: moved by the tick
    mode's point-to-point transfers, direct ([Note: bytes per link] in core/wire.py).

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
    * direct (all-to-all, ``x = payload / k`` per ordered pair; a tick's gather, ``x =
      payload``): the package link m_pkg(m_pkg-1) x; the package's link out G (k - m_pkg) x
      (each of its G ranks sends to every member outside the package); the node's link out
      P*G (k - m_node) x.

    Each figure is summed as a walk over the messages would sum it (``summed``: the same
    addition repeated, not one multiplication), so the planner's figures match such a walk's to
    the last bit and no printed figure moves at a rounding edge. The messages on a link are its
    edges (pairs) times each edge's messages (``wire.messages``, the count ``comm_stats``
    keeps). tests/unit/test_planner.py and tests/unit/test_wire.py check these against a walk
    over every pair of ranks."""
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
    # the per-message amounts are the runtime's (core/wire.py), summed here in closed form
    algorithm = wire.algorithm_of(coll.op, library, ticks)
    per_edge = wire.messages(algorithm, library, k)  # messages per (sender, receiver) pair
    if algorithm == "direct":
        # ``x`` per ordered pair: a block per peer (all_to_all), the whole shard to each peer
        # (a tick's gather)
        unit = wire.edge_bytes(coll.op, algorithm, k, payload / k if coll.op == "all_to_all" else payload)
        count = {
            "gcd": m_pkg * (m_pkg - 1),
            "gpu": per_pkg * (k - m_pkg),
            "node": per_node * per_pkg * (k - m_node),
        }
    else:
        unit = wire.edge_bytes(coll.op, algorithm, k, payload)  # bytes per ring edge
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
            out[kind] = KindLoad(per_link[tier], links[tier], count[tier] * per_edge)
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
    # the fixed cost of one exchange step, all calls: what a tick pays for this hop, whose rows
    # go to every member at once in one grouped call ([Note: tick latency] in pipeline.py)
    step_latency_seconds: float = 0.0
    # each link kind's seconds on the messages' framing, all calls, one chunk each ([Note:
    # per-message framing] in clusters.py): paid again by every chunk, as latency is
    frame_link_seconds: dict = {}
    frame_seconds: float = 0.0  # the busiest link's part of ``seconds`` that is framing
    tier_messages: dict = {}  # messages this collective puts on each tier, all calls, one chunk each


def collective_cost(
    coll: Collective, cluster: ClusterModel, width: int, block: int, calls: int, ticks: bool = False
) -> CollectiveCost:
    """``ticks``: the tick mode moves the collective, as point-to-point transfers."""
    topo = cluster.topology
    payload = coll.send_elems * bytes_per_elem(coll.scheme, width, block)
    loads = link_loads(coll, topo, cluster.library, payload, ticks)
    seconds = {kind: load.per_link / (capacity(cluster, kind) * cluster.efficiency) for kind, load in loads.items()}
    # (bytes + messages x overhead) / rate: the framing of every call's messages, one chunk each
    frames = {
        kind: load.messages * calls * cluster.message_overhead_bytes / (capacity(cluster, kind) * cluster.efficiency)
        for kind, load in loads.items()
    }
    busy = {kind: sec + frames[kind] for kind, sec in seconds.items()}
    worst = max(busy.values(), default=0.0)
    # the busiest link's tier; links of two tiers busy alike (to rounding): the faster tier
    worst_kind = next((kd for kd, sec in busy.items() if sec >= worst * (1 - 1e-12)), None)
    bottleneck = _tier_of(worst_kind) if worst_kind is not None else coll.axes[0]
    tier_bytes: dict[str, float] = {t: 0.0 for t in TIERS}
    for kind in ("gcd", "gpu_out", "node_out"):
        if kind in loads:
            tier_bytes[_tier_of(kind)] += summed(loads[kind].per_link, loads[kind].links)
    tier_bytes["gpu"] -= tier_bytes["node"]  # package-out bytes that stay inside the node
    tier_messages: dict[str, int] = {t: 0 for t in TIERS}  # counted as tier_bytes is: comm_stats' link_messages
    for kind in ("gcd", "gpu_out", "node_out"):
        if kind in loads:
            tier_messages[_tier_of(kind)] += loads[kind].messages * loads[kind].links * calls
    tier_messages["gpu"] -= tier_messages["node"]
    k = topo.axes_size(coll.axes)
    steps = (2 if coll.op == "reduce_scatter" and cluster.library == "gloo" else 1) * (k - 1)
    # one collective per hop, payload and scales together ([Note: one collective per hop])
    alpha = cluster.tiers[coll.axes[0]].latency * steps * calls
    quant = coll.quant_elems / (2 * cluster.quant_rate)
    # a hop's flows (one per rank) run at its busiest tier's per-GCD rate when alone
    flow = cluster.tiers[bottleneck].bandwidth * cluster.efficiency
    step_alpha = cluster.tiers[coll.axes[0]].latency * calls
    frame = frames[worst_kind] if worst_kind is not None else 0.0
    return CollectiveCost(
        coll,
        worst + alpha + quant,
        bottleneck,
        tier_bytes,
        quant,
        alpha,
        seconds,
        flow,
        step_alpha,
        frames,
        frame,
        tier_messages,
    )
