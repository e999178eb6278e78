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

# the section's presets (core/vocab.py) and "stock": DeepSpeed's own ZeRO-3, without our section
Preset = Literal[vocab.Preset, "stock"]
Dtype = Literal["fp32", "bf16", "fp16"]
Progress = Literal["auto", "on", "off"]
PRESETS: tuple[str, ...] = get_args(Preset)
DTYPES: tuple[str, ...] = get_args(Dtype)
PROGRESS: tuple[str, ...] = get_args(Progress)
Arch = Literal["neox", "gpt"]
Checkpointing = Literal["none", "torch", "deepspeed"]
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
    save_every: int = 0  # checkpoint every N steps and after the last (0: never); app/resume.py
    checkpoint_dir: str | None = None  # None: <out_dir>/checkpoints
    resume: str | None = None  # "latest" or a tag in checkpoint_dir: continue that run up to `steps`
    # the "topology" value of the zeropp_hier section ("auto", or a dict)
    topology: TopologySpec = field(default_factory=_default_topology)
    local_world: int = 8  # ranks to start when not under a launcher
    regather: bool = True  # DeepSpeed prefetch/reuse 0: backward re-gathers as for a large model
    lr: float = 3e-3  # Adam's learning rate
    warmup_steps: int = 0  # DeepSpeed WarmupLR: lr rises linearly from 0 over this many steps (0: constant lr)
    seed: int = 0  # the model's initial weights and the data order
    out_dir: str | None = None  # rank 0 writes metrics.jsonl and summary.json here
    memory_gb: float | None = None  # memory per rank the layout must fit in; None: the device's (memory_check.py)
    progress: Progress = "auto"  # progress bar: auto (only on a terminal), on, off
    label: dict = field(default_factory=dict)  # copied into summary.json (e.g. sweep overrides)

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
        if self.memory_gb is not None and not (isinstance(self.memory_gb, (int, float)) and self.memory_gb > 0):
            raise HierConfigError("memory_gb", self.memory_gb, "use a positive number of GB, or null for the device's")
        if (self.save_every or self.resume) and not (self.checkpoint_dir or self.out_dir):
            raise HierConfigError(
                "checkpoint_dir", self.checkpoint_dir, "name a directory for save_every / resume (or set out_dir)"
            )

    @property
    def ckpt_dir(self) -> str | None:
        if self.checkpoint_dir:
            return self.checkpoint_dir
        return os.path.join(self.out_dir, "checkpoints") if self.out_dir else None

    def ds_config(self, overrides: Mapping[str, Any] | None = None) -> dict:
        """The job's DeepSpeed config (``ds_config`` of this spec); ``overrides``: see there."""
        return ds_config(
            self.preset,
            dtype=self.dtype,
            micro_batch=self.micro_batch,
            compression=self.compression,
            topology=self.topology,
            lr=self.lr,
            regather=self.regather,
            warmup_steps=self.warmup_steps,
            overrides=overrides,
        )


def with_data_vocab(spec: JobSpec) -> JobSpec:
    """``spec`` with the model's vocabulary written out when the model leaves it null: the
    data's tokenizer's size (the prepared directory's index.json), or 256 for synthetic batches
    (which draw from the model's own vocabulary, so any size serves them); a model whose
    vocabulary is smaller than the data's is refused."""
    m = spec.model
    if spec.data_path is None:  # synthetic batches draw from the model's own vocabulary
        return spec if m.vocab_size is not None else replace(spec, model=replace(m, vocab_size=BYTE_VOCAB))
    from .data import open_tokens  # numpy and torch: only when there are token files to read

    vocab, where = open_tokens(spec.data_path).vocab_size, f"the tokenizer of {spec.data_path}"
    if vocab is None:  # a Megatron pair does not record its tokenizer's size
        if m.vocab_size is None:
            raise HierConfigError(
                "model.vocab_size",
                None,
                f"{spec.data_path} does not record its vocabulary: set model.vocab_size to its tokenizer's size "
                "(50432 for GPT-NeoX-20B's)",
            )
        return spec
    if m.vocab_size is None:
        return replace(spec, model=replace(m, vocab_size=vocab))
    if m.vocab_size < vocab:
        raise HierConfigError(
            "model.vocab_size",
            m.vocab_size,
            f"{where} has {vocab} tokens: use a model with at least as many (model.vocab_size={vocab}, "
            "or null to take the data's)",
        )
    return spec


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
    regather: bool = True,
    warmup_steps: int = 0,
    overrides: Mapping[str, Any] | None = None,
) -> dict:
    """A DeepSpeed config: ZeRO-3 with Adam, and the ``zeropp_hier`` section of ``preset``
    (``"stock"`` or None: stock ZeRO-3, no section). The job's is ``JobSpec.ds_config``; tests
    and benchmarks call this directly.

    ``topology``: the section's "topology" value ("auto", or a dict); None: declared as
    ``gpus_per_node`` x ``gcds_per_gpu``. ``regather`` sets DeepSpeed's prefetch and reuse
    distance to 0 so that a small model is released after forward and gathered again in
    backward, as a large one would be (with the defaults a small model stays gathered and there
    is no backward gather to measure). ``warmup_steps``: DeepSpeed's WarmupLR, linear from 0 to
    ``lr`` (0: constant lr). ``overrides``: sections merged in last, one level deep (a dict value
    updates the section of the same name, anything else replaces it), e.g. the benchmarks'
    ``{"zero_optimization": {"zero_hpz_partition_size": 4}}`` for stock ZeRO++."""
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0}
    if regather:
        zero.update(stage3_prefetch_bucket_size=0, stage3_max_reuse_distance=0)
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "optimizer": {"type": "Adam", "params": {"lr": lr, "eps": eps, "torch_adam": True}},
        "zero_optimization": zero,
        **DTYPE_SECTIONS[dtype],
    }
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
    if warmup_steps:
        cfg["scheduler"] = {
            "type": "WarmupLR",
            "params": {
                "warmup_min_lr": 0.0,
                "warmup_max_lr": lr,
                "warmup_num_steps": warmup_steps,
                "warmup_type": "linear",
            },
        }
    for key, value in (overrides or {}).items():
        if isinstance(value, Mapping) and isinstance(cfg.get(key), dict):
            cfg[key].update(value)
        else:
            cfg[key] = value
    return cfg
