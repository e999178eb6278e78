"""The ``zeropp_hier`` section of a DeepSpeed config: a strict, typed model.

DeepSpeed forbids unknown keys inside ``zero_optimization`` but passes an unknown top-level
section through untouched, so ours lives at the top level and is validated here, before any
process group or collective exists. Every error is a ``HierConfigError`` naming the field, the
value and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping, TypedDict, Union, get_args

from .checks import check_keys, check_mapping, is_int
from .errors import HierConfigError
from .policy import (
    CompressionConfig,
    NumericsConfig,
    check_numerics_against_deepspeed,
    parse_compression,
    parse_numerics,
)
from .vocab import PRESETS, TIERS, Preset

SECTION = "zeropp_hier"
# each choice a Literal type and the tuple of its values read from it (as in policy.py); the
# presets (Preset, PRESETS, FIXED_PRESETS) are the package's vocabulary, core/vocab.py
TopologyMode = Literal["manual", "auto"]
TOPOLOGY_MODES: tuple[TopologyMode, ...] = get_args(TopologyMode)
OverlapMode = Literal["lanes", "one_lane", "serial", "ticks", "gpu"]  # besides true / false
OVERLAP_MODES: tuple[OverlapMode, ...] = get_args(OverlapMode)

# How long one collective may wait for its peers before failing ([Note: failure detection] in
# comm/failures.py): far above any healthy wait, far below a job's wall time (torch's default: 30 min).
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0
MIN_COLLECTIVE_TIMEOUT_S, MAX_COLLECTIVE_TIMEOUT_S = 1.0, 86400.0

_SECTION_KEYS = (
    "enabled",
    "preset",
    "topology",
    "compression",
    "numerics",
    "collective_timeout_s",
    "deepspeed_group_timeout_s",
    "overlap",
    "memory",
    "auto",
    "checkpoint",
    "pipeline",
)
_TOPOLOGY_KEYS = ("mode", "gcds_per_gpu", "gpus_per_node", "rank_map")


class TopologySection(TypedDict, total=False):
    """The section's ``topology`` as written, when it is an object (the string "auto" is
    ``{"mode": "auto"}``); ``_parse_topology`` checks it."""

    mode: TopologyMode  # "manual" (default): declared here; "auto": detected at initialize
    gcds_per_gpu: int | None  # GCDs per GPU package (Frontier: 2); auto: None or the simulated shape
    gpus_per_node: int | None  # GPU packages per node (Frontier: 4)
    rank_map: list[int] | None  # rank_map[i]: the rank at coordinate index i (manual mode only)


# the section's "topology": "auto", or an object
TopologySpec = Union[Literal["auto"], TopologySection]


@dataclass(frozen=True, kw_only=True)
class TopologyConfig:
    gcds_per_gpu: int | None = 2  # None only in "auto" mode: not declared, to be detected
    gpus_per_node: int | None = 4  # GPU packages per node (None as gcds_per_gpu)
    rank_map: tuple[int, ...] | None = None  # rank at each coordinate index; None: the identity
    mode: TopologyMode = (
        "manual"  # "auto": detected at initialize ([Note: auto topology rules] in detect/autodetect.py)
    )


@dataclass(frozen=True, kw_only=True)
class MemoryConfig:
    # GB per GCD for the kept copies of all layers together; None: every layer keeps its
    # preset's copy ([Note: kept levels] in core/levels.py)
    kept_shards_gb: float | None = None


def _parse_memory(v: object, preset: Preset) -> MemoryConfig:
    field = f"{SECTION}.memory"
    if v is None:
        return MemoryConfig()
    d = check_mapping(v, field)
    check_keys(d, ("kept_shards_gb",), field)
    gb = d.get("kept_shards_gb")
    if gb is not None:
        if isinstance(gb, bool) or not isinstance(gb, (int, float)) or not gb >= 0 or gb == float("inf"):
            raise HierConfigError(
                f"{field}.kept_shards_gb",
                gb,
                "use a number of GB per GCD (0 keeps no copy: every backward gathers across the network), "
                "or null for the preset's copy of every layer",
            )
        if preset == "zero3":
            raise HierConfigError(
                f"{field}.kept_shards_gb", gb, 'preset "zero3" keeps no copy; remove it or use frontier / zeropp'
            )
        gb = float(gb)
    return MemoryConfig(kept_shards_gb=gb)


@dataclass(frozen=True, kw_only=True)
class AutoConfig:
    """Where ``"preset": "auto"`` takes the link rates from: a ``zeropp-hier probe`` file, declared
    per-GCD GB/s, or (neither given) a short probe at initialize."""

    probe_file: str | None = None
    tier_gbps: tuple[tuple[str, float], ...] | None = None  # ((tier, GB/s per GCD), ...)
    probe_kb: int = 256  # the probe's larger message per tier (the smaller is 1/16 of it)
    # the host term ([Note: host term] in planner/host.py): measured at initialize (None), declared
    # ((key, value), ...) in HOST_KEYS' units, or left out of the ranking (False)
    host: tuple[tuple[str, float], ...] | None | Literal[False] = None


# ``auto.host``'s declared values: per collective call and per point-to-point op (microseconds of
# the issuing thread), and the device's quantize + dequantize rate (M elements/s per GCD); and,
# optional (0 when left out), the tick mode's local work per element its hops touch (nanoseconds)
HOST_KEYS = ("collective_us", "p2p_op_us", "quant_melems_per_s")
HOST_OPTIONAL = ("tick_ns_per_elem",)


def _parse_auto_host(h: object, field: str) -> tuple[tuple[str, float], ...] | None | Literal[False]:
    if h is None or h is False:
        return h
    fix = (
        "give false (rank communication only), or every one of "
        + ", ".join(f'"{k}"' for k in HOST_KEYS)
        + ' as a positive number (e.g. {"collective_us": 40, "p2p_op_us": 8, "quant_melems_per_s": 50000}) '
        + 'and optionally "tick_ns_per_elem" as a number >= 0 (0 when left out), '
        "or leave it out to measure them at initialize"
    )
    if h is True:
        raise HierConfigError(field, h, fix)
    m = check_mapping(h, field)
    check_keys(m, HOST_KEYS + HOST_OPTIONAL, field)
    for k in HOST_KEYS + HOST_OPTIONAL:
        optional = k in HOST_OPTIONAL
        x = m.get(k, 0.0 if optional else None)
        number = isinstance(x, (int, float)) and not isinstance(x, bool)
        if not number or not ((0 <= x if optional else 0 < x) and x < float("inf")):  # type: ignore[operator]
            raise HierConfigError(f"{field}.{k}", x, fix)
    return tuple((k, float(m[k])) for k in HOST_KEYS + HOST_OPTIONAL if k in m)  # type: ignore[arg-type]


def _parse_auto(v: object, preset: Preset) -> AutoConfig:
    field = f"{SECTION}.auto"
    if v is None:
        return AutoConfig()
    if preset != "auto":
        raise HierConfigError(field, v, 'only "preset": "auto" reads it; remove it or set the preset to "auto"')
    d = check_mapping(v, field)
    check_keys(d, ("probe_file", "tier_gbps", "probe_kb", "host"), field)
    pf = d.get("probe_file")
    if pf is not None and (not isinstance(pf, str) or not pf):
        raise HierConfigError(
            f"{field}.probe_file", pf, "use the path of a JSON file written by `zeropp-hier probe --out`"
        )
    tg = d.get("tier_gbps")
    tiers = None
    if tg is not None:
        m = check_mapping(tg, f"{field}.tier_gbps")
        rates = {
            t: x
            for t, x in m.items()
            if isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < float("inf")
        }
        if set(rates) != set(TIERS) or len(m) != len(TIERS):
            raise HierConfigError(
                f"{field}.tier_gbps",
                tg,
                'give positive GB/s per GCD for each of "gcd", "gpu", "node" '
                '(Frontier: {"gcd": 200, "gpu": 50, "node": 12.5})',
            )
        tiers = tuple((t, float(rates[t])) for t in TIERS)
    if pf is not None and tiers is not None:
        raise HierConfigError(field, v, "give probe_file or tier_gbps, not both")
    kb = d.get("probe_kb", 256)
    if not is_int(kb) or not 16 <= kb <= 65536:
        raise HierConfigError(f"{field}.probe_kb", kb, "use an integer number of KB from 16 to 65536 (default 256)")
    host = _parse_auto_host(d.get("host"), f"{field}.host")
    return AutoConfig(probe_file=pf, tier_gbps=tiers, probe_kb=kb, host=host)


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    # Checkpoint files are loaded tensors-only ([Note: tensors-only loading] in
    # deepspeed/checkpoint/safe_load.py); true loads any pickle, i.e. runs whatever code the files name:
    # only for checkpoints whose writer the user trusts.
    trust_pickles: bool = False


def _parse_checkpoint(v: object) -> CheckpointConfig:
    field = f"{SECTION}.checkpoint"
    if v is None:
        return CheckpointConfig()
    d = check_mapping(v, field)
    check_keys(d, ("trust_pickles",), field)
    trust = d.get("trust_pickles", False)
    if not isinstance(trust, bool):
        raise HierConfigError(
            f"{field}.trust_pickles",
            trust,
            "use false (default: checkpoint files load tensors-only) or true (load any pickle: "
            "only for checkpoints whose writer you trust)",
        )
    return CheckpointConfig(trust_pickles=trust)


MAX_PIPELINE_CHUNKS = 64


@dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    # column chunks per gather bucket and per gradient bucket, each its own job so that the hops
    # of different chunks run on their links at once ([Note: chunked gathers] in
    # comm/gather.py); 1: off; None (default): the issue mode's own count, which is more than one
    # only where chunks overlap tiers with one issuing thread (comm/issue.py: default_chunks)
    chunks: int | None = None
    # backward gathers submitted at most this many layers ahead of the layer in use; the rest of
    # DeepSpeed's prefetch waits, so that gradient stages reach the lanes before them ([Note:
    # backward window] in deepspeed/inflight.py); None: as DeepSpeed's prefetch submits them
    backward_layers_ahead: int | None = None
    # how the tick mode runs a hop over a large group: "auto" (the planner's rule), "direct"
    # (every member at once) or "log" (ceil(log2 N) steps) ([Note: log-step hops] in comm/tick/plan.py)
    hop_steps: str = "auto"


HOP_STEPS = ("auto", "direct", "log")


def _parse_pipeline(v: object) -> PipelineConfig:
    field = f"{SECTION}.pipeline"
    if v is None:
        return PipelineConfig()
    d = check_mapping(v, field)
    check_keys(d, ("chunks", "backward_layers_ahead", "hop_steps"), field)
    chunks = d.get("chunks")
    if chunks is not None and (not is_int(chunks) or not 1 <= chunks <= MAX_PIPELINE_CHUNKS):
        raise HierConfigError(
            f"{field}.chunks",
            chunks,
            f"use an integer from 1 (no pipelining) to {MAX_PIPELINE_CHUNKS}, or leave it out for the issue "
            "mode's own count: the number of column chunks each gather and gradient bucket is cut into so "
            "that its hops run on their links at once",
        )
    ahead = d.get("backward_layers_ahead")
    if ahead is not None and (not is_int(ahead) or ahead < 0):
        raise HierConfigError(
            f"{field}.backward_layers_ahead",
            ahead,
            "use an integer of at least 0 (layers of backward gathers in flight ahead of the layer in "
            "use; 0: each when its layer needs it), or leave it out to submit them as DeepSpeed's "
            "prefetch asks",
        )
    steps = d.get("hop_steps", "auto")
    if steps not in HOP_STEPS:
        raise HierConfigError(
            f"{field}.hop_steps",
            steps,
            f'use one of {list(HOP_STEPS)}: how overlap "ticks" runs a hop over a large group, every member '
            'at once ("direct") or in ceil(log2 N) steps ("log"); "auto" (default) takes log steps above '
            "32 members",
        )
    return PipelineConfig(chunks=chunks, backward_layers_ahead=ahead, hop_steps=steps)


@dataclass(frozen=True, kw_only=True)
class HierConfig:
    enabled: bool = False  # false (or no section): stock DeepSpeed ZeRO-3
    preset: Preset = "frontier"  # the plan of hops and its default compression (core/vocab.py)
    topology: TopologyConfig = TopologyConfig()  # where each rank sits (node, gpu, gcd)
    compression: CompressionConfig = CompressionConfig()  # resolved: the preset's, overridden as written
    numerics: NumericsConfig = NumericsConfig()  # non-finite gradients, error sampling, residual dtype
    # how long one collective may wait for its peers before failing ([Note: failure detection])
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    # DeepSpeed's own groups (the world/data-parallel group of its gradient-norm all-reduce and
    # checkpoint barriers) keep their timeout (torch's 30 min, or init_distributed's) unless set:
    # a first step with long kernel tuning, or a large checkpoint, must not abort a healthy job.
    deepspeed_group_timeout_s: float | None = None
    # gathers run on a background executor so that DeepSpeed's prefetch overlaps them with
    # compute ([Note: one order of hop collectives] in comm/executor.py): true, the mode safe for
    # the backend ([Note: one issuing thread on GPUs] in comm/issue.py); "lanes": one lane per hop
    # group; "one_lane": one lane for all; "serial": one lane, each collective issued after the
    # previous one completed, on any backend; "gpu": what true is on NCCL/RCCL, on any backend;
    # "ticks": one lane, each piece of work's chunks in
    # ticks of one grouped point-to-point call ([Note: ticks] in comm/tick/plan.py); false: inline
    overlap: bool | OverlapMode = True
    memory: MemoryConfig = MemoryConfig()
    auto: AutoConfig = AutoConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    pipeline: PipelineConfig = PipelineConfig()
    # what "auto" chose (the planner's candidate name, e.g. "frontier/fit"), once resolved at
    # initialize (None before, and for a named preset)
    chosen_by_auto: str | None = None


def _parse_topology(v: object) -> TopologyConfig:
    field = f"{SECTION}.topology"
    if v == "auto":
        v = {"mode": "auto"}
    d = check_mapping(v, field)
    check_keys(d, _TOPOLOGY_KEYS, field)
    mode = d.get("mode", "manual")
    if mode not in TOPOLOGY_MODES:
        raise HierConfigError(f"{field}.mode", mode, 'use "auto" (detect at initialize) or "manual"')
    if mode == "auto" and d.get("rank_map") is not None:
        raise HierConfigError(
            f"{field}.rank_map",
            d["rank_map"],
            'auto mode works out the rank map itself; remove rank_map or remove "mode": "auto"',
        )
    vals: dict[str, int | None] = {}
    for k in ("gcds_per_gpu", "gpus_per_node"):
        x = d.get(k, None if mode == "auto" else getattr(TopologyConfig, k))
        if x is None and mode == "auto":  # not declared: detected
            vals[k] = None
            continue
        if not is_int(x) or x < 1:
            raise HierConfigError(
                f"{field}.{k}", x, "use a positive integer (Frontier: gcds_per_gpu=2, gpus_per_node=4)"
            )
        vals[k] = x
    rank_map = d.get("rank_map")
    if rank_map is not None:
        if not isinstance(rank_map, (list, tuple)) or not all(is_int(r) for r in rank_map):
            raise HierConfigError(
                f"{field}.rank_map",
                rank_map,
                "give a list of integers: rank_map[i] is the rank at position i "
                "(position = gcd + gcds_per_gpu*(gpu + gpus_per_node*node))",
            )
        rank_map = tuple(rank_map)
    return TopologyConfig(
        gcds_per_gpu=vals["gcds_per_gpu"], gpus_per_node=vals["gpus_per_node"], rank_map=rank_map, mode=mode
    )


def _seconds(value: object, key: str, what: str) -> float:
    """A timeout of the section, in seconds within the allowed range; ``what`` ends the fix."""
    if not (is_int(value) or isinstance(value, float)) or not (
        MIN_COLLECTIVE_TIMEOUT_S <= value <= MAX_COLLECTIVE_TIMEOUT_S
    ):
        raise HierConfigError(
            f"{SECTION}.{key}",
            value,
            f"use a number of seconds from {MIN_COLLECTIVE_TIMEOUT_S:g} to {MAX_COLLECTIVE_TIMEOUT_S:g} {what}",
        )
    return float(value)


def parse_section(section: object) -> HierConfig:
    """Validate the ``zeropp_hier`` section alone (no knowledge of the world size)."""
    if section is None:
        return HierConfig(enabled=False)
    d = check_mapping(section, SECTION)
    check_keys(d, _SECTION_KEYS, SECTION)
    enabled = d.get("enabled", True)
    if not isinstance(enabled, bool):
        raise HierConfigError(f"{SECTION}.enabled", enabled, "use true or false")
    preset = d.get("preset", "frontier")
    if preset not in PRESETS:
        raise HierConfigError(f"{SECTION}.preset", preset, f"use one of {list(PRESETS)}")
    timeout = _seconds(
        d.get("collective_timeout_s", DEFAULT_COLLECTIVE_TIMEOUT_S),
        "collective_timeout_s",
        f"(default {DEFAULT_COLLECTIVE_TIMEOUT_S:g}): how long a rank waits in one collective for a dead "
        "or stuck peer before failing",
    )
    ds_timeout = d.get("deepspeed_group_timeout_s")
    if ds_timeout is not None:
        ds_timeout = _seconds(
            ds_timeout, "deepspeed_group_timeout_s", "for DeepSpeed's own groups, or null (default: they keep theirs)"
        )
    overlap = d.get("overlap", True)
    if not isinstance(overlap, bool) and overlap not in OVERLAP_MODES:
        raise HierConfigError(
            f"{SECTION}.overlap",
            overlap,
            "use true (default: gathers overlap compute through DeepSpeed's prefetch; lanes on gloo, "
            'on NCCL/RCCL "ticks" where every hop spans one tier and "one_lane" otherwise), "gpu" (what '
            'true means on NCCL/RCCL, on any backend), "one_lane" (overlapped, one issuing thread, hop '
            'after hop; serialized on ROCm), "serial" (one lane, each hop collective issued after the previous '
            'one completed, on any backend), "ticks" (one issuing thread and one communicator; the chunks of '
            "pipeline.chunks overlap the tiers inside one grouped point-to-point call per tick), "
            '"lanes" (a host thread per hop group, even on NCCL/RCCL: risks a deadlock there) or '
            "false (every collective inline)",
        )
    return HierConfig(
        enabled=enabled,
        preset=preset,
        overlap=overlap,
        topology=_parse_topology(d.get("topology", {})),
        compression=_parse_compression_for(d.get("compression"), preset),
        numerics=parse_numerics(d.get("numerics"), f"{SECTION}.numerics"),
        collective_timeout_s=timeout,
        deepspeed_group_timeout_s=ds_timeout,
        memory=_parse_memory(d.get("memory"), preset),
        auto=_parse_auto(d.get("auto"), preset),
        checkpoint=_parse_checkpoint(d.get("checkpoint")),
        pipeline=_parse_pipeline(d.get("pipeline")),
    )


def _parse_compression_for(v: object, preset: Preset) -> CompressionConfig:
    if preset == "auto":
        if v is not None:
            raise HierConfigError(
                f"{SECTION}.compression",
                v,
                '"auto" chooses each preset\'s compression from the policy defaults; remove compression, '
                "or name a preset to set it yourself",
            )
        return CompressionConfig()
    return parse_compression(v, preset, f"{SECTION}.compression")


# DeepSpeed settings that would run a second, conflicting hierarchy or compression beside ours.
_CONFLICTING_ZERO_KEYS = {
    "zero_hpz_partition_size": lambda v: v not in (None, 1),
    "zero_quantized_weights": bool,
    "zero_quantized_nontrainable_weights": bool,
    "zero_quantized_gradients": bool,
}


def check_deepspeed_config(cfg: HierConfig, ds_config: Mapping[str, object]) -> None:
    """Refuse DeepSpeed settings that cannot run beside an enabled ``zeropp_hier`` section."""
    if not cfg.enabled:
        return
    zero = ds_config.get("zero_optimization", {}) or {}
    if not isinstance(zero, Mapping):
        raise HierConfigError("zero_optimization", zero, 'expected a JSON object with "stage": 3')
    stage = zero.get("stage", 0)
    if stage != 3:
        raise HierConfigError(
            "zero_optimization.stage",
            stage,
            'zeropp_hier extends ZeRO stage 3: set "stage": 3, or set zeropp_hier.enabled to false',
        )
    for key, conflicts in _CONFLICTING_ZERO_KEYS.items():
        if key in zero and conflicts(zero[key]):
            raise HierConfigError(
                f"zero_optimization.{key}",
                zero[key],
                "remove it: zeropp_hier replaces DeepSpeed's hpZ/qwZ/qgZ; choose "
                "the layout with zeropp_hier.preset and compression with "
                "zeropp_hier.compression",
            )
    if zero.get("reduce_scatter", True) is False:
        raise HierConfigError(
            "zero_optimization.reduce_scatter",
            False,
            "remove it (or set true): the hierarchical gradient reduction replaces "
            "DeepSpeed's reduce-scatter path, which this setting bypasses",
        )
    offload_param = zero.get("offload_param") or {}
    if not isinstance(offload_param, Mapping):
        raise HierConfigError(
            "zero_optimization.offload_param",
            offload_param,
            "expected a JSON object; parameter offload is not supported with zeropp_hier, so remove offload_param",
        )
    offload = offload_param.get("device", "none")
    if offload not in (None, "none"):
        raise HierConfigError(
            "zero_optimization.offload_param.device",
            offload,
            "parameter offload is not supported with zeropp_hier (its shards stay on the device: 'none'); remove "
            "offload_param (optimizer offload is fine), or run DeepSpeed's own ZeRO-3 (the job's preset=stock)",
        )
    check_parallelism_against_deepspeed(ds_config)
    check_numerics_against_deepspeed(cfg.numerics, ds_config, f"{SECTION}.numerics")
    if (ds_config.get("gradient_predivide_factor", 1.0) or 1.0) != 1.0:
        raise HierConfigError(
            "gradient_predivide_factor",
            ds_config["gradient_predivide_factor"],
            "remove it: the hierarchical reduction averages in fp32, so pre-division is not needed",
        )


# [Note: data parallelism over the whole world]
# The hop groups are built over every rank of the world, and ZeRO must partition over that same
# world: with tensor, sequence, pipeline or expert parallelism the data-parallel group is smaller,
# and ranks holding different model slices would be averaged together as if they were copies.
# Such setups are refused (here for DeepSpeed config keys, at initialize for an ``mpu``, a
# pipeline module or MoE layers) rather than supported by building hops inside the
# data-parallel group: nothing here has been verified with model parallelism.
MODEL_PARALLEL_FIX = (
    "zeropp_hier needs ZeRO data parallelism over the whole world; tensor, "
    "sequence, pipeline and expert parallelism are not supported: remove it, or "
    "set zeropp_hier.enabled to false"
)


def check_parallelism_against_deepspeed(ds_config: Mapping[str, object]) -> None:
    tp = ds_config.get("tensor_parallel") or {}
    if isinstance(tp, Mapping):
        size = tp.get("autotp_size", tp.get("tp_size", 1))
        if size not in (None, 0, 1):
            key = "autotp_size" if "autotp_size" in tp else "tp_size"
            raise HierConfigError(f"tensor_parallel.{key}", size, MODEL_PARALLEL_FIX)
    sp = ds_config.get("sequence_parallel_size", 1)
    if sp not in (None, 1):
        raise HierConfigError("sequence_parallel_size", sp, MODEL_PARALLEL_FIX)


def hier_config_from_ds(ds_config: Mapping[str, object]) -> HierConfig:
    cfg = parse_section(ds_config.get(SECTION))
    check_deepspeed_config(cfg, ds_config)
    return cfg
