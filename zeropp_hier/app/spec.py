"""The job, typed: ``JobSpec`` (what to train, how, where to write), the model it names
(``ModelSpec`` and the named sizes ``MODELS``), the literals of each choice, and the one
DeepSpeed config the job implies (``ds_config``).

Plain, picklable data and pure functions (no torch here): the same spec runs on ranks this process
spawns (``LocalWorld``) or, under ``srun``/``torchrun``, in this process as one rank of many
(``app/launch.py``); the memory check (``app/memory_check.py``) and the Hydra face
(``app/train.py``) read it without building anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Mapping, get_args

from ..core import vocab
from ..core.config import TopologySpec
from ..core.errors import HierConfigError
from ..core.policy import Compression
from .monitoring import monitor
from .monitoring.monitor import MonitorSpec

# the section's presets (core/vocab.py) and "stock": DeepSpeed's own ZeRO-3, without our section
Preset = Literal[vocab.Preset, "stock"]
Dtype = Literal["fp32", "bf16", "fp16"]
Progress = Literal["auto", "on", "off"]
PRESETS: tuple[str, ...] = get_args(Preset)
DTYPES: tuple[str, ...] = get_args(Dtype)
PROGRESS: tuple[str, ...] = get_args(Progress)
Arch = Literal["neox", "gpt"]
Checkpointing = Literal["none", "torch", "deepspeed"]
LrDecay = Literal["none", "cosine"]
Buckets = Literal["deepspeed", "layer"]
LR_DECAYS: tuple[str, ...] = get_args(LrDecay)
BUCKETS: tuple[str, ...] = get_args(Buckets)
BYTE_VOCAB = 256  # byte-level tokens and synthetic batches
ARCHS: tuple[str, ...] = get_args(Arch)
CHECKPOINTING: tuple[str, ...] = get_args(Checkpointing)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """One model, typed; the defaults are the ``tiny`` size (the quickstart's)."""

    arch: Arch = "neox"
    vocab_size: int | None = None  # None: the data's (the job sets it: 256 for byte-level or synthetic data)
    seq_len: int = 64  # tokens per sample (GPT-NeoX's max_position_embeddings)
    hidden: int = 64  # model width
    heads: int = 4  # attention heads (divide hidden)
    layers: int = 4  # transformer blocks
    intermediate: int = 256  # MLP width (4 x hidden in every published GPT-NeoX shape)
    rotary_pct: float = 0.25  # share of each head's dimensions that rotary embeddings rotate
    parallel_residual: bool = True  # attention and MLP read the same input (GPT-NeoX-20B, Pythia)

    @property
    def vocab(self) -> int:
        """The vocabulary size this spec builds: ``vocab_size``, or the byte level's 256 when it
        is left to the data and no data says otherwise."""
        return BYTE_VOCAB if self.vocab_size is None else self.vocab_size

    def resolved(self) -> ModelSpec:
        """This spec with its vocabulary size written out."""
        return self if self.vocab_size is not None else replace(self, vocab_size=self.vocab)

    def check(self) -> None:
        if self.arch not in ARCHS:
            raise HierConfigError("model.arch", self.arch, f"use one of {list(ARCHS)}")
        for name in ("vocab_size", "seq_len", "hidden", "heads", "layers", "intermediate"):
            v = getattr(self, name)
            if name == "vocab_size" and v is None:
                continue
            if not isinstance(v, int) or v < 1:
                raise HierConfigError(f"model.{name}", v, "use a positive integer")
        if self.hidden % self.heads:
            raise HierConfigError(
                "model.heads",
                self.heads,
                f"must divide model.hidden ({self.hidden}); e.g. heads={self.hidden // 64 or 1}",
            )
        if self.arch == "gpt" and self.intermediate != 4 * self.hidden:
            raise HierConfigError(
                "model.intermediate", self.intermediate, f"arch gpt has 4 x hidden = {4 * self.hidden}"
            )
        if not 0.0 < self.rotary_pct <= 1.0:
            raise HierConfigError("model.rotary_pct", self.rotary_pct, "use a fraction in (0, 1]")


# Named sizes; configs/model/<name>.yaml repeats each (tests/unit/test_models.py keeps them equal).
# Shapes from the papers: Pythia (Biderman et al. 2023, Table 1: 160M = 12 layers x 768, 12 heads;
# 1.4B = 24 layers x 2048, 16 heads; vocabulary 50304) and GPT-NeoX-20B (Black et al. 2022:
# 44 layers x 6144, 64 heads, rotary on 25% of each head, parallel residual, vocabulary 50432,
# 2048 tokens), which is also transformers' GPTNeoXConfig default.
MODELS: dict[str, ModelSpec] = {
    "tiny": ModelSpec(),
    "small": ModelSpec(vocab_size=50304, seq_len=2048, hidden=768, heads=12, layers=12, intermediate=3072),
    "neox_1_4b": ModelSpec(vocab_size=50304, seq_len=2048, hidden=2048, heads=16, layers=24, intermediate=8192),
    "neox_20b": ModelSpec(vocab_size=50432, seq_len=2048, hidden=6144, heads=64, layers=44, intermediate=24576),
}


def n_params(spec: ModelSpec) -> int:
    """Parameters of the model ``spec`` builds (arithmetic; equal to the built model's count)."""
    h, i, v, L = spec.hidden, spec.intermediate, spec.vocab, spec.layers
    if spec.arch == "gpt":  # untied head off: tied to the embedding (GPTConfig's default)
        block = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h)
        return v * h + spec.seq_len * h + L * block + 2 * h
    # GPT-NeoX: two LayerNorms, fused QKV and output projection with biases, MLP with biases;
    # untied input embedding and output head, final LayerNorm
    block = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h)
    return 2 * v * h + L * block + 2 * h


def block_params(spec: ModelSpec) -> int:
    """Parameters of one transformer block (the unit ZeRO-3 gathers layer by layer)."""
    h, i = spec.hidden, spec.intermediate
    return 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h)


def layer_buckets(spec: ModelSpec) -> dict[str, int]:
    """DeepSpeed's bucket sizes for ``buckets: layer`` (the GPU recipes), in elements, derived from
    the block size because the planner models buckets but proposes none: the prefetch bucket holds
    one whole block, so the next block's gather is in flight while this one computes; a gradient
    bucket holds one block, so each block's reduce-scatter starts as the next block's backward
    runs. GPT-NeoX-20B: 453M elements each (DeepSpeed's defaults: prefetch 5e7, smaller than the
    block's 151M-element MLP matrix, so it prefetches one matrix at a time; reduce 5e8)."""
    block = block_params(spec)
    return {"stage3_prefetch_bucket_size": block, "reduce_bucket_size": block}


def input_embedding_params(spec: ModelSpec) -> int:
    """Parameters of the embeddings that are only looked up, never in a matrix product (the
    FLOP count leaves them out): GPT-NeoX's input embedding; the hand-written GPT's position
    embedding (its token embedding is also its output head)."""
    return spec.vocab * spec.hidden if spec.arch == "neox" else spec.seq_len * spec.hidden


def _default_topology() -> TopologySpec:
    return {"gpus_per_node": 2, "gcds_per_gpu": 2}


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """The job, typed, with its defaults in this one place. The Hydra app's YAML defaults
    (``configs/train.yaml`` and its default groups) are tested equal to these
    (``tests/unit/test_train_config.py``)."""

    preset: Preset = "frontier"
    compression: Compression = None  # None: the preset's own; "none"/"int8"/...: every tier; or a dict
    steps: int = 30  # optimizer steps the run ends at (a resumed run continues up to it)
    dtype: Dtype = "fp32"  # training dtype: DeepSpeed's bf16/fp16 sections (fp16 with loss scaling)
    micro_batch: int = 4  # sequences per rank per step
    model: ModelSpec = field(default_factory=ModelSpec)  # default: the tiny size
    activation_checkpointing: Checkpointing = "none"  # per block: none | torch | deepspeed
    data_path: str | None = None  # a `zeropp-hier data prepare` directory; None: synthetic batches
    data_split: str | None = None  # Megatron pairs only: train,val,test parts by document (app/data/blend.py)
    # the data orders' cache (app/data/order_cache.py); None: beside the data (its directory)
    data_cache_dir: str | None = None
    save_every: int = 0  # checkpoint every N steps and after the last (0: never); app/longrun/resume.py
    checkpoint_dir: str | None = None  # None: <out_dir>/checkpoints
    resume: str | None = None  # "latest" or a tag in checkpoint_dir: continue that run up to `steps`
    # the "topology" value of the zeropp_hier section ("auto", or a dict)
    topology: TopologySpec = field(default_factory=_default_topology)
    local_world: int = 8  # ranks to start when not under a launcher
    regather: bool = True  # DeepSpeed prefetch/reuse 0: backward re-gathers as for a large model
    lr: float = 3e-3  # Adam's learning rate (the peak, with a schedule)
    warmup_steps: int = 0  # lr rises linearly from 0 over this many steps (0: warmup_ratio's, or none)
    warmup_ratio: float = 0.0  # warm-up as a share of `steps` (GPT-NeoX's "warmup"), when warmup_steps is 0
    lr_decay: LrDecay = "none"  # none: constant after warm-up (WarmupLR); cosine: WarmupCosineLR to min_lr_ratio
    min_lr_ratio: float = 0.1  # cosine's end, as a share of lr (GPT-NeoX's min_lr / lr)
    grad_accum: int = 1  # micro-batches per optimizer step (DeepSpeed's gradient_accumulation_steps)
    # sequences per optimizer step over all ranks: sets the accumulation from the world (``accum``),
    # so a resume on fewer ranks (a chain link on fewer nodes) trains the same batches; None: grad_accum's
    global_batch: int | None = None
    clip: float = 0.0  # DeepSpeed's gradient_clipping (global norm; 0: none)
    # initial weights (app/model/init_schemes.py): GPT-NeoX's init_method / output_layer_init_method names
    init_method: str = "normal"  # normal (transformers' N(0, 0.02)) | small_init
    output_layer_init_method: str = "normal"  # normal | wang_init (attention dense, MLP dense_4h_to_h)
    # AdamW (DeepSpeed's "Adam" with torch_adam: torch.optim.AdamW); torch's defaults but eps
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    # prefetch on (regather false): DeepSpeed's bucket sizes ("deepspeed") or one block each ("layer")
    buckets: Buckets = "deepspeed"
    deepspeed_config: str | None = None  # the user's DeepSpeed JSON, merged in (app/user_config.py)
    deepspeed: dict = field(default_factory=dict)  # the user's DeepSpeed keys (+deepspeed.KEY=value), merged last
    seed: int = 0  # the model's initial weights and the data order
    init_from: str | None = None  # a Hugging Face model directory: the initial weights (app/model/pretrained.py)
    out_dir: str | None = None  # rank 0 writes metrics.jsonl and summary.json here
    memory_gb: float | None = None  # memory per rank the layout must fit in; None: the device's (memory_check.py)
    progress: Progress = "auto"  # progress bar: auto (only on a terminal), on, off
    label: dict = field(default_factory=dict)  # copied into summary.json (e.g. sweep overrides)
    # monitoring and evaluation (app/monitoring/monitor.py, app/monitoring/evaluate.py)
    log_every: int = 1  # DeepSpeed's monitors get the step's scalars every N steps
    monitor: MonitorSpec = field(default_factory=MonitorSpec)  # which of DeepSpeed's monitors are on
    eval_every: int = 0  # val loss every N steps (0: never; needs data_path, whose val split it reads)
    eval_batches: int = 4  # micro-batches per rank in one evaluation

    def check(self) -> None:
        if self.preset not in PRESETS:
            raise HierConfigError("preset", self.preset, f"use one of {list(PRESETS)}")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise HierConfigError("steps", self.steps, "use a positive integer")
        if self.dtype not in DTYPES:
            raise HierConfigError("dtype", self.dtype, "use fp32, bf16 or fp16")
        if self.progress not in PROGRESS:
            raise HierConfigError("progress", self.progress, "use auto, on or off")
        if self.activation_checkpointing not in CHECKPOINTING:
            raise HierConfigError(
                "activation_checkpointing", self.activation_checkpointing, f"use one of {list(CHECKPOINTING)}"
            )
        self.model.check()
        if not isinstance(self.save_every, int) or self.save_every < 0:
            raise HierConfigError("save_every", self.save_every, "use 0 (no checkpoints) or a positive step count")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise HierConfigError("warmup_steps", self.warmup_steps, "use 0 (constant lr) or a positive step count")
        if self.lr_decay not in LR_DECAYS:
            raise HierConfigError("lr_decay", self.lr_decay, f"use one of {list(LR_DECAYS)}")
        if self.buckets not in BUCKETS:
            raise HierConfigError("buckets", self.buckets, f"use one of {list(BUCKETS)}")
        if not (isinstance(self.warmup_ratio, (int, float)) and 0.0 <= self.warmup_ratio < 1.0):
            raise HierConfigError("warmup_ratio", self.warmup_ratio, "use a share of steps in [0, 1), e.g. 0.01")
        if not (isinstance(self.min_lr_ratio, (int, float)) and 0.0 <= self.min_lr_ratio <= 1.0):
            raise HierConfigError("min_lr_ratio", self.min_lr_ratio, "use a share of lr in [0, 1], e.g. 0.1")
        if not isinstance(self.grad_accum, int) or self.grad_accum < 1:
            raise HierConfigError("grad_accum", self.grad_accum, "use a positive integer (1: no accumulation)")
        if self.global_batch is not None:
            if not isinstance(self.global_batch, int) or self.global_batch < 1:
                raise HierConfigError("global_batch", self.global_batch, "use a positive number of sequences, or null")
            if self.grad_accum != 1:
                raise HierConfigError(
                    "grad_accum",
                    self.grad_accum,
                    "global_batch sets the accumulation: give grad_accum=1 with it (a recipe's grad_accum counts too)",
                )
        from .model.init_schemes import check as check_init

        check_init(self.init_method, self.output_layer_init_method, self.model.arch)
        if not (isinstance(self.clip, (int, float)) and self.clip >= 0):
            raise HierConfigError("clip", self.clip, "use 0 (no clipping) or a positive gradient norm, e.g. 1.0")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise HierConfigError("betas", self.betas, "use two numbers in [0, 1), e.g. [0.9, 0.95]")
        if self.memory_gb is not None and not (isinstance(self.memory_gb, (int, float)) and self.memory_gb > 0):
            raise HierConfigError("memory_gb", self.memory_gb, "use a positive number of GB, or null for the device's")
        if (self.save_every or self.resume) and not (self.checkpoint_dir or self.out_dir):
            raise HierConfigError(
                "checkpoint_dir", self.checkpoint_dir, "name a directory for save_every / resume (or set out_dir)"
            )
        self._check_monitoring()

    def _check_monitoring(self) -> None:
        monitor.check(self.monitor, self.out_dir, self.log_every)
        for name in ("eval_every", "eval_batches"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < (0 if name == "eval_every" else 1):
                raise HierConfigError(name, v, "use 0 (never) or a step count" if name == "eval_every" else "use >= 1")
        if self.eval_every and self.data_path is None:
            raise HierConfigError(
                "eval_every",
                self.eval_every,
                "evaluation reads the val split of prepared data: set data=tokens data.path=DIR, or eval_every=0",
            )

    @property
    def ckpt_dir(self) -> str | None:
        if self.checkpoint_dir:
            return self.checkpoint_dir
        return os.path.join(self.out_dir, "checkpoints") if self.out_dir else None

    @property
    def warmup(self) -> int:
        """Warm-up steps: ``warmup_steps``, else ``warmup_ratio`` of ``steps`` (at least 1)."""
        if self.warmup_steps or not self.warmup_ratio:
            return self.warmup_steps
        return max(1, round(self.warmup_ratio * self.steps))

    def accum(self, world: int | None) -> int:
        """Micro-batches per optimizer step on ``world`` ranks: ``global_batch`` / (world x
        micro_batch) when ``global_batch`` is given (and the world known), else ``grad_accum``."""
        if self.global_batch is None or world is None:
            return self.grad_accum
        per = world * self.micro_batch
        if self.global_batch % per:
            raise HierConfigError(
                "global_batch",
                self.global_batch,
                f"not a multiple of {world} ranks x micro_batch {self.micro_batch} = {per}: give a multiple of it, "
                "or a data.micro_batch that divides it on every world size the run uses",
            )
        return self.global_batch // per

    def ds_config(
        self, overrides: Mapping[str, Any] | None = None, world: int | None = None, notes: list[str] | None = None
    ) -> dict:
        """The job's DeepSpeed config (``ds_config`` of this spec), then the user's
        ``deepspeed_config`` file and ``deepspeed`` keys merged in (``app/user_config.py``: a key the
        job owns that disagrees is refused; ``world``: the ranks, to check ``train_batch_size``),
        then ``overrides`` (the job's own, e.g. a universal checkpoint's load flag; see there).
        ``notes``: gets what the user's keys replaced, filled ("auto") and passed."""
        from .user_config import JobValues, merge_user  # the user's keys: read and checked here, on every rank alike

        cfg = ds_config(
            self.preset,
            dtype=self.dtype,
            micro_batch=self.micro_batch,
            grad_accum=self.accum(world),
            compression=self.compression,
            topology=self.topology,
            lr=self.lr,
            eps=self.eps,
            betas=self.betas,
            weight_decay=self.weight_decay,
            clip=self.clip,
            regather=self.regather,
            buckets=layer_buckets(self.model) if self.buckets == "layer" else None,
            warmup_steps=self.warmup,
            lr_decay=self.lr_decay,
            total_steps=self.steps,
            min_lr_ratio=self.min_lr_ratio,
        )
        # DeepSpeed's monitor sections the job's `monitor` switches on (a user's own then merge over them)
        cfg.update(monitor.ds_sections(self.monitor, self.out_dir))
        values = JobValues(
            lr=self.lr,
            betas=self.betas,
            eps=self.eps,
            weight_decay=self.weight_decay,
            clip=self.clip,
            warmup_steps=self.warmup,
            total_steps=self.steps,
            hidden=self.model.hidden,
        )
        cfg = merge_user(cfg, self.deepspeed_config, self.deepspeed, world=world, values=values, notes=notes)
        return _apply_overrides(cfg, overrides)


# JobSpec fields the Hydra config gives as top-level keys beside the groups (``recipe_fields``)
RECIPE_KEYS = (
    "warmup_ratio",
    "lr_decay",
    "min_lr_ratio",
    "grad_accum",
    "global_batch",
    "clip",
    "init_method",
    "output_layer_init_method",
    "weight_decay",
    "betas",
    "eps",
    "buckets",
    "deepspeed_config",
    "deepspeed",
)


def recipe_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The ``RECIPE_KEYS`` of a composed Hydra config (a plain dict) as ``JobSpec`` arguments."""
    out = {k: cfg[k] for k in RECIPE_KEYS if k in cfg}
    if "betas" in out:
        out["betas"] = tuple(out["betas"])  # YAML gives a list
    if out.get("deepspeed_config"):
        out["deepspeed_config"] = os.path.abspath(out["deepspeed_config"])  # Hydra may change directory
    out["deepspeed"] = dict(out.get("deepspeed") or {})
    return out


DTYPE_SECTIONS: dict[str, dict[str, Any]] = {
    "fp32": {},
    "fp16": {"fp16": {"enabled": True, "initial_scale_power": 8}},
    "bf16": {"bf16": {"enabled": True}},
}


def ds_config(
    preset: Preset | None = "frontier",
    *,
    dtype: Dtype = "fp32",
    micro_batch: int = 2,
    grad_accum: int = 1,
    compression: Compression = None,
    topology: TopologySpec | None = None,
    gpus_per_node: int = 2,
    gcds_per_gpu: int = 2,
    lr: float = 3e-3,
    eps: float = 1e-6,
    betas: tuple[float, float] | None = None,
    weight_decay: float | None = None,
    clip: float = 0.0,
    regather: bool = True,
    buckets: Mapping[str, int] | None = None,
    warmup_steps: int = 0,
    lr_decay: LrDecay = "none",
    total_steps: int | None = None,
    min_lr_ratio: float = 0.1,
    overrides: Mapping[str, Any] | None = None,
) -> dict:
    """A DeepSpeed config: ZeRO-3 with Adam, and the ``zeropp_hier`` section of ``preset``
    (``"stock"`` or None: stock ZeRO-3, no section). The job's is ``JobSpec.ds_config``; tests
    and benchmarks call this directly.

    ``topology``: the section's "topology" value ("auto", or a dict); None: declared as
    ``gpus_per_node`` x ``gcds_per_gpu``. ``regather`` sets DeepSpeed's prefetch and reuse
    distance to 0 so that a small model is released after forward and gathered again in
    backward, as a large one would be (with the defaults a small model stays gathered and there
    is no backward gather to measure); ``buckets`` (with ``regather`` False): DeepSpeed's
    ``stage3_prefetch_bucket_size`` and ``reduce_bucket_size`` (``layer_buckets``). ``betas`` and
    ``weight_decay`` None: torch AdamW's defaults ((0.9, 0.999), 0.01). ``clip``: DeepSpeed's
    ``gradient_clipping`` (0: none). ``warmup_steps``: linear from 0 to ``lr``; ``lr_decay``
    "none": DeepSpeed's WarmupLR (0 warm-up steps: constant lr, no scheduler), "cosine":
    WarmupCosineLR down to ``min_lr_ratio`` x ``lr`` at ``total_steps``. ``overrides``: sections
    merged in last, one level deep (a dict value updates the section of the same name, anything
    else replaces it), e.g. the benchmarks' ``{"zero_optimization": {"zero_hpz_partition_size": 4}}``
    for stock ZeRO++."""
    zero: dict[str, Any] = {"stage": 3, "stage3_param_persistence_threshold": 0}
    if regather:
        zero.update(stage3_prefetch_bucket_size=0, stage3_max_reuse_distance=0)
    elif buckets:
        zero.update(buckets)
    params: dict[str, Any] = {"lr": lr, "eps": eps, "torch_adam": True}
    if betas is not None:
        params["betas"] = list(betas)
    if weight_decay is not None:
        params["weight_decay"] = weight_decay
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "optimizer": {"type": "Adam", "params": params},
        "zero_optimization": zero,
        **DTYPE_SECTIONS[dtype],
    }
    if clip:
        cfg["gradient_clipping"] = clip
    if preset not in (None, "stock"):
        section: dict[str, Any] = {
            "enabled": True,
            "preset": preset,
            "topology": {"gpus_per_node": gpus_per_node, "gcds_per_gpu": gcds_per_gpu}
            if topology is None
            else topology,
        }
        if compression is not None:
            section["compression"] = compression
        cfg["zeropp_hier"] = section
    if lr_decay == "cosine":
        if not total_steps:
            raise HierConfigError("steps", total_steps, "a cosine decay needs the run's optimizer steps")
        cfg["scheduler"] = {
            "type": "WarmupCosineLR",  # ratios of the optimizer's lr (deepspeed/runtime/lr_schedules.py)
            "params": {
                "total_num_steps": total_steps,
                "warmup_min_ratio": 0.0,
                "warmup_num_steps": max(1, warmup_steps),  # DeepSpeed refuses 0 (and uses at least 2)
                "cos_min_ratio": min_lr_ratio,
                "warmup_type": "linear",
            },
        }
    elif warmup_steps:
        cfg["scheduler"] = {
            "type": "WarmupLR",
            "params": {
                "warmup_min_lr": 0.0,
                "warmup_max_lr": lr,
                "warmup_num_steps": warmup_steps,
                "warmup_type": "linear",
            },
        }
    return _apply_overrides(cfg, overrides)


def _apply_overrides(cfg: dict, overrides: Mapping[str, Any] | None) -> dict:
    for key, value in (overrides or {}).items():
        if isinstance(value, Mapping) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg
