"""Which kept copy each layer holds under a memory budget: pure logic, no tensors.

[Note: kept levels]
A *kept level* says what a parameter keeps after its forward gather, for the backward:

    package  the shard spanning node and gpu (tertiary, 1/gcds_per_gpu of the weight per GCD):
             backward re-gathers over the in-package link only
    node     the shard spanning the nodes (secondary, ZeRO++'s hpZ copy, 1/gcds_per_node):
             backward re-gathers inside the node (gpu and gcd links)
    none     nothing: backward gathers the primary again, across the network

With no budget every layer keeps its preset's level (``frontier``: package; ``zeropp``: node, as
ZeRO++'s hpZ). With ``"memory": {"kept_shards_gb": B}`` the copies of all layers together stay
within B GB per GCD, for either preset: levels are filled in two passes, cheapest first. Every
byte of a node copy saves a network re-gather (the slowest link), every extra byte of a package
copy only a package-link one, so a node copy gains more per byte than the upgrade to a package
copy: first every layer that fits gets a node copy, then layers are upgraded to package copies
while the budget allows. Within a pass all layers gain the same per byte (time goes with
bytes), so they are taken in model order: the result reads "layers 0-k keep package copies,
the rest node copies".
For ``zeropp`` a budget larger than its node copies therefore buys package copies too: the
forward stays ZeRO++'s one flat gather, and the copy cut from its result lets those layers'
backward gather stay inside the package (hpZ over the package instead of the node) — the fast
backward of ``frontier`` without its hop-by-hop forward.
A layer is the parameters under one numbered module (``blocks.3``, ``model.layers.12``);
parameters outside numbered modules group by their module (``wte``, ``ln_f``).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from .plan import CommPlan
from .policy import QUANTIZED
from .topology import Topology

LEVEL_AXES: dict[str, tuple[str, ...] | None] = {"package": ("node", "gpu"), "node": ("node",), "none": None}
# the levels each preset may keep, its own (the one kept without a budget) first, as in
# CommPlan.by_level; a budget fills them cheapest first
PRESET_LEVELS = {"frontier": ("package", "node"), "zeropp": ("node", "package"), "zero3": ()}
FILL_ORDER = ("node", "package")


def layer_of(name: str) -> str:
    """The layer a parameter belongs to, from its qualified name."""
    parts = name.split(".")
    for i, p in enumerate(parts[:-1]):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1]) or name


def kept_elems(slot_elems: float, topo: Topology, level: str) -> float:
    """Elements of a kept copy per rank, for a layer whose per-rank slots hold ``slot_elems``."""
    axes = LEVEL_AXES[level]
    return 0.0 if axes is None else slot_elems * topo.axes_size(axes)


def kept_bytes_per_elem(plan: CommPlan, weight_bytes: float) -> float:
    """Bytes per element of a kept copy: the encoding of the forward gather's first quantizing
    hop (data plus one fp32 scale per block), which the copy keeps ([Note: quantize once per
    gather] in comm/collectives.py), else the weights' own width."""
    enc = next((h for h in plan.forward if h.scheme in QUANTIZED), None)
    if enc is None:
        return float(weight_bytes)
    return {"int8": 1.0, "int4": 0.5}[enc.scheme] + 4.0 / enc.block_size


class LevelPlan(NamedTuple):
    levels: dict  # layer -> level
    kept_bytes: float  # per GCD, all layers
    budget_bytes: float | None

    def counts(self) -> dict[str, int]:
        out = {lvl: 0 for lvl in LEVEL_AXES}
        for lvl in self.levels.values():
            out[lvl] += 1
        return out


def assign(
    layers: Sequence[tuple[str, float]],
    preset: str,
    topo: Topology,
    bytes_per_elem: float,
    budget_bytes: float | None = None,
) -> LevelPlan:
    """Kept level per layer ([Note: kept levels]). ``layers``: (name, per-rank slot elements) in
    model order; ``bytes_per_elem``: of a kept copy (encoded size when the forward quantizes)."""
    allowed = PRESET_LEVELS[preset]
    levels = {name: "none" for name, _ in layers}
    cost = {name: {lvl: kept_elems(n, topo, lvl) * bytes_per_elem for lvl in LEVEL_AXES} for name, n in layers}
    if budget_bytes is None:
        levels = dict.fromkeys(levels, allowed[0] if allowed else "none")
    else:
        used = 0.0
        for lvl in (lvl for lvl in FILL_ORDER if lvl in allowed):
            for name, _ in layers:
                extra = cost[name][lvl] - cost[name][levels[name]]
                if used + extra <= budget_bytes:
                    levels[name], used = lvl, used + extra
    total = sum(cost[name][lvl] for name, lvl in levels.items())
    return LevelPlan(levels, total, budget_bytes)


def summarize(plan: LevelPlan, order: Sequence[str]) -> list[tuple[str, str]]:
    """Runs of consecutive layers (in ``order``) with one level: [("blocks.0-blocks.5", "package"), ...]."""
    runs: list[tuple[list[str], str]] = []
    for name in order:
        lvl = plan.levels[name]
        if runs and runs[-1][1] == lvl:
            runs[-1][0].append(name)
        else:
            runs.append(([name], lvl))
    return [(names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]} ({len(names)})", lvl) for names, lvl in runs]
