"""The configurations the benchmark compares, per emulated shape: the presets' defaults, the
network stage at int4 with and without feedback or rotation, each quantized stage alone, and
DeepSpeed's qgZ ("qgz", reimplemented in qgz.py)."""

from __future__ import annotations

from typing import Sequence

from zeropp_hier.core.policy import QUANTIZED
from zeropp_hier.core.topology import Topology

from .pipelines import Stage, modify, plan_stages

QGZ = "qgz"  # the row computed by qgz.reduce, not by a package plan
INT4_NETWORK = {"gradients": {"node": "int4"}, "error_feedback": False}
ALONE = {"gcd": "none", "gpu": "none", "node": "none"}


def _loco(stages: Sequence[Stage], beta: float) -> tuple[Stage, ...]:
    """LoCo-style residuals on the network stage (at the rank that sends the in-node partial
    sum over the network) and on the compressed stage before it (at the sender)."""
    compressed = [s.hop.tier for s in stages if s.hop.scheme in QUANTIZED][-2:]
    out = tuple(stages)
    for tier in compressed:
        out = modify(out, tier, feedback="loco", beta=beta)
    return out


def rows(topo: Topology, rotations: Sequence[int], beta: float) -> dict[str, tuple[Stage, ...] | str]:
    """name -> the stages (or ``QGZ``). Rows whose stage does not exist on ``topo`` (the gpu
    stage where a node has one package) are left out."""
    frontier_int4 = plan_stages("frontier", INT4_NETWORK, topo)
    frontier_int4_fb = plan_stages("frontier", {"gradients": {"node": "int4"}}, topo)  # "auto": on for int4
    out: dict[str, tuple[Stage, ...] | str] = {
        "zero3 (exact fp32; control)": plan_stages("zero3", None, topo),
        "zeropp defaults (int4 in-node, int4 network)": plan_stages("zeropp", None, topo),
        _defaults_name(plan_stages("frontier", None, topo)): plan_stages("frontier", None, topo),
        "frontier, int4 network": frontier_int4,
        "frontier, int4 network + feedback (package, network stage)": frontier_int4_fb,
        f"frontier, int4 network + LoCo beta={beta} (network + previous stage)": _loco(frontier_int4, beta),
    }
    for r in rotations[-1:]:  # the largest in the full pipeline; each alone below
        out[f"frontier, int4 network, rotated R={r}"] = modify(frontier_int4, "node", rotate=r)
        out[f"frontier, int4 network, rotated R={r} + feedback (package)"] = modify(frontier_int4_fb, "node", rotate=r)
    out[QGZ_NAME] = QGZ
    # each quantized stage alone (every other stage exact fp32): its own error
    alone_net = plan_stages("frontier", {"gradients": {**ALONE, "node": "int4"}, "error_feedback": False}, topo)
    out["network stage alone: int4"] = alone_net
    for r in rotations:
        out[f"network stage alone: int4 rotated R={r}"] = modify(alone_net, "node", rotate=r)
    if topo.gpus_per_node > 1:
        out["gpu stage alone: int4"] = plan_stages(
            "frontier", {"gradients": {**ALONE, "gpu": "int4"}, "error_feedback": False}, topo
        )
    return out


def _defaults_name(stages: Sequence[Stage]) -> str:
    """The defaults' row named by what they run (the policy's defaults, read now)."""
    return "frontier defaults (" + ", ".join(f"{s.hop.scheme} {s.hop.tier}" for s in stages) + ")"


QGZ_NAME = "DeepSpeed qgZ (int4 both hops, its groups, fp16 sums; CPU reimplementation)"


def describe(stages: Sequence[Stage] | str) -> list[str]:
    """Each stage as text for the results file."""
    if isinstance(stages, str):
        return [stages]
    out = []
    for s in stages:
        txt = f"{'+'.join(s.hop.axes)}: {s.hop.scheme}"
        if s.hop.scheme in QUANTIZED:
            txt += f" block {s.hop.block_size}"
        if s.rotate:
            txt += f" rotate {s.rotate}"
        if s.feedback != "off":
            txt += f" feedback {s.feedback}" + (f" beta {s.beta}" if s.feedback == "loco" else "")
        out.append(txt)
    return out
