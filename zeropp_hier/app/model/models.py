"""The job's models: ``transformers``' GPT-NeoX built from a config (never downloaded) in named
sizes, partitioned while it is built so that no rank ever holds the whole model.

[Note: building a model sharded]
``transformers`` builds a model under ZeRO-3 partitioning when a ``HfDeepSpeedConfig`` with
stage 3 is alive while the model class is constructed (its documented non-Trainer integration):
``from_config`` then enters ``deepspeed.zero.Init``, every submodule's parameters are cut into
1/world shards as soon as that submodule's ``__init__`` returns, and the weights are initialised
afterwards one module at a time from a gather (``initialize_weights_zero3``). The most a rank
holds is its shards plus one module's full parameters. For the ``zeropp_hier`` presets the same
call runs with ``deepspeed.zero.Init`` rebound to ``zeropp_hier.Init`` (for that one call, as
``zeropp_hier.initialize`` rebinds DeepSpeed's engine class), so the gathers of that
initialisation already go through the hierarchy and the parameters are bound to its runtime.
``tests/dist/test_models.py`` measures the peak against the model's size.

The hand-written GPT (``zeropp_hier.app.model.gpt``) stays for tests that need a model
without ``transformers`` (``arch: gpt``).
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

import zeropp_hier

from ...core.config import hier_config_from_ds
from ...core.errors import HierConfigError
from ..spec import CHECKPOINTING, Checkpointing, ModelSpec
from .gpt import GPT, GPTConfig

if TYPE_CHECKING:  # transformers is imported only when a NeoX model is built
    from transformers import PreTrainedModel


# GPTNeoXConfig's name for each ModelSpec field (rotary_pct: transformers 5 takes 4.x's name
# through **kwargs); what the spec does not set is fixed below: no dropout, untied, no KV cache
NEOX_NAMES = {
    "vocab_size": "vocab",
    "hidden_size": "hidden",
    "num_hidden_layers": "layers",
    "num_attention_heads": "heads",
    "intermediate_size": "intermediate",
    "max_position_embeddings": "seq_len",
    "rotary_pct": "rotary_pct",
    "use_parallel_residual": "parallel_residual",
}


def neox_config(spec: ModelSpec):
    from transformers import GPTNeoXConfig

    fields = {hf: getattr(spec, ours) for hf, ours in NEOX_NAMES.items()}
    return GPTNeoXConfig(
        **fields, tie_word_embeddings=False, hidden_dropout=0.0, attention_dropout=0.0, use_cache=False
    )


class CausalLM(nn.Module):
    """``loss = model(inputs, targets)``, as the job's training loop calls every model: the
    Hugging Face model's logits against next-token targets the data already shifted."""

    def __init__(self, lm: PreTrainedModel, spec: ModelSpec, keep_alive=None):
        super().__init__()
        self.lm = lm
        self.config = spec  # vocab_size and seq_len, as GPTConfig has them (synthetic batches)
        self._keep_alive = keep_alive  # the HfDeepSpeedConfig transformers holds a weak reference to

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        logits = self.lm(input_ids=idx, use_cache=False).logits
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def _is_stage3(ds_config: dict) -> bool:
    return int(ds_config.get("zero_optimization", {}).get("stage", 0)) == 3


def _hier_init_applies(ds_config: dict) -> bool:
    """Whether the model can be built under ``zeropp_hier.Init``: an enabled section with a named
    preset ("auto" chooses at initialize, from the built model: stock partitioning then)."""
    cfg = hier_config_from_ds(ds_config)
    return cfg.enabled and cfg.preset != "auto"


def _hier_init(hier_runtime):
    return zeropp_hier.Init if hier_runtime is None else functools.partial(zeropp_hier.Init, hier_runtime=hier_runtime)


@contextlib.contextmanager
def _hf_zero3_off():
    """transformers decides whether to partition from a process-wide weak reference to the last
    live ``HfDeepSpeedConfig``; an engine built earlier in this process (e.g. the one whose
    weights a whole copy is being built to evaluate) can keep its config alive. A model asked
    for without ZeRO-3 is built whole regardless."""
    from transformers.integrations import deepspeed as hf_deepspeed

    ref = hf_deepspeed._hf_deepspeed_config_weak_ref
    hf_deepspeed._hf_deepspeed_config_weak_ref = None
    try:
        yield
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = ref


def build(spec: ModelSpec, ds_config: dict, seed: int = 0, hier_runtime=None) -> nn.Module:
    """The model ``spec``, partitioned during construction when ``ds_config`` is ZeRO stage 3
    ([Note: building a model sharded]); every rank must call it (it is collective then).
    ``hier_runtime``: build under that existing runtime (its process groups) instead of a new one."""
    spec.check()
    spec = spec.resolved()
    torch.manual_seed(seed)
    if spec.arch == "gpt":
        cfg = GPTConfig(spec.vocab, spec.seq_len, spec.hidden, spec.heads, spec.layers)
        if not _is_stage3(ds_config):
            return GPT(cfg)
        import deepspeed

        init = _hier_init(hier_runtime) if _hier_init_applies(ds_config) else deepspeed.zero.Init
        with init(config_dict_or_path=ds_config):
            return GPT(cfg)
    from transformers import GPTNeoXForCausalLM

    keep = None
    ctx: contextlib.AbstractContextManager = _hf_zero3_off()
    if _is_stage3(ds_config):
        import deepspeed
        from transformers.integrations import HfDeepSpeedConfig

        keep = HfDeepSpeedConfig(ds_config)  # transformers sees ZeRO-3 while it is alive
        ctx = contextlib.nullcontext()
        if _hier_init_applies(ds_config):
            from ...deepspeed.engine import _rebound

            ctx = _rebound(deepspeed.zero, "Init", _hier_init(hier_runtime))
    with ctx:
        lm = GPTNeoXForCausalLM._from_config(neox_config(spec))
    lm.train()
    return CausalLM(lm, spec, keep_alive=keep)


def blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a model ``build`` made (or of the engine's ``module``), in
    order: where per-block hooks go (activation checkpointing, the benchmarks' device time)."""
    if isinstance(model, CausalLM):
        return list(model.lm.gpt_neox.layers)  # type: ignore[union-attr,arg-type]  # transformers' GPTNeoX: a ModuleList
    if isinstance(model, GPT):
        return list(model.blocks)
    raise TypeError(f"no transformer blocks known for a {type(model).__name__}")


def enable_checkpointing(model: nn.Module, api: Checkpointing) -> None:
    """Activation checkpointing per transformer block: ``torch`` = ``torch.utils.checkpoint``
    non-reentrant; ``deepspeed`` = ``deepspeed.checkpointing.checkpoint`` (what Megatron-style
    models call). Backward recomputes each block's forward, which gathers its weights again."""
    if api not in CHECKPOINTING:
        raise HierConfigError("activation_checkpointing", api, f"use one of {list(CHECKPOINTING)}")
    if api == "none":
        return
    if isinstance(model, CausalLM):
        lm = model.lm
        if api == "torch":
            enable = getattr(lm, "activation_checkpointing_enable", None)
            if enable is not None:  # transformers >= 5
                enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            import deepspeed

            # transformers takes any checkpoint function through this (its enable methods
            # always use torch's); transformers passes the block's tensors positionally, as
            # DeepSpeed's reentrant checkpoint needs
            lm._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=deepspeed.checkpointing.checkpoint)
        return
    if isinstance(model, GPT):
        model.checkpoint = api
        return
    raise HierConfigError("activation_checkpointing", api, f"not available for a {type(model).__name__}")
