"""The numerics policy of a ``zeropp_hier`` section: which compression each kind of traffic uses
on each tier, where error feedback runs, what happens to non-finite gradients, and how often the
compression error is sampled. Pure data and validation (no torch); ``config.py`` calls the two
parsers, ``plan.py`` turns the result into hops.

    "compression": {
      "weights": {"node": "int8"},            # both weight gathers, per tier (or one scheme)
      "forward_weights": {...},               # optional: overrides "weights" for the forward gather
      "backward_weights": {...},              # optional: overrides "weights" for the backward re-gather
      "gradients": {"gcd": "int8", "gpu": "int4", "node": "int8"},
      "block_size": 256,                      # or per tier: {"node": 128}
      "error_feedback": "auto",               # or true / false / {"node": true}
      "rotation": {"gradients": {"node": 32}}  # optional Hadamard rotation size per kind and tier
    },
    "numerics": {"nonfinite": "skip", "sample_every": 16}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Literal, Mapping, TypedDict, TypeVar, Union, get_args

from .checks import check_keys, check_mapping, is_int
from .errors import HierConfigError
from .vocab import TIERS, FixedPreset, Tier

# Each choice is a Literal type and its tuple of values, the tuple read from the type so that the
# two cannot drift: the type is what mypy checks, the tuple what the parsers check at run time.
Scheme = Literal["none", "fp16", "bf16", "int8", "int4"]
SCHEMES: tuple[Scheme, ...] = get_args(Scheme)
QUANTIZED: tuple[Scheme, ...] = ("int8", "int4")
BITS: dict[Scheme, int] = {"int8": 8, "int4": 4}  # bits per element of each quantized scheme
MIN_BLOCK, MAX_BLOCK = 32, 4096
DEFAULT_BLOCK_SIZE = 256
NonfinitePolicy = Literal["skip", "raise"]
NONFINITE_POLICIES: tuple[NonfinitePolicy, ...] = get_args(NonfinitePolicy)
ResidualDtype = Literal["fp32", "bf16"]
RESIDUAL_DTYPES: tuple[ResidualDtype, ...] = get_args(ResidualDtype)
# error feedback of one tier as written: on, off, or "auto" (on where the gradients are int4)
ErrorFeedback = Union[bool, Literal["auto"]]
DEFAULT_SAMPLE_EVERY = 16
# consecutive skipped steps before the job stops: fp16's loss scaler needs about two skips per
# halving of its scale (hysteresis 2) to come down from 2^16, so a healthy run never nears this
DEFAULT_MAX_CONSECUTIVE_SKIPS = 100

# [Note: preset compression defaults]
# Hybrid compression (arXiv 2409.02423): compress hard where the data tolerates it *and* the
# link is slow. That study found that compressing every collective alike degrades the loss,
# while compressing gradients hard over the slow link and weights gently reaches baseline
# convergence. The reasons, as they apply here:
# - Gradients are averaged over every rank, so per-element quantization noise is averaged
#   down; they cross each link once per step. So: compressed on every hop, int8 on each (below:
#   int4 on the package links or the network cost loss that int8 did not).
# - int8 on the gcd hop: in backward the in-package link carries both the re-gather of every
#   layer (exact bf16 weights, below) and the first stage of every gradient bucket, and a
#   stage's bytes are largest on that first hop (the whole bucket; later hops move 1/2 and 1/8
#   of it, compressed). With links in Frontier's 16:4:1 per-GCD ratio that lane is as busy in
#   backward as the package links, and a pipelined job runs at its slowest lane. Measured in the
#   link-bound benchmark (docs/benchmarks.md, 16 ranks, 4 chunks): int8 there cut in-package
#   bytes 28% with the package-link bytes unchanged, the step 63.3 -> 61.4 s (70.0 -> 67.3 s at
#   other rates), and lifted the busiest (package) link from 84% to 86% used. Accuracy: over
#   five seeds +0.23% from stock (held-out +0.27%) against +0.18% (+0.07%) with the gcd hop
#   exact, a paired difference of +0.05% (standard deviation 0.69%): none that the harness can
#   see. Its error feedback is "auto", off for int8 (a residual there would be as large as every
#   gradient bucket).
# - int8 on the gpu hop (accuracy first): paired against stock over 6 seeds
#   (benchmarks/cpu/paired, protocols 1 and 2, 0.23M parameters, margin 0.3%), int4 there cost
#   +0.36% [+0.19, +0.53] of the held-out loss and int8 +0.05% [-0.03, +0.13], equivalent;
#   uncompressed weights with int4 there +0.40%: the gpu hop's int4 (no error feedback) was the
#   whole cost. int4 there is faster where the package links bind (a package's links carry the
#   gpu tier's bytes and the node tier's; int8 doubles the gpu stage's gradient bytes): it stays a
#   user's choice (``"gradients": {"gpu": "int4"}``) and the planner's ``frontier/gpu-int4``
#   row, and ``auto`` does not take it (it does not trade measured loss for speed).
# - int8 on the node hop: accuracy, measured (benchmarks/cpu/convergence.py,
#   docs/benchmarks.md#convergence-on-real-text). Every setting with int4 gradients on the node
#   hop ended 1.1-1.6% above stock's loss at two seeds, with or without error feedback, at
#   block 64, with int8 or int4 on the gpu hop; int8 there with int4 on the gpu hop ended
#   +0.13% on average at the same two seeds, and +1.79% at a third, where int4 on the node hop
#   ended +0.59% (means over those three: int8 +0.68%, int4 +1.06%). Over five seeds int8 ends
#   +0.18% on average (held-out +0.07%), within the 0.5% the project aims at on the mean, with
#   one seed's gap spread over -0.90..+1.79%. The node hop's bytes
#   are a small part of what the binding package links carry (8.5 of 46.3 MB per step in the
#   link-bound benchmark), so int8 costs little of the step.
# - Error feedback ([Note: error feedback] in comm/error_feedback.py: the part int4 drops is
#   sent a step later) is "auto" on the node stage: on where it is int4 (a user's choice), off
#   for the default's int8. Not on the gpu stage, where a user sets int4: a stage's residual is
#   the size of its send buffer, the gpu stage's 1/gcds_per_gpu, half of every gradient, which for a 20B model on
#   384 GCDs is 40 GB per GCD in fp32 (the planner's memory model; it does not fit beside the
#   rest). Without feedback a gpu stage's int4 error stays in that step's averaged gradient, as
#   on zeropp's in-node stage (ZeRO++'s qgZ has none either). ``"error_feedback": {"gpu":
#   true}`` turns it on there where memory allows.
# - Weights are used as-is by every rank's forward and backward pass: their error is not
#   averaged away and not fed back (the next gather starts again from the exact master
#   weights). So int8, and only on the slowest (node) hop of the forward gather; the backward
#   re-gather runs over the GCD link from the kept shard and stays exact.
# - ``zeropp`` mirrors ZeRO++ (qwZ int8 weights, qgZ int4 gradients on both of its stages) and,
#   like ZeRO++, runs without error feedback, so that it stays a faithful baseline; switch it
#   on with ``"error_feedback": "auto"``. Its int4 node stage costs it the same loss as above.
#   ``zero3`` compresses nothing.
PRESET_COMPRESSION: dict[FixedPreset, dict[str, dict[str, Scheme]]] = {
    "zero3": {"weights": {}, "gradients": {}},
    "zeropp": {"weights": {"node": "int8"}, "gradients": {"gpu": "int4", "node": "int4"}},
    "frontier": {"weights": {"node": "int8"}, "gradients": {"gcd": "int8", "gpu": "int8", "node": "int8"}},
}
# frontier: none on the gpu stage, whose residual would hold half of every gradient bucket (a
# user's int4 there runs without; [Note: preset compression defaults])
PRESET_ERROR_FEEDBACK: dict[FixedPreset, ErrorFeedback | Mapping[str, ErrorFeedback]] = {
    "zero3": "auto",
    "zeropp": False,
    "frontier": {"gcd": "auto", "gpu": False, "node": "auto"},
}


class CompressionSection(TypedDict, total=False):
    """The section's ``compression`` as written, when it is an object (a single scheme name
    sets every tier and kind); ``parse_compression`` checks it."""

    weights: Scheme | dict[Tier, Scheme]  # both weight gathers; per tier or one scheme
    forward_weights: Scheme | dict[Tier, Scheme]  # the forward gather only
    backward_weights: Scheme | dict[Tier, Scheme]  # the backward re-gather only
    gradients: Scheme | dict[Tier, Scheme]  # the gradient reduce-scatter
    block_size: int | dict[Tier, int]  # elements per fp32 scale; per tier or one size
    error_feedback: ErrorFeedback | dict[Tier, ErrorFeedback]  # residuals of compressed gradients
    rotation: int | dict[str, int | dict[Tier, int]]  # Hadamard rotation size: one, or per kind (and tier)


# the section's "compression": None (the preset's own), one scheme for everything, or an object
Compression = Union[Scheme, CompressionSection, None]

_COMPRESSION_KEYS = (
    "weights",
    "forward_weights",
    "backward_weights",
    "gradients",
    "block_size",
    "error_feedback",
    "rotation",
)
# the kinds of traffic "rotation" names, as the scheme keys do
_ROTATION_KINDS = ("weights", "forward_weights", "backward_weights", "gradients")
_NUMERICS_KEYS = ("nonfinite", "sample_every", "residual_dtype", "max_consecutive_skips")


V = TypeVar("V")


@dataclass(frozen=True, kw_only=True)
class PerTier(Generic[V]):
    """One value per tier: a compression scheme, a block size or a switch."""

    gcd: V  # between the two GCDs of a package
    gpu: V  # between the packages of a node
    node: V  # between nodes

    def of(self, tier: str) -> V:
        return getattr(self, tier)


def every_tier(v: V) -> PerTier[V]:
    return PerTier(gcd=v, gpu=v, node=v)


TierSchemes = PerTier[Scheme]  # compression scheme of one kind of traffic
TierBlocks = PerTier[int]  # quantization block size (elements per fp32 scale)
TierFlags = PerTier[bool]  # error feedback: on where that tier's gradients are compressed
TierRotations = PerTier[int]  # Hadamard rotation size R per tier; 0 = off


# [Note: rotation policy]
# ``"rotation"`` turns on the block rotation of the quantization format ([Note: block rotation]
# in quant/reference.py) per kind of traffic and tier, in the shapes ``block_size`` takes: one
# size for every quantized hop (``"rotation": 32``), or an object per kind (``"weights"``,
# ``"forward_weights"``, ``"backward_weights"``, ``"gradients"``), each one size or an object per
# tier. 0 is off, and off is every preset's default: whether rotation keeps a preset's loss
# where it is needs a convergence run that has not been made. A size must be a power of two from
# 2 to the tier's block size (so it divides it). A size named for one tier whose scheme is not
# int8/int4 is an error (it would do nothing); a size given for a whole kind or for everything
# applies only where that kind is quantized. Both ends of a hop read the same plan, which is
# how the receiver knows R: the payload does not carry it.


@dataclass(frozen=True, kw_only=True)
class Rotations:
    """Rotation size per tier of each kind of traffic ([Note: rotation policy]); 0 = off."""

    forward_weights: TierRotations = every_tier(0)
    backward_weights: TierRotations = every_tier(0)
    gradients: TierRotations = every_tier(0)


@dataclass(frozen=True, kw_only=True)
class CompressionConfig:
    forward_weights: TierSchemes = every_tier("none")  # the forward gather of the weights
    backward_weights: TierSchemes = every_tier("none")  # the backward re-gather of the weights
    gradients: TierSchemes = every_tier("none")  # the gradient reduce-scatter
    block_size: int = DEFAULT_BLOCK_SIZE  # for every tier not named in a per-tier block_size
    block_sizes: TierBlocks = every_tier(DEFAULT_BLOCK_SIZE)
    error_feedback: TierFlags = every_tier(False)  # resolved: True only where gradients are compressed
    rotation: Rotations = Rotations()  # resolved: non-zero only where the kind is int8/int4 on the tier

    @property
    def weights(self) -> TierSchemes:
        """The forward gather's schemes (the single ``weights`` of earlier versions)."""
        return self.forward_weights


@dataclass(frozen=True, kw_only=True)
class NumericsConfig:
    nonfinite: NonfinitePolicy = "skip"  # bf16/fp32: skip the step and report, or raise HierNonFiniteError
    sample_every: int = DEFAULT_SAMPLE_EVERY  # compression error sampled every N-th call; 0 = off
    # error-feedback residuals are kept in this dtype: "bf16" halves their memory (one residual
    # per compressed gradient stage and bucket: for a 20B model, GBs per GCD in fp32); the
    # residual is added back in fp32 either way
    residual_dtype: ResidualDtype = "fp32"
    # this many skipped steps in a row (non-finite gradients, fp16 overflow) stop the job with
    # HierSkippedStepsError and the history of the skips, instead of skipping forever
    max_consecutive_skips: int = DEFAULT_MAX_CONSECUTIVE_SKIPS


def merge_schemes(base: Mapping[str, Scheme], v: object, field: str) -> dict[str, Scheme]:
    """``v`` is one scheme for every tier, or a per-tier object merged over ``base``."""
    merged: dict[str, object] = {t: base.get(t, "none") for t in TIERS}  # checked below, whatever its source
    if isinstance(v, str):
        merged = {t: v for t in TIERS}
        if v not in SCHEMES:
            raise HierConfigError(field, v, f"use one of {list(SCHEMES)} or an object per tier {list(TIERS)}")
    elif v is not None:
        d = check_mapping(v, field)
        check_keys(d, TIERS, field)
        merged.update(d)
    out: dict[str, Scheme] = {}
    for tier, scheme in merged.items():
        if scheme not in SCHEMES:
            raise HierConfigError(f"{field}.{tier}", scheme, f"use one of {list(SCHEMES)}")
        out[tier] = scheme
    return out


def _check_block(v: object, field: str) -> int:
    if not is_int(v) or v < MIN_BLOCK or v > MAX_BLOCK or v & (v - 1):
        raise HierConfigError(
            field, v, f"use a power of two from {MIN_BLOCK} to {MAX_BLOCK} (default {DEFAULT_BLOCK_SIZE})"
        )
    return v


def _parse_blocks(v: object, field: str) -> tuple[int, TierBlocks]:
    if v is None:
        return DEFAULT_BLOCK_SIZE, every_tier(DEFAULT_BLOCK_SIZE)
    if isinstance(v, Mapping):
        check_keys(v, TIERS, field)
        per = {t: DEFAULT_BLOCK_SIZE for t in TIERS} | {t: _check_block(v[t], f"{field}.{t}") for t in v}
        return DEFAULT_BLOCK_SIZE, TierBlocks(**per)
    b = _check_block(v, field)
    return b, every_tier(b)


_EF_FIX = 'use true, false or "auto" (on where gradients are int4), or an object per tier, e.g. {"node": true}'


def _ef_value(v: object, field: str) -> ErrorFeedback:
    if v not in ("auto", True, False) or isinstance(v, (int, float)) and not isinstance(v, bool):
        raise HierConfigError(field, v, _EF_FIX)
    return v


def _parse_error_feedback(
    v: object, grads: Mapping[str, Scheme], default: ErrorFeedback | Mapping[str, ErrorFeedback], field: str
) -> TierFlags:
    """Resolve to one flag per tier. "auto" means on where the tier's gradients are int4 (the
    scheme whose error is large enough to matter, [Note: preset compression defaults])."""
    per: dict[str, ErrorFeedback]
    if isinstance(default, Mapping):  # a preset's per-tier default
        per = {t: _ef_value(default[t], field) for t in TIERS}
    else:
        per = {t: _ef_value(default, field) for t in TIERS}
    explicit: set[str] = set()
    if isinstance(v, Mapping):
        check_keys(v, TIERS, field)
        for t, x in v.items():
            per[t] = _ef_value(x, f"{field}.{t}")
            explicit.add(t)
    elif v is not None:
        per = {t: _ef_value(v, field) for t in TIERS}
    flags = {}
    for t in TIERS:
        scheme = grads[t]
        if per[t] is True and scheme == "none" and t in explicit:
            raise HierConfigError(
                f"{field}.{t}",
                True,
                f"gradients on the {t} tier are not compressed (compression."
                f"gradients.{t} is 'none'), so there is no error to feed back; "
                "compress them or remove this entry",
            )
        flags[t] = scheme != "none" and (per[t] is True or (per[t] == "auto" and scheme == "int4"))
    return TierFlags(**flags)


_ROTATION_FIX = (
    "use 0 (off) or a power of two from 2 to the tier's block size {block} (it must divide it), "
    'e.g. {{"gradients": {{"node": 32}}}}'
)


def _rotation_value(v: object, field: str, block: int) -> int:
    if not is_int(v) or v < 0 or (v and (v < 2 or v > block or v & (v - 1))):
        fix = _ROTATION_FIX.format(block=block)
        if is_int(v) and v > block and not v & (v - 1):
            fix = f"it is larger than the block size {block} (a rotation mixes values within one block); " + fix
        elif is_int(v) and v > 1 and v & (v - 1):
            fix = "it is not a power of two; " + fix
        raise HierConfigError(field, v, fix)
    return v


def _parse_rotation(
    v: object, schemes: Mapping[str, Mapping[str, Scheme]], blocks: TierBlocks, field: str
) -> Rotations:
    """``v`` as written -> one size per kind and tier, checked against each tier's block size
    and zero where that kind is not quantized ([Note: rotation policy])."""
    kinds = ("forward_weights", "backward_weights", "gradients")
    per: dict[str, dict[str, int]] = {k: {t: 0 for t in TIERS} for k in kinds}
    named: dict[tuple[str, str], str] = {}  # (kind, tier) written out -> its field: must be quantized

    def put(kind_keys: tuple[str, ...], x: object, where: str) -> None:
        if isinstance(x, Mapping):
            check_keys(x, TIERS, where)
            for t, r in x.items():
                for k in kind_keys:
                    per[k][t] = _rotation_value(r, f"{where}.{t}", blocks.of(t))
                    named[(k, t)] = f"{where}.{t}"
        else:
            for t in TIERS:
                r = _rotation_value(x, where, blocks.of(t))
                for k in kind_keys:
                    per[k][t] = r

    if v is None:
        pass
    elif isinstance(v, Mapping):
        check_keys(v, _ROTATION_KINDS, field)
        # "weights" first, so that forward_/backward_weights override it as with the schemes
        for kind in _ROTATION_KINDS:
            if kind in v:
                keys = ("forward_weights", "backward_weights") if kind == "weights" else (kind,)
                put(keys, v[kind], f"{field}.{kind}")
    else:
        put(kinds, v, field)
    for (k, t), where in sorted(named.items()):
        if per[k][t] and schemes[k][t] not in QUANTIZED:
            raise HierConfigError(
                where,
                per[k][t],
                f"{k} on the {t} tier are not quantized (scheme {schemes[k][t]!r}), so there is "
                "nothing to rotate; quantize them (int8/int4) or remove this entry",
            )
    for k in kinds:
        for t in TIERS:
            if schemes[k][t] not in QUANTIZED:
                per[k][t] = 0
    return Rotations(**{k: TierRotations(**per[k]) for k in kinds})


def parse_compression(v: object, preset: FixedPreset, field: str) -> CompressionConfig:
    defaults = PRESET_COMPRESSION[preset]
    if v is None:
        v = {}
    if isinstance(v, str):  # "none" / "int8" ...: the same scheme on every tier and kind
        if v not in SCHEMES:
            raise HierConfigError(field, v, f"use one of {list(SCHEMES)} or an object with {list(_COMPRESSION_KEYS)}")
        v = {"weights": v, "gradients": v}
    d = check_mapping(v, field)
    check_keys(d, _COMPRESSION_KEYS, field)
    block, blocks = _parse_blocks(d.get("block_size"), f"{field}.block_size")
    weights = merge_schemes(defaults["weights"], d.get("weights"), f"{field}.weights")
    fwd = merge_schemes(weights, d.get("forward_weights"), f"{field}.forward_weights")
    bwd = merge_schemes(weights, d.get("backward_weights"), f"{field}.backward_weights")
    grads = merge_schemes(defaults["gradients"], d.get("gradients"), f"{field}.gradients")
    ef = _parse_error_feedback(
        d.get("error_feedback"), grads, PRESET_ERROR_FEEDBACK[preset], f"{field}.error_feedback"
    )
    rotation = _parse_rotation(
        d.get("rotation"),
        {"forward_weights": fwd, "backward_weights": bwd, "gradients": grads},
        blocks,
        f"{field}.rotation",
    )
    return CompressionConfig(
        forward_weights=TierSchemes(**fwd),
        backward_weights=TierSchemes(**bwd),
        gradients=TierSchemes(**grads),
        block_size=block,
        block_sizes=blocks,
        error_feedback=ef,
        rotation=rotation,
    )


C = TypeVar("C", bound=str)


def _choice(d: Mapping[str, object], field: str, key: str, default: C, choices: tuple[C, ...], fix: str) -> C:
    """``d[key]`` (``default`` where absent), one of ``choices``."""
    x = d.get(key, default)
    for c in choices:
        if x == c:
            return c
    raise HierConfigError(f"{field}.{key}", x, fix)


def _count(d: Mapping[str, object], field: str, key: str, default: int, least: int, fix: str) -> int:
    """``d[key]`` (``default`` where absent), an integer of at least ``least``."""
    x = d.get(key, default)
    if not is_int(x) or x < least:
        raise HierConfigError(f"{field}.{key}", x, fix)
    return x


def parse_numerics(v: object, field: str) -> NumericsConfig:
    if v is None:
        return NumericsConfig()
    d = check_mapping(v, field)
    check_keys(d, _NUMERICS_KEYS, field)
    # checked in the order of the fields, so the first bad one is the one reported
    return NumericsConfig(
        nonfinite=_choice(
            d,
            field,
            "nonfinite",
            "skip",
            NONFINITE_POLICIES,
            'use "skip" (skip the step, keep the weights, report it in '
            "comm_stats(engine)['numerics']) or \"raise\" (stop with "
            "HierNonFiniteError naming the step, rank and stage)",
        ),
        sample_every=_count(
            d,
            field,
            "sample_every",
            DEFAULT_SAMPLE_EVERY,
            0,
            f"use a non-negative integer: sample the compression error every N-th "
            f"collective (0 = never; default {DEFAULT_SAMPLE_EVERY})",
        ),
        residual_dtype=_choice(
            d,
            field,
            "residual_dtype",
            "fp32",
            RESIDUAL_DTYPES,
            'use "fp32" (default) or "bf16" (half the memory of the error-feedback residuals)',
        ),
        max_consecutive_skips=_count(
            d,
            field,
            "max_consecutive_skips",
            DEFAULT_MAX_CONSECUTIVE_SKIPS,
            1,
            f"use a positive integer: stop the job after this many skipped steps in a row "
            f"(default {DEFAULT_MAX_CONSECUTIVE_SKIPS})",
        ),
    )


def check_numerics_against_deepspeed(numerics: NumericsConfig, ds_config: Mapping[str, object], field: str) -> None:
    fp16 = ds_config.get("fp16") or {}
    if numerics.nonfinite == "raise" and isinstance(fp16, Mapping) and fp16.get("enabled", False):
        raise HierConfigError(
            f"{field}.nonfinite",
            "raise",
            "fp16 training skips every overflowing step and lowers the loss scale "
            "(DeepSpeed's loss scaler; such steps are reported in "
            'comm_stats(engine)[\'numerics\']): use "skip" with fp16, "raise" '
            "with bf16 or fp32",
        )
