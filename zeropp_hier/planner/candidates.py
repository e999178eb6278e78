"""The configurations the planner compares. A *candidate* is stock DeepSpeed (ZeRO-3, or ZeRO++
with the parts of it that can run on the cluster) or one of our presets with a compression
choice, resolved by the config's own parser (``compression_for``). ``default_candidates`` is what
``zeropp-hier plan`` ranks, ``auto_candidates`` what ``"preset": "auto"`` chooses among."""

from __future__ import annotations

from typing import Mapping, NamedTuple

from ..core.policy import CompressionConfig, FixedPreset, parse_compression
from .clusters import ClusterModel


class Candidate(NamedTuple):
    name: str
    stock: bool  # stock DeepSpeed (its collectives) or zeropp_hier (ours)
    preset: FixedPreset  # stock ZeRO++ is the zeropp layout
    compression: CompressionConfig
    note: str = ""
    kept_gb: float | None = None  # memory.kept_shards_gb: a budget for the kept copies per GCD
    fit: bool = False  # the budget is whatever memory the rest leaves ([Note: kept levels])
    chunks: int | None = None  # pipeline.chunks; None: the planner's choice ([Note: busiest-link bound])
    caveat: str = ""  # a measured cost beyond speed, printed beside its ranking


def compression_for(
    preset: FixedPreset, override: str | None = None, block: int = 256, schemes: Mapping[str, object] | None = None
) -> CompressionConfig:
    """The compression the runtime would resolve for this preset (same parser as the config)."""
    section: dict[str, object] = {"block_size": block}
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
        compression_for("frontier"),
        "package copies for the layers that fit, node copies for the rest",
        fit=True,
    )


def _frontier_gpu_int4() -> Candidate:
    """frontier with int4 gradients on the package links: fewer bytes where they bind, at a
    measured cost in loss ([Note: preset compression defaults]); ranked by ``plan``, never taken by
    ``auto``."""
    return Candidate(
        "frontier/gpu-int4",
        False,
        "frontier",
        compression_for("frontier", schemes={"gradients": {"gpu": "int4"}}),
        "int4 gradients on the package links",
        caveat="held-out loss +0.36% [+0.19, +0.53] against stock where frontier's int8 is +0.05% "
        "(paired, 6 seeds, 0.23M parameters; docs/benchmarks.md)",
    )


def default_candidates(cluster: ClusterModel) -> list[Candidate]:
    none = compression_for("zero3")
    if cluster.stock_quantization:
        zpp, note = compression_for("zeropp"), "hpZ + qwZ int8 + qgZ int4"
    else:
        zpp, note = none, "hpZ only: DeepSpeed's qwZ/qgZ kernels do not run on this device"
    return [
        Candidate("ds-zero3", True, "zero3", none, "stock DeepSpeed ZeRO-3"),
        Candidate("ds-zeropp", True, "zeropp", zpp, f"stock DeepSpeed ZeRO++ ({note})"),
        Candidate("zero3", False, "zero3", none),
        Candidate("zeropp", False, "zeropp", compression_for("zeropp")),
        Candidate("zeropp/none", False, "zeropp", compression_for("zeropp", "none")),
        Candidate("frontier", False, "frontier", compression_for("frontier")),
        Candidate("frontier/none", False, "frontier", compression_for("frontier", "none")),
        _frontier_fit(),
        _frontier_gpu_int4(),
    ]


def auto_candidates(kept_gb: float | None = None, chunks: int | None = None) -> list[Candidate]:
    """What ``"preset": "auto"`` chooses among: our presets with the policy's compression (no
    int4 weights and no int4 on frontier's gradient hops: they cost measured loss, [Note: preset
    compression defaults]; zeropp keeps ZeRO++'s own int4), and frontier with per-layer kept
    levels (within ``kept_gb`` when the config gives a budget, else within what
    memory leaves). ``chunks``: pipeline chunks, None for the planner's choice
    ([Note: busiest-link bound] in pipeline.py); 1 where the job's hops do not run on lanes."""
    cands = [
        Candidate("zero3", False, "zero3", compression_for("zero3")),
        Candidate("zeropp", False, "zeropp", compression_for("zeropp"), kept_gb=kept_gb),
        Candidate("frontier", False, "frontier", compression_for("frontier"), kept_gb=kept_gb),
    ] + (
        []
        if kept_gb is not None  # the budget already applies to every candidate above
        else [_frontier_fit()]
    )
    return [c._replace(chunks=chunks) for c in cands]
