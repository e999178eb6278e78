"""The ``zeropp_hier`` section of a DeepSpeed config: a strict, typed model.

DeepSpeed forbids unknown keys inside ``zero_optimization`` but passes an unknown top-level
section through untouched, so ours lives at the top level and is validated here, before any
process group or collective exists. Every error is a ``HierConfigError`` naming the field, the
value and the fix.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .errors import HierConfigError
from .topology import TIERS

SECTION = "zeropp_hier"
PRESETS = ("zero3", "zeropp", "frontier")
SCHEMES = ("none", "fp16", "bf16", "int8", "int4")
MIN_BLOCK, MAX_BLOCK = 32, 4096

# [Note: preset compression defaults]
# Hybrid compression (arXiv 2409.02423): compress hard where the data tolerates it *and* the
# link is slow. Gradients are averaged over every rank, so per-element quantization noise is
# averaged down, and they cross the node link once per step: int4 there. Weights are used
# as-is by every rank's forward pass, so they get int8 and only on the slowest (node) hop; the
# fast in-node hops carry them exactly. ``zeropp`` mirrors ZeRO++ (qwZ int8 weights, qgZ int4
# gradients on both of its stages); ``zero3`` compresses nothing.
PRESET_COMPRESSION: dict[str, dict[str, dict[str, str]]] = {
    "zero3": {"weights": {}, "gradients": {}},
    "zeropp": {"weights": {"node": "int8"}, "gradients": {"gpu": "int4", "node": "int4"}},
    "frontier": {"weights": {"node": "int8"}, "gradients": {"gpu": "int8", "node": "int4"}},
}
DEFAULT_BLOCK_SIZE = 256
# How long one collective may wait for its peers before failing ([Note: failure detection] in
# failures.py): far above any healthy wait, far below a job's wall time (torch's default: 30 min).
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0
MIN_COLLECTIVE_TIMEOUT_S, MAX_COLLECTIVE_TIMEOUT_S = 1.0, 86400.0

_SECTION_KEYS = ("enabled", "preset", "topology", "compression", "collective_timeout_s")
_TOPOLOGY_KEYS = ("gcds_per_gpu", "gpus_per_node", "rank_map")
_COMPRESSION_KEYS = ("weights", "gradients", "block_size")


@dataclass(frozen=True)
class TierSchemes:
    """Compression scheme for one kind of traffic, per tier."""
    gcd: str = "none"
    gpu: str = "none"
    node: str = "none"

    def of(self, tier: str) -> str:
        return getattr(self, tier)


@dataclass(frozen=True)
class CompressionConfig:
    weights: TierSchemes = TierSchemes()
    gradients: TierSchemes = TierSchemes()
    block_size: int = DEFAULT_BLOCK_SIZE


@dataclass(frozen=True)
class TopologyConfig:
    gcds_per_gpu: int = 2
    gpus_per_node: int = 4
    rank_map: tuple[int, ...] | None = None


@dataclass(frozen=True)
class HierConfig:
    enabled: bool = False
    preset: str = "frontier"
    topology: TopologyConfig = TopologyConfig()
    compression: CompressionConfig = CompressionConfig()
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_keys(d: Mapping, allowed: tuple[str, ...], where: str) -> None:
    for k in d:
        if k not in allowed:
            raise HierConfigError(f"{where}.{k}", d[k], f"unknown key; allowed keys are {list(allowed)}")


def _check_mapping(v: Any, field: str) -> Mapping:
    if not isinstance(v, Mapping):
        raise HierConfigError(field, v, "expected a JSON object")
    return v


def _parse_topology(v: Any) -> TopologyConfig:
    field = f"{SECTION}.topology"
    if v == "auto":
        raise HierConfigError(field, v, "automatic topology detection is not available yet; give "
                              "{\"gcds_per_gpu\": 2, \"gpus_per_node\": 4} for a Frontier node")
    d = _check_mapping(v, field)
    _check_keys(d, _TOPOLOGY_KEYS, field)
    vals = {}
    for k in ("gcds_per_gpu", "gpus_per_node"):
        x = d.get(k, getattr(TopologyConfig, k))
        if not _is_int(x) or x < 1:
            raise HierConfigError(f"{field}.{k}", x, "use a positive integer (Frontier: gcds_per_gpu=2, "
                                  "gpus_per_node=4)")
        vals[k] = x
    rank_map = d.get("rank_map")
    if rank_map is not None:
        if not isinstance(rank_map, (list, tuple)) or not all(_is_int(r) for r in rank_map):
            raise HierConfigError(f"{field}.rank_map", rank_map,
                                  "give a list of integers: rank_map[i] is the rank at position i "
                                  "(position = gcd + gcds_per_gpu*(gpu + gpus_per_node*node))")
        rank_map = tuple(rank_map)
    return TopologyConfig(vals["gcds_per_gpu"], vals["gpus_per_node"], rank_map)


def _parse_schemes(v: Any, field: str, base: Mapping[str, str]) -> TierSchemes:
    merged = dict(base)
    if isinstance(v, str):  # one scheme for every tier
        merged = {t: v for t in TIERS}
    elif v is not None:
        d = _check_mapping(v, field)
        _check_keys(d, TIERS, field)
        merged.update(d)
    for tier, scheme in merged.items():
        if scheme not in SCHEMES:
            raise HierConfigError(f"{field}.{tier}", scheme, f"use one of {list(SCHEMES)}")
    return TierSchemes(**merged)


def _parse_compression(v: Any, preset: str) -> CompressionConfig:
    field = f"{SECTION}.compression"
    defaults = PRESET_COMPRESSION[preset]
    if v is None:
        v = {}
    if isinstance(v, str):  # "none" / "int8" ...: the same scheme on every tier and kind
        if v not in SCHEMES:
            raise HierConfigError(field, v, f"use one of {list(SCHEMES)} or an object with "
                                  f"{list(_COMPRESSION_KEYS)}")
        v = {"weights": v, "gradients": v}
    d = _check_mapping(v, field)
    _check_keys(d, _COMPRESSION_KEYS, field)
    block = d.get("block_size", DEFAULT_BLOCK_SIZE)
    if not _is_int(block) or block < MIN_BLOCK or block > MAX_BLOCK or block & (block - 1):
        raise HierConfigError(f"{field}.block_size", block,
                              f"use a power of two from {MIN_BLOCK} to {MAX_BLOCK} (default {DEFAULT_BLOCK_SIZE})")
    return CompressionConfig(
        weights=_parse_schemes(d.get("weights"), f"{field}.weights", defaults["weights"]),
        gradients=_parse_schemes(d.get("gradients"), f"{field}.gradients", defaults["gradients"]),
        block_size=block)


def parse_section(section: Any) -> HierConfig:
    """Validate the ``zeropp_hier`` section alone (no knowledge of the world size)."""
    if section is None:
        return HierConfig(enabled=False)
    d = _check_mapping(section, SECTION)
    _check_keys(d, _SECTION_KEYS, SECTION)
    enabled = d.get("enabled", True)
    if not isinstance(enabled, bool):
        raise HierConfigError(f"{SECTION}.enabled", enabled, "use true or false")
    preset = d.get("preset", "frontier")
    if preset not in PRESETS:
        raise HierConfigError(f"{SECTION}.preset", preset, f"use one of {list(PRESETS)}")
    timeout = d.get("collective_timeout_s", DEFAULT_COLLECTIVE_TIMEOUT_S)
    if not (_is_int(timeout) or isinstance(timeout, float)) or not (
            MIN_COLLECTIVE_TIMEOUT_S <= timeout <= MAX_COLLECTIVE_TIMEOUT_S):
        raise HierConfigError(f"{SECTION}.collective_timeout_s", timeout,
                              f"use a number of seconds from {MIN_COLLECTIVE_TIMEOUT_S:g} to "
                              f"{MAX_COLLECTIVE_TIMEOUT_S:g} (default {DEFAULT_COLLECTIVE_TIMEOUT_S:g}): how long "
                              "a rank waits in one collective for a dead or stuck peer before failing")
    return HierConfig(enabled=enabled, preset=preset,
                      topology=_parse_topology(d.get("topology", {})),
                      compression=_parse_compression(d.get("compression"), preset),
                      collective_timeout_s=float(timeout))


# DeepSpeed settings that would run a second, conflicting hierarchy or compression beside ours.
_CONFLICTING_ZERO_KEYS = {
    "zero_hpz_partition_size": lambda v: v not in (None, 1),
    "zero_quantized_weights": bool,
    "zero_quantized_nontrainable_weights": bool,
    "zero_quantized_gradients": bool,
}


def check_deepspeed_config(cfg: HierConfig, ds_config: Mapping) -> None:
    """Refuse DeepSpeed settings that cannot run beside an enabled ``zeropp_hier`` section."""
    if not cfg.enabled:
        return
    zero = ds_config.get("zero_optimization", {}) or {}
    if not isinstance(zero, Mapping):
        raise HierConfigError("zero_optimization", zero, "expected a JSON object with \"stage\": 3")
    stage = zero.get("stage", 0)
    if stage != 3:
        raise HierConfigError("zero_optimization.stage", stage,
                              "zeropp_hier extends ZeRO stage 3: set \"stage\": 3, or set "
                              "zeropp_hier.enabled to false")
    for key, conflicts in _CONFLICTING_ZERO_KEYS.items():
        if key in zero and conflicts(zero[key]):
            raise HierConfigError(f"zero_optimization.{key}", zero[key],
                                  "remove it: zeropp_hier replaces DeepSpeed's hpZ/qwZ/qgZ; choose "
                                  "the layout with zeropp_hier.preset and compression with "
                                  "zeropp_hier.compression")
    if zero.get("reduce_scatter", True) is False:
        raise HierConfigError("zero_optimization.reduce_scatter", False,
                              "remove it (or set true): the hierarchical gradient reduction replaces "
                              "DeepSpeed's reduce-scatter path, which this setting bypasses")
    offload_param = zero.get("offload_param") or {}
    if not isinstance(offload_param, Mapping):
        raise HierConfigError("zero_optimization.offload_param", offload_param,
                              "expected a JSON object; parameter offload is not supported with "
                              "zeropp_hier, so remove offload_param")
    offload = offload_param.get("device", "none")
    if offload not in (None, "none"):
        raise HierConfigError("zero_optimization.offload_param.device", offload,
                              "parameter offload is not supported with zeropp_hier; remove "
                              "offload_param (optimizer offload is fine)")
    if (ds_config.get("gradient_predivide_factor", 1.0) or 1.0) != 1.0:
        raise HierConfigError("gradient_predivide_factor", ds_config["gradient_predivide_factor"],
                              "remove it: the hierarchical reduction averages in fp32, so "
                              "pre-division is not needed")


def hier_config_from_ds(ds_config: Mapping) -> HierConfig:
    cfg = parse_section(ds_config.get(SECTION))
    check_deepspeed_config(cfg, ds_config)
    return cfg
