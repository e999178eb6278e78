"""Which collectives each preset issues: pure data built from a config and a topology.

A *hop* is one collective over the ranks that differ only along some axes (see
``Topology.peers``). The traffic of a hop crosses the slowest tier among its axes, so that
tier's compression scheme applies to it ([Note: hop compression]).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from .policy import (
    DEFAULT_BLOCK_SIZE,
    CompressionConfig,
    Scheme,
    TierBlocks,
    TierFlags,
    TierRotations,
    TierSchemes,
    every_tier,
)
from .topology import Topology, normalize_axes
from .vocab import AXES

# elements (all rows together) of one streamed chunk of a gradient bucket ([Note: streamed
# gradient stages] in comm/reduce.py): 64 MB per fp32 staging buffer
STREAM_CHUNK_ELEMS = 1 << 24

# [Note: hop compression]
# A flat hop (ZeRO++'s world gather, or its intra-node gradient stage) spans several tiers and
# its messages go over every link among them; its speed is set by the slowest one, so that
# tier's scheme is the one that pays off. The canonical axis order lists the slowest first.


class Hop(NamedTuple):
    axes: tuple[str, ...]  # canonical order
    scheme: Scheme
    block_size: int = DEFAULT_BLOCK_SIZE  # of the hop's tier
    error_feedback: bool = False  # gradient stages only ([Note: error feedback])
    rotate: int = 0  # Hadamard rotation size of a quantized hop, 0 = off ([Note: rotation policy])

    @property
    def tier(self) -> str:
        return self.axes[0]


class CommPlan(NamedTuple):
    preset: str
    forward: tuple[Hop, ...]  # gather of the primary shard, first hop first
    kept_axes: tuple[str, ...] | None  # axes the kept (secondary/tertiary) shard spans
    backward: tuple[Hop, ...]  # gather from the kept shard
    reduce: tuple[Hop, ...]  # gradient reduce-scatter stages, first stage first
    block_size: int  # the default; each hop carries its tier's own
    # backward hops from each kept level the preset allows, its own level first ([Note: kept
    # levels] in core/levels.py); ``kept_axes``/``backward`` are the first
    by_level: tuple[tuple[tuple[str, ...], tuple[Hop, ...]], ...] = ()

    def backward_for(self, kept_axes: tuple[str, ...]) -> tuple[Hop, ...]:
        for axes, hops in self.by_level:
            if axes == kept_axes:
                return hops
        raise KeyError(f"preset {self.preset} keeps no copy spanning {kept_axes}")


def _hops(
    topo: Topology,
    groups: Sequence[tuple[str, ...]],
    schemes: TierSchemes,
    blocks: TierBlocks,
    rotations: TierRotations,
    feedback: TierFlags = every_tier(False),
) -> tuple[Hop, ...]:
    out = []
    for axes in groups:
        axes = normalize_axes(axes)
        if topo.axes_size(axes) > 1:  # a hop over one rank moves nothing
            tier = axes[0]
            scheme = schemes.of(tier)
            out.append(Hop(axes, scheme, blocks.of(tier), feedback.of(tier) and scheme != "none", rotations.of(tier)))
    return tuple(out)


def make_plan(preset: str, compression: CompressionConfig, topo: Topology) -> CommPlan:
    c = compression
    alt: list = []  # other kept levels: (kept axes, backward hops)
    fwd: list[tuple[str, ...]]
    bwd: list[tuple[str, ...]]
    red: list[tuple[str, ...]]
    kept: tuple[str, ...] | None
    if preset == "zero3":
        fwd, kept, bwd, red = [AXES], None, [], [AXES]
    elif preset == "zeropp":
        # ZeRO++: flat gather over the world; keep a shard spanning the nodes (hpZ secondary,
        # so each node holds one full copy); backward gathers inside the node only. Gradients:
        # intra-node stage, then inter-node stage (qgZ).
        fwd, kept, bwd, red = [AXES], ("node",), [("gpu", "gcd")], [("gpu", "gcd"), ("node",)]
        # a layer given a package copy under a memory budget re-gathers inside the package
        alt = [(("node", "gpu"), [("gcd",)])]
    elif preset == "frontier":
        # Forward gathers hop by hop, slowest link first, so the inter-node hop carries only
        # this rank's 1/W share; keep the shard spanning node and gpu (each package holds one
        # full copy), so backward re-gathers over the in-package link alone. Gradients are
        # reduced fastest link first, so each slower hop carries a smaller, already-summed buffer.
        fwd = [("node",), ("gpu",), ("gcd",)]
        kept, bwd = ("node", "gpu"), [("gcd",)]
        red = [("gcd",), ("gpu",), ("node",)]
        # a layer left with a node copy under a memory budget re-gathers hop by hop too
        alt = [(("node",), [("gpu",), ("gcd",)])]
    else:
        raise ValueError(f"unknown preset {preset!r}")
    rot = c.rotation
    backward = _hops(topo, bwd, c.backward_weights, c.block_sizes, rot.backward_weights)
    levels = [(kept, backward)] if kept is not None else []
    levels += [
        (axes, _hops(topo, hops, c.backward_weights, c.block_sizes, rot.backward_weights)) for axes, hops in alt
    ]
    return CommPlan(
        preset,
        _hops(topo, fwd, c.forward_weights, c.block_sizes, rot.forward_weights),
        kept,
        backward,
        _hops(topo, red, c.gradients, c.block_sizes, rot.gradients, c.error_feedback),
        c.block_size,
        tuple(levels),
    )
