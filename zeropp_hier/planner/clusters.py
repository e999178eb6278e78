"""The clusters the planner models: per-GCD link rates and latencies per tier, memory per GCD,
the device's rates, and which collective library runs. Two built in (``frontier``, ``emulated``),
and ``with_probed_tiers`` for rates that ``zeropp-hier probe`` measured. Pure data."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Mapping, TypedDict

from ..core.topology import Topology

GB = 1e9


@dataclass(frozen=True)
class TierLink:
    bandwidth: float  # bytes/s per GCD per direction
    latency: float  # seconds per algorithm step (alpha)


# the issue modes the planner models ([Note: step schedule] in schedule.py; comm/issue.py runs them)
ISSUE_MODES = ("lanes", "one_lane", "ticks")

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
    # fraction of each phase's communication left exposed by overlap ([Note: cost model] in cost.py);
    # phases not named are fully exposed
    exposed: Mapping[str, float] = field(default_factory=dict)
    # who issues the hop collectives ([Note: step schedule] in schedule.py): "lanes" (a thread
    # per hop group), "one_lane" (one thread, hop after hop) or "ticks", for every candidate;
    # None: what ``overlap`` true resolves to for ``library`` and each candidate's plan
    # (ranking.issue_mode_of: lanes on gloo; on NCCL/RCCL ticks where every hop spans one tier,
    # one lane otherwise: comm/issue.py)
    issue_mode: str | None = None
    # how the tick mode runs each hop (pipeline.hop_steps): "auto", "direct" or "log" ([Note:
    # log-step hops] in comm/tick/plan.py)
    hop_steps: str = "auto"
    # bytes the transport puts on a link per message beside its payload ([Note: per-message
    # framing]); 0: framing not modelled
    message_overhead_bytes: float = 0.0

    def __post_init__(self):
        ovh = self.message_overhead_bytes
        if isinstance(ovh, bool) or not isinstance(ovh, (int, float)) or not math.isfinite(ovh) or ovh < 0:
            raise ValueError(
                f"ClusterModel.message_overhead_bytes = {ovh!r}: give the bytes a link carries per message "
                "beside its payload, a finite number >= 0 (0 where the framing is not modelled)"
            )
        if self.issue_mode not in (None, *ISSUE_MODES):
            raise ValueError(
                f"ClusterModel.issue_mode = {self.issue_mode!r}: use one of {list(ISSUE_MODES)}, or None for "
                f"the default of library {self.library!r}"
            )
        for phase, e in self.exposed.items():
            if phase not in PHASES or not 0.0 <= e <= 1.0:
                raise ValueError(
                    f"ClusterModel.exposed[{phase!r}] = {e!r}: give a fraction in [0, 1] for a phase of {PHASES}"
                )

    @property
    def mode(self) -> str:
        """``issue_mode``, or the library's default where no plan decides it: lanes on gloo,
        one lane on NCCL/RCCL (stock DeepSpeed's collectives; ``ranking.issue_mode_of``)."""
        if self.issue_mode is not None:
            return self.issue_mode
        return "lanes" if self.library == "gloo" else "one_lane"

    @property
    def topology(self) -> Topology:
        return _topology(self.nodes, self.gpus_per_node, self.gcds_per_gpu)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node * self.gcds_per_gpu


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
        # RCCL's per-message cost is time (alpha), not link bytes: [Note: per-message framing]
        message_overhead_bytes=0.0,
    )


# [Note: per-message framing]
# A link carries more than the payload: each message brings the transport's framing. On the
# emulated cluster (gloo over TCP on veth links) that is gloo's three 48-byte op preambles per
# message (benchmarks/compare/wire_links.py), the Ethernet/IP/TCP headers of its segments and the
# receiver's ACKs. Interface counters against ``comm_stats``' link view over the same steps
# (benchmarks/results/wire_links_8x1x2.json and wire_links_2x4x2.json, links unshaped) put the
# excess at 353-469 bytes per message on every link class with traffic, for both presets, at
# messages of 2.7-17 KB: about 4.5 packets per message whatever its size, so the excess goes
# with the message count, not the bytes (a fit with a per-byte term finds that term ~0).
# ``EMULATED_MESSAGE_OVERHEAD`` is the excess over every message of both files
# (``wire_links.message_overhead``; tests/unit/test_wire.py re-derives it). The tbf shapes what
# the interface carries, so the planner charges a link ``(bytes + messages x overhead) / rate``
# ([Note: cost model] in cost.py), the messages counted by the model that counts the bytes
# (core/wire.messages). Frontier: 0. Slingshot/libfabric framing per message (a few tens of
# bytes against RCCL's chunks of hundreds of KB) is not modelled; RCCL's fixed cost per message
# is time, which the tiers' alpha and the tick rounds already price.
EMULATED_MESSAGE_OVERHEAD = 418.0


# Exposed fractions per phase on the emulated cluster with DeepSpeed's prefetch on
# ([Note: cost model] in cost.py); with prefetch off every phase is exposed.
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
    message_overhead_bytes: float = EMULATED_MESSAGE_OVERHEAD,
) -> ClusterModel:
    """The emulated cluster of benchmarks/cluster (tbf rates in Frontier's 16:4:1 per-GCD ratio,
    gloo over TCP). ``efficiency``: gloo all-gathers got ~75% of the tbf rate on the node and
    gpu tiers in early ``zeropp-hier probe`` runs here (the probes of the committed runs read 88-95%,
    docs/benchmarks.md#emulated-cluster-notes);
    probed tiers replace it. Compute on 2 shared CPU cores is a
    measurement (``compute_s``) whenever one is available. ``message_overhead_bytes``: gloo's
    and TCP's framing per message ([Note: per-message framing])."""
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
        message_overhead_bytes=message_overhead_bytes,
    )


class ProbedTier(TypedDict):
    bandwidth: float
    latency: float


class ProbedTiers(TypedDict):
    """What ``with_probed_tiers`` reads of ``zeropp-hier probe`` output: each tier's rates."""

    tiers: Mapping[str, ProbedTier]


def with_probed_tiers(cluster: ClusterModel, probe: ProbedTiers) -> ClusterModel:
    """Replace tier bandwidths and latencies by ``zeropp-hier probe`` output (efficiency 1:
    probed rates are what collectives achieve)."""
    tiers = dict(cluster.tiers)
    for t, v in probe["tiers"].items():
        tiers[t] = TierLink(float(v["bandwidth"]), float(v["latency"]))
    return replace(cluster, tiers=tiers, efficiency=1.0, source=cluster.source + "; tiers probed")
